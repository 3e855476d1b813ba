"""Scenarios for the end-to-end tests: a Torch + Warp node built from a plan, traced, exported and compared.

A ``Scenario`` fixes a boundary dtype (scalar or compound in expanded layout),
a size, 1 or 2 Warp segments with torch work between them, and per segment
1-3 kernel launches plus optional scratch arrays, ``zero_`` and ``wp.copy``.
``make_step(scenario, device)`` returns the node function; called outside a
session it is plain eager code, so the same function gives the reference.

NOTE: every kernel and overload is defined here, at import: Warp compiles a
module once per device, and a module that changes after a capture is refused
at export. Hypothesis only chooses among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import warp as wp

import leapp
from leapp import annotate

# --- kernels (one Warp module; every overload made at import) -------------------------------------


@wp.kernel
def affine(x: wp.array(dtype=Any), a: Any, b: Any, y: wp.array(dtype=Any)):
    i = wp.tid()
    y[i] = x[i] * a + b


@wp.kernel
def mix(x: wp.array(dtype=Any), y: wp.array(dtype=Any), out: wp.array(dtype=Any)):
    i = wp.tid()
    out[i] = x[i] + y[i]


@wp.kernel
def accumulate(x: wp.array(dtype=Any), acc: wp.array(dtype=Any)):
    i = wp.tid()
    acc[i] = acc[i] + x[i]


@wp.kernel
def twist_scalar(x: wp.array(dtype=Any), out: wp.array(dtype=Any)):
    i = wp.tid()
    out[i] = x[i] * x[i] - x[i]


@wp.kernel
def twist_vec3(x: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.cross(x[i], wp.vec3(0.0, 0.0, 1.0)) + x[i] * 0.5


@wp.kernel
def twist_quat(x: wp.array(dtype=wp.quat), out: wp.array(dtype=wp.quat)):
    i = wp.tid()
    out[i] = x[i] * wp.normalize(x[i])


@wp.kernel
def twist_mat33(x: wp.array(dtype=wp.mat33), out: wp.array(dtype=wp.mat33)):
    i = wp.tid()
    out[i] = x[i] * wp.transpose(x[i])


SCALARS = {
    "float16": wp.float16,
    "float32": wp.float32,
    "float64": wp.float64,
    "int32": wp.int32,
    "int64": wp.int64,
    "uint8": wp.uint8,
}
COMPOUNDS = {"vec3": wp.vec3, "quat": wp.quat, "mat33": wp.mat33}
DTYPES = tuple(SCALARS) + tuple(COMPOUNDS)
LAUNCHES = ("affine", "mix", "accumulate", "twist")
_TWIST_COMPOUND = {"vec3": twist_vec3, "quat": twist_quat, "mat33": twist_mat33}


@dataclass(frozen=True)
class Family:
    """The kernels (concrete overloads) and constants of one boundary dtype."""

    name: str
    wp_dtype: Any
    torch_dtype: torch.dtype
    inner: tuple[int, ...]  # trailing storage dims of the expanded layout: (3,) for vec3
    kernels: dict[str, wp.Kernel]
    a: Any
    b: Any


def _family(name: str) -> Family:
    if name in SCALARS:
        t = SCALARS[name]
        scalar = t
        a, b = (t(1.5), t(-0.25)) if name.startswith("float") else (t(3), t(7))
        twist = wp.overload(twist_scalar, {"x": wp.array(dtype=t), "out": wp.array(dtype=t)})
    else:
        t = COMPOUNDS[name]
        scalar = wp.float32
        a = wp.float32(1.5)
        b = {"vec3": wp.vec3(1.0, 2.0, 3.0), "quat": wp.quat(0.1, 0.2, 0.3, 0.9),
             "mat33": wp.mat33(1.0, 0.5, 0.0, 0.0, 2.0, 0.25, -1.0, 0.0, 1.0)}[name]
        twist = _TWIST_COMPOUND[name]
    arr = wp.array(dtype=t)
    kernels = {
        "affine": wp.overload(affine, {"x": arr, "a": scalar, "b": t, "y": arr}),
        "mix": wp.overload(mix, {"x": arr, "y": arr, "out": arr}),
        "accumulate": wp.overload(accumulate, {"x": arr, "acc": arr}),
        "twist": twist,
    }
    return Family(name, t, wp.dtype_to_torch(getattr(t, "_wp_scalar_type_", t)), tuple(getattr(t, "_shape_", ())),
                  kernels, a, b)


FAMILIES = {name: _family(name) for name in DTYPES}


# --- plans --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentPlan:
    """One ``warp_op`` block: ``launches`` in order, each writing a fresh scratch array except the last,
    which writes the output tensor unless ``copy_out`` (then a ``wp.copy`` does). ``accumulate``
    zeroes its destination with ``zero_`` first."""

    launches: tuple[str, ...]
    copy_out: bool = False


@dataclass(frozen=True)
class Scenario:
    """One node ``e2e``: input ``x`` of ``n`` elements of ``dtype``, 1 or 2 segments (torch work between
    them), outputs ``y`` (and ``first``, the first segment's output, when there are two)."""

    dtype: str
    n: int
    segments: tuple[SegmentPlan, ...]
    backend: str = "pt2"
    seed: int = 0
    scale: float = 1.0

    @property
    def family(self) -> Family:
        return FAMILIES[self.dtype]

    @property
    def output_names(self) -> list[str]:
        return ["y", "first"] if len(self.segments) == 2 else ["y"]

    def describe(self) -> str:
        segs = " | ".join("+".join(s.launches) + (" +copy" if s.copy_out else "") for s in self.segments)
        return f"{self.dtype}[{self.n}] {self.backend} seed={self.seed} scale={self.scale:g}: {segs}"


def make_input(s: Scenario, seed: int, device: str) -> torch.Tensor:
    """Random values for ``s`` (a new ``seed`` gives new values), in the boundary's storage layout."""
    fam = s.family
    gen = torch.Generator().manual_seed(seed)
    shape = (s.n,) + fam.inner
    if fam.torch_dtype == torch.uint8:
        x = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    elif not fam.torch_dtype.is_floating_point:
        x = torch.randint(-1000, 1000, shape, generator=gen).to(fam.torch_dtype)
    else:
        x = (torch.randn(shape, generator=gen, dtype=torch.float64) * s.scale).to(fam.torch_dtype)
    return x.to(device)


def _run_segment(plan: SegmentPlan, fam: Family, x: torch.Tensor, device: str) -> torch.Tensor:
    """Launches ``plan`` on ``x``; returns the output tensor (allocated before the block, as users do)."""
    out = torch.empty_like(x)
    n = x.shape[0]
    with annotate.warp_op():
        xw = wp.from_torch(x, dtype=fam.wp_dtype)
        ow = wp.from_torch(out, dtype=fam.wp_dtype)
        cur = xw
        for k, kind in enumerate(plan.launches):
            last = k == len(plan.launches) - 1 and not plan.copy_out
            dst = ow if last else wp.empty(n, dtype=fam.wp_dtype, device=device)  # scratch unless the output
            kernel = fam.kernels[kind]
            if kind == "affine":
                wp.launch(kernel, dim=n, inputs=[cur, fam.a, fam.b], outputs=[dst], device=device)
            elif kind == "mix":
                wp.launch(kernel, dim=n, inputs=[cur, xw], outputs=[dst], device=device)
            elif kind == "accumulate":
                dst.zero_()
                wp.launch(kernel, dim=n, inputs=[cur], outputs=[dst], device=device)
            else:
                wp.launch(kernel, dim=n, inputs=[cur], outputs=[dst], device=device)
            cur = dst
        if plan.copy_out:
            wp.copy(ow, cur)
    return out


def _between(h: torch.Tensor) -> torch.Tensor:
    """Torch work between two segments, which ONNX Runtime's CPU EP runs for every boundary dtype.

    (Slice runs for every dtype; Mul for float32/float64 only here: ORT releases differ on float16.)
    """
    h = torch.flip(h, dims=[0])
    if h.dtype in (torch.float32, torch.float64):
        h = h * 0.5
    return h.contiguous()


def make_step(s: Scenario, device: str):
    """The node function of ``s``: eager outside a session, recorded inside one."""
    fam = s.family

    def step(x: torch.Tensor) -> dict[str, torch.Tensor]:
        with leapp.node("e2e", export_with=s.backend):
            x = annotate.input_tensors("e2e", {"x": x})
            first = _run_segment(s.segments[0], fam, x, device)
            outputs = {"y": first}
            if len(s.segments) == 2:
                y = _run_segment(s.segments[1], fam, _between(first), device)
                outputs = {"y": y, "first": first}
            annotate.output_tensors("e2e", outputs)
        return outputs

    return step


TRACE_SEEDS = (0, 1, 2)  # pass 1 (discovery), pass 2 (capture), one more validation sample


def trace_and_compile(s: Scenario, folder, device: str, validate: bool, name: str = "e2e"):
    """Traces ``s`` (pass 1, pass 2, one more sample), checks each traced run kept eager values, compiles.

    Returns (step, report); the export is ``folder/name``.
    """
    step = make_step(s, device)
    inputs = [make_input(s, s.seed * 10 + k, device) for k in TRACE_SEEDS]
    with leapp.trace(name, save_path=str(folder)) as session:
        traced = [step(x) for x in inputs]
    for x, outs in zip(inputs, traced):
        want = step(x)  # outside the session: eager
        for key in s.output_names:
            assert_same(outs[key], want[key], f"{s.describe()}: traced output '{key}'")
    return step, session.compile(validate=validate)


def expected_ops(plan: SegmentPlan, fam: Family) -> list[str]:
    """The bundle ops a plan must export to: kernel keys, ``memset`` for ``zero_``, ``copy`` for ``wp.copy``."""
    ops = []
    for kind in plan.launches:
        if kind == "accumulate":
            ops.append("memset")
        ops.append(fam.kernels[kind].key)
    return ops + (["copy"] if plan.copy_out else [])


def expected_scratch(plan: SegmentPlan) -> int:
    """Scratch arrays a plan allocates in its block: every launch result but the one written to the output."""
    return len(plan.launches) - (0 if plan.copy_out else 1)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Exported == eager: exact for integers, tight for floats (the same compiled kernels run on both sides)."""
    got, want = got.cpu(), want.cpu()  # ONNX on the CPU EP returns CPU tensors
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: integer outputs differ"

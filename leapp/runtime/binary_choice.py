"""leapp/runtime/binary_choice.py: which binary of a bundle loads on a GPU, and why, in words.

The choice itself is the native runtime's (``choose_binary`` in
ext/core/src/module_loader.cpp, reached through ``leapp._native``): the loader
tries exactly the candidates reported here, in this order, so ``leapp inspect``
and ``leapp doctor`` show what replay will do, not a Python re-implementation
of it. The rules are docs/bundle-format.md section 3; the coverage they give a
default export is docs/portability.md.

    describe_binary_choice(bundle_bytes)                  # this machine's GPUs, or named GPUs without a driver
    describe_binary_choice(path, (8, 7), 13000)           # a Jetson Orin with a CUDA 13.0 driver
    describe_machine_binaries()                           # doctor: what a default export loads here

``leapp.load`` logs the same choice at DEBUG for each Warp module of a CUDA node (``binary_choices``
on the bundles read back from the artifact), so a user sees at load whether a node will JIT PTX, or
finds no binary for the GPU, before its first call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from leapp.bundle.format import DEFAULT_CUBIN_ARCHS, MAGIC
from leapp.bundle.reader import Bundle

__all__ = [
    "NAMED_GPUS",
    "REFERENCE_DRIVER",
    "ROBOT_TARGETS",
    "binary_choices",
    "bundles_in_artifact",
    "describe_binary_choice",
    "device_capability",
    "describe_machine_binaries",
    "driver_text",
]

# Shown when no driver is present: the GPU families docs/portability.md covers.
NAMED_GPUS: tuple[tuple[str, tuple[int, int]], ...] = (
    ("RTX 4090", (8, 9)),
    ("Jetson Orin", (8, 7)),
    ("H200", (9, 0)),
    ("B300", (10, 3)),
    ("Jetson Thor", (11, 0)),
    ("GB10 / DGX Spark", (12, 1)),
)
# The PTX ISA / CUDA version of Warp 1.19's NVRTC, which writes the cubins of DEFAULT_CUBIN_ARCHS.
# The PTX's declared ISA (leapp._export.ptx_isa: 8.0, read by every CUDA 12 and 13 driver) and the NVRTC's.
DEFAULT_EXPORT_PTX_ISA = "8.0"
DEFAULT_EXPORT_TOOLKIT = "13.4"
REFERENCE_DRIVER = 13000  # CUDA 13.0 (R580, JetPack 7): the oldest driver that loads CUDA 13 cubins
# The robots an export is judged for in `leapp inspect` and `leapp doctor`, whatever machine runs them:
# JetPack 6.0 ships a CUDA 12.2 driver, 6.1 and 6.2 a CUDA 12.6 one, JetPack 7 (Thor) CUDA 13.0.
ROBOT_TARGETS: tuple[tuple[str, tuple[int, int], int], ...] = (
    ("Jetson Orin, JetPack 6.0", (8, 7), 12020),
    ("Jetson Orin, JetPack 6.1/6.2", (8, 7), 12060),
    ("Jetson Thor, JetPack 7", (11, 0), 13000),
)


def driver_text(version: int) -> str:
    """'CUDA 13.0 (13000)' for cuDriverGetVersion's 13000."""
    return f"CUDA {version // 1000}.{version % 1000 // 10} ({version})"


def _native_bundle(bundle):
    from leapp import _native  # the native module is needed only here

    if isinstance(bundle, _native.Bundle):
        return bundle
    if isinstance(bundle, Bundle):
        from leapp.bundle.writer import write_bundle

        return _native.Bundle(write_bundle(bundle.manifest, bundle.blobs))
    if isinstance(bundle, (str, os.PathLike)):
        bundle = Path(bundle).read_bytes()
    return _native.Bundle(bytes(bundle))


def _modules(native) -> list[dict]:
    import json

    return json.loads(native.manifest_json)["modules"]


def _choice_lines(choice: dict, label: str) -> list[str]:
    if choice["chosen"] < 0:
        return [f"{label}: {choice['summary']}"]
    lines = [f"{label}: loads {choice['summary']}"]
    fallbacks = [c for i, c in enumerate(choice["candidates"]) if i != choice["chosen"]]
    if fallbacks:
        lines.append("    then tries " + "; ".join(
            f"{c['kind']} sm_{c['arch']}{'' if c['expected'] else ' (expected to fail)'}" for c in fallbacks))
    return lines


def _driver_status() -> dict:
    try:
        from leapp import _native
    except ImportError as e:  # pragma: no cover - a broken install
        return {"available": False, "error": f"leapp._native cannot be imported: {e}", "version": 0,
                "assumed_version": 0, "assumed_error": "", "devices": []}
    return _native.driver_status()


def _choosing_driver(status: dict) -> int:
    """The driver version the loader chooses binaries for: this one, or $LEAPP_ASSUME_DRIVER's older one."""
    return int(status.get("assumed_version") or status["version"])


def _robot_lines(choice_for) -> list[str]:
    """One choice per ``ROBOT_TARGETS`` entry; ``choice_for(major, minor, driver, name)`` is the native choice."""
    lines = ["  on robots (whatever this machine is):"]
    for name, (major, minor), driver in ROBOT_TARGETS:
        lines += _choice_lines(choice_for(major, minor, driver, name),
                               f"    {name} ({major}.{minor}, {driver_text(driver)} driver)")
    return lines


def describe_binary_choice(bundle, compute_capability: tuple[int, int] | None = None,
                           driver_version: int | None = None) -> list[str]:
    """Lines (no trailing newline) saying which binary of each module loads, and why.

    Args:
        bundle: the bundle's bytes, a path to a bundle file, a ``leapp.bundle.Bundle`` or a
            ``leapp._native.Bundle``.
        compute_capability: (major, minor) of the GPU to judge; default: every GPU of this
            machine, or, without a driver, the named GPUs of ``NAMED_GPUS``.
        driver_version: cuDriverGetVersion of the driver to judge (13000 = CUDA 13.0); default:
            this machine's driver, or ``REFERENCE_DRIVER`` (CUDA 13.0) when there is none.

    Without leapp._native (a broken install) the one line says so.

    Raises:
        ValueError: the bundle fails the native reader's validation (its message).
    """
    try:
        native = _native_bundle(bundle)
    except ImportError as e:
        return [f"binary choice: not available, leapp._native cannot be imported ({e})"]
    modules = _modules(native)
    lines = ["binary choice (docs/portability.md):"]
    if not modules:
        return lines + ["  no Warp modules: nothing to load"]
    status = _driver_status()
    judge_robots = compute_capability is None and driver_version is None
    if driver_version is None:
        driver_version = _choosing_driver(status) if status["available"] else REFERENCE_DRIVER
    targets: list[tuple[str, str, tuple[int, int]]]  # (device name for messages, label, compute capability)
    if compute_capability is not None:
        major, minor = int(compute_capability[0]), int(compute_capability[1])
        targets = [("", f"compute capability {major}.{minor}", (major, minor))]
        lines.append(f"  with a {driver_text(driver_version)} driver:")
    elif status["available"] and status["devices"]:
        targets = [(d["name"], f"device {d['ordinal']} ({d['name']}, {d['compute_capability'][0]}."
                    f"{d['compute_capability'][1]})", tuple(d["compute_capability"])) for d in status["devices"]]
        lines.append(f"  this machine: {driver_text(driver_version)} driver")
    else:
        why = status["error"] if not status["available"] else "the driver sees no GPU"
        lines.append(f"  this machine: no CUDA GPU here ({why}); the choice for named GPUs with a "
                     f"{driver_text(driver_version)} driver:")
        targets = [(name, f"{name} ({cc[0]}.{cc[1]})", cc) for name, cc in NAMED_GPUS]
    for name, label, (major, minor) in targets:
        for m, module in enumerate(modules):
            choice = native.binary_choice(m, major, minor, driver_version, name)
            where = f"  {label}" + (f", module {m} {module['name']}" if len(modules) > 1 else "")
            lines += _choice_lines(choice, where)
    if judge_robots:
        for m, module in enumerate(modules):
            if len(modules) > 1:
                lines.append(f"  module {m} {module['name']}:")
            lines += _robot_lines(lambda major, minor, driver, name, m=m:
                                  native.binary_choice(m, major, minor, driver, name))
    return lines


def describe_machine_binaries(cubin_archs: tuple[int, ...] | None = None, ptx_isa: str | None = None,
                              cuda_toolkit: str | None = None) -> list[str]:
    """``leapp doctor``: what this machine's driver reads, and which binary a default export loads on each GPU.

    ``cubin_archs`` / ``ptx_isa`` / ``cuda_toolkit`` describe the export (default: leapp's default cubin set,
    PTX sm_75 of ISA 9.4 and CUDA 13.4, Warp 1.19's NVRTC); no Warp or bundle is needed.
    """
    try:
        from leapp import _native
    except ImportError as e:
        return [f"binaries: not available, leapp._native cannot be imported ({e})"]

    archs = cubin_archs if cubin_archs is not None else DEFAULT_CUBIN_ARCHS
    isa = ptx_isa or DEFAULT_EXPORT_PTX_ISA
    toolkit = cuda_toolkit or DEFAULT_EXPORT_TOOLKIT
    binaries = [("ptx", 75, isa)] + [("cubin", a, "") for a in archs]
    status = _driver_status()
    held = f"cubins {', '.join(f'sm_{a}' for a in archs)} and PTX sm_75 of ISA {isa}, all by the NVRTC of CUDA {toolkit}"
    robots = _robot_lines(lambda major, minor, driver, name:
                          _native.binary_choice_for(binaries, major, minor, driver, name, toolkit))
    if not status["available"]:
        return [f"binaries: no CUDA driver here; a default export ({held}) needs a CUDA 13.0 driver for its "
                f"cubins and CUDA {_min_driver_text(isa)} for its PTX (docs/portability.md)", *robots]
    version = _choosing_driver(status)
    reads = _native.driver_ptx_isa(version)
    reads_text = "any PTX ISA known today" if reads == (99, 99) else f"PTX up to ISA {reads[0]}.{reads[1]}"
    assumed = " (LEAPP_ASSUME_DRIVER: binaries are chosen as this older driver would)" if status.get(
        "assumed_version") else ""
    lines = [f"binaries: the {driver_text(version)} driver{assumed} reads {reads_text}; a default export holds {held}"]
    for d in status["devices"]:
        major, minor = d["compute_capability"]
        choice = _native.binary_choice_for(binaries, major, minor, version, d["name"], toolkit)
        lines += _choice_lines(choice, f"  device {d['ordinal']} ({d['name']}, {major}.{minor})")
    return lines + robots


def _min_driver_text(isa: str) -> str:
    from leapp import _native

    major, _, minor = isa.partition(".")
    need = _native.ptx_isa_min_driver(int(major), int(minor))
    return f"{need // 1000}.{need % 1000 // 10} or later" if need else f"a driver that reads PTX ISA {isa}"




# --- at load: the choice for a node's device, logged by leapp.runtime.pipeline ------------------------------


def device_capability(device: str) -> tuple[int, int] | None:
    """(major, minor) of ``device`` as leapp's driver loader sees it (no CUDA torch needed), or None."""
    import torch  # leapp inspect and doctor use this module without torch

    status = _driver_status()
    index = torch.device(device).index or 0
    for entry in status["devices"] if status["available"] else ():
        if entry["ordinal"] == index:
            return tuple(entry["compute_capability"])
    return None


def _is_bundle(tensor) -> bool:
    import torch

    return tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.numel() > len(MAGIC)


def bundles_in_artifact(backend: str, path: Path, runner) -> list[bytes]:
    """The segment bundles a node's artifact holds: a PT2 program's constants, an ONNX model's initializers."""
    if backend == "pt2":
        import torch

        program = runner.program.program
        tensors = [*program.constants.values(), *program.state_dict.values()]
        found = [bytes(t.cpu().numpy()) for t in tensors if isinstance(t, torch.Tensor) and _is_bundle(t)]
    elif backend == "onnx":
        import onnx
        from onnx import numpy_helper

        data = getattr(runner, "model_bytes", None)  # what the session opened (read and hashed once)
        model = onnx.load_model_from_string(data) if data is not None else onnx.load(str(path))
        found = [numpy_helper.to_array(t, base_dir=str(path.parent)).tobytes() for t in model.graph.initializer
                 if t.data_type == onnx.TensorProto.UINT8 and len(t.dims) == 1]
    else:
        found = []
    return [data for data in found if data.startswith(MAGIC)]


def binary_choices(bundles: Iterable[bytes], capability: tuple[int, int],
                   driver_version: int | None = None) -> list[str]:
    """Lines saying what each module of each bundle loads on a device of ``capability`` with this machine's
    driver (or ``driver_version``; ``REFERENCE_DRIVER`` without a driver): the native ``choose_binary``."""
    from leapp import _native

    if driver_version is None:
        status = _driver_status()
        driver_version = _choosing_driver(status) if status["available"] else REFERENCE_DRIVER
    major, minor = capability
    lines = []
    for data in bundles:
        native = _native.Bundle(data)
        for m, module in enumerate(_modules(native)):
            choice = native.binary_choice(m, major, minor, driver_version, "")
            lines += _choice_lines(choice, f"segment {native.segment} module {module['name']} on sm_{10 * major + minor}")
    return lines

"""CPU: the end-to-end scenarios trace and export (validate=False), and their bundles hold the planned ops.

The GPU twin (test_gpu_equivalence.py) replays the same scenarios; here, where
Warp runs on the CPU, each scenario is checked up to the artifact: the traced
runs keep eager values, every boundary dtype crosses, and each segment's
bundle has exactly the launches, memsets (``zero_``), copies (``wp.copy``) and
scratch buffers its plan asks for, and takes only the segment's real input (the
``torch.empty_like`` output is not copied in).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import warp as wp
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import e2e_scenarios as E
from leapp.bundle import Bundle, read_bundle
from leapp.runtime.runners import load_pt2

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
    pytest.mark.skipif(
        not (Path(wp.__file__).parent / "bin" / "warp-clang.so").is_file(),
        reason="this Warp has no warp-clang.so, so it cannot build CPU kernels (the GPU twin covers these scenarios)",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _sm90_only():
    """Cubins for one target keep the export fast; what is checked here does not depend on the target."""
    wp.init()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CUDA_ARCHS", "90")
        yield


def bundles(folder: Path, backend: str) -> list[Bundle]:
    """The segment bundles of node ``e2e``'s artifact, in segment order."""
    if backend == "pt2":
        state = load_pt2(folder / "e2e.pt2").state_dict
        keys = sorted((k for k in state if k.startswith("warp_segment_")), key=lambda k: int(k.split("_")[2]))
        return [read_bundle(state[k].numpy().tobytes()) for k in keys]
    model = onnx.load(str(folder / "e2e.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    calls = [n for n in model.graph.node if n.domain == "leapp.warp" and n.op_type == "WarpSegment"]
    return [read_bundle(onnx.numpy_helper.to_array(inits[n.input[-1]]).tobytes()) for n in calls]


def check_export(s: E.Scenario, folder: Path) -> None:
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    (node,) = desc["nodes"]
    assert node["backend"] == s.backend and len(node["segments"]) == len(s.segments)
    fam = s.family
    storage = [s.n, *fam.inner]
    assert [(o["name"], o["dtype"], o["shape"]) for o in node["outputs"]] == [
        (name, str(fam.torch_dtype).removeprefix("torch."), storage) for name in s.output_names
    ]
    found = bundles(folder, s.backend)
    assert len(found) == len(s.segments)
    for plan, bundle in zip(s.segments, found):
        ops = [op["op"] if op["op"] != "launch" else bundle.kernels[op["kernel"]]["key"] for op in bundle.ops]
        assert ops == E.expected_ops(plan, fam), (s.describe(), bundle.segment)
        roles = [b["role"] for b in bundle.buffers]
        assert roles.count("scratch") == E.expected_scratch(plan), (s.describe(), bundle.segment, bundle.buffers)
        dtype = str(fam.torch_dtype).removeprefix("torch.")
        assert all(t["shape"] == storage and t["dtype"] == dtype for t in bundle.outputs), bundle.outputs
        # the output tensor is torch.empty_like before the block: undefined bytes, not an input (init "none")
        assert len(bundle.inputs) == 1, (s.describe(), bundle.segment, bundle.inputs)
        assert [b["init"] for b in bundle.buffers if b["role"] == "output"] == ["none"], bundle.buffers


RICH = (E.SegmentPlan(("affine", "accumulate", "twist"), copy_out=True), E.SegmentPlan(("mix",)))


@pytest.mark.parametrize("dtype", E.DTYPES)
def test_every_dtype_exports_a_rich_plan(tmp_path, dtype):
    backend = "onnx" if E.DTYPES.index(dtype) % 2 else "pt2"
    s = E.Scenario(dtype, 7, RICH, backend=backend, seed=E.DTYPES.index(dtype))
    E.trace_and_compile(s, tmp_path, "cpu", validate=False)
    check_export(s, tmp_path / "e2e")


segment_plans = st.builds(
    E.SegmentPlan, st.lists(st.sampled_from(E.LAUNCHES), min_size=1, max_size=3).map(tuple), st.booleans()
)
scenarios = st.builds(
    E.Scenario,
    dtype=st.sampled_from(E.DTYPES),
    n=st.one_of(st.just(1), st.integers(2, 600)),
    segments=st.lists(segment_plans, min_size=1, max_size=2).map(tuple),
    backend=st.sampled_from(["pt2", "onnx"]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.01, 1.0, 100.0]),
)


@settings(max_examples=8)
@given(s=scenarios)
def test_random_plans_export(tmp_path_factory, s):
    folder = tmp_path_factory.mktemp("plan")
    E.trace_and_compile(s, folder, "cpu", validate=False)
    check_export(s, folder / "e2e")

"""leapp.testing.input_strategy: the export's input names, dtypes and shapes, finite bounded values, overrides.

The export folders here hold only a pipeline.yaml (input_strategy reads nothing else), written as
leapp writes it and read back through leapp.pipeline_format, so every dtype family is covered
without tracing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp.pipeline_format import read_pipeline
from leapp.testing import DEFAULT_BOUND, input_strategy, tensors, unit_norm, within

INPUTS = {  # name: (dtype, shape)
    "quat": ("float32", [5, 4]),
    "half": ("float16", [3]),
    "brain": ("bfloat16", [2, 2]),
    "wide": ("float64", [4, 1]),
    "count": ("int32", [6]),
    "pixel": ("uint8", [2, 3]),
    "big": ("int64", []),
    "mask": ("bool", [7]),
    "empty": ("float32", [0, 3]),
}


def _write_export(folder, inputs=INPUTS, device="cpu"):
    """A pipeline.yaml with one node reading every input (artifacts are never opened by input_strategy)."""
    specs = [{"name": n, "dtype": d, "shape": s} for n, (d, s) in inputs.items()]
    desc = {
        "format": "leapp.pipeline",
        "version": 1,
        "name": "shapes",
        "producer": {"leapp": "0.1.0"},
        "nodes": [{
            "name": "n", "backend": "pt2", "artifact": "n.pt2", "sha256": "0" * 64, "files": [], "source": "x.py:1",
            "device": device, "inputs": specs, "outputs": [{"name": "o", "dtype": "float32", "shape": [1]}],
            "segments": [],
        }],
        "edges": [],
        "inputs": [{**s, "consumers": [{"node": "n", "input": s["name"]}]} for s in specs],
        "outputs": [{"name": "o", "node": "n", "output": "o", "dtype": "float32", "shape": [1]}],
        "constants": [],
    }
    folder.mkdir(parents=True, exist_ok=True)
    desc = json.loads(json.dumps(desc))  # no shared objects: YAML anchors are refused
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    read_pipeline(folder)  # the file is one leapp's reader accepts
    return folder


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return _write_export(tmp_path_factory.mktemp("strategy") / "shapes")


def _in_bounds(name: str, t: torch.Tensor, low: float = -DEFAULT_BOUND, high: float = DEFAULT_BOUND) -> None:
    if t.dtype == torch.bool or t.numel() == 0:
        return
    v = t.to(torch.float64)
    assert torch.isfinite(v).all(), name
    assert v.min() >= low and v.max() <= high, (name, v.min().item(), v.max().item())


@settings(max_examples=25)
@given(data=st.data())
def test_draws_match_the_exports_inputs(export, data):
    drawn = data.draw(input_strategy(export))
    assert list(drawn) == list(INPUTS), "names, in pipeline.yaml order"
    for name, (dtype, shape) in INPUTS.items():
        t = drawn[name]
        assert t.dtype == getattr(torch, dtype) and list(t.shape) == shape and t.device.type == "cpu", name
        _in_bounds(name, t)


def test_both_generators_are_used(export):
    """Dense random tensors and element-wise ones (few distinct values) both come out."""
    distinct = set()

    @settings(max_examples=40, database=None)
    @given(drawn=input_strategy(export))
    def probe(drawn):
        distinct.add(torch.unique(drawn["quat"]).numel() == 20)

    probe()
    assert distinct == {True, False}


@settings(max_examples=25)
@given(data=st.data())
def test_overrides(export, data):
    fixed = torch.arange(6, dtype=torch.int32)
    drawn = data.draw(input_strategy(
        export,
        quat=unit_norm(),
        half=within(-0.5, 0.25),
        wide=lambda t: t.abs() + 100.0,
        count=fixed,
        mask=st.just([True, False, True, False, True, False, True]),
        pixel=tensors((2, 3), torch.uint8, low=200, high=255),
    ))
    norms = torch.linalg.vector_norm(drawn["quat"].double(), dim=-1)
    assert torch.allclose(norms, torch.ones(5, dtype=torch.float64), atol=1e-6)
    _in_bounds("half", drawn["half"], -0.5, 0.25)
    assert (drawn["wide"] >= 100.0).all() and (drawn["wide"] <= 110.0).all()
    assert torch.equal(drawn["count"], fixed) and drawn["count"] is not fixed
    assert drawn["mask"].tolist() == [True, False] * 3 + [True] and drawn["mask"].dtype == torch.bool
    _in_bounds("pixel", drawn["pixel"], 200, 255)


def test_unit_norm_of_zero_is_the_identity_quaternion():
    q = unit_norm()(torch.zeros(2, 4))
    assert q.tolist() == [[0.0, 0.0, 0.0, 1.0]] * 2


def test_unknown_override_names_the_exports_inputs(export):
    with pytest.raises(ValueError, match=r"export 'shapes' has no input 'quaternion' \(its inputs: \['quat', 'half'"):
        input_strategy(export, quaternion=unit_norm())


def test_override_of_the_wrong_shape_or_dtype_is_refused(export):
    with pytest.raises(ValueError, match=r"input 'count': its override tensor gave int64\[6\], the export expects "
                                         r"int32\[6\]"):
        input_strategy(export, count=torch.arange(6))
    bad = input_strategy(export, quat=st.just(torch.zeros(4, 4)))

    @settings(max_examples=1, database=None)
    @given(drawn=bad)
    def draw_once(drawn):
        pass

    with pytest.raises(ValueError, match=r"input 'quat': its override strategy gave float32\[4, 4\], the export "
                                         r"expects float32\[5, 4\]"):
        draw_once()
    with pytest.raises(TypeError, match=r"input 'quat': override of type str"):
        input_strategy(export, quat="unit")


def test_within_refuses_bad_bounds():
    with pytest.raises(ValueError, match="finite bounds"):
        within(1.0, -1.0)
    with pytest.raises(ValueError, match=r"no float32 value lies in \[0.1, 0.1\]"):
        tensors((2,), torch.float32, "cpu", 0.1, 0.1)  # 0.1 itself is not a float32


@settings(max_examples=50, deadline=None)
@given(x=tensors((16,), torch.float32, "cpu", 0.2, 0.6), y=tensors((4,), torch.float16, "cpu", -0.3, 0.7))
def test_float32_draws_keep_to_bounds_no_float32_can_hold(x, y):
    """within(0.2, 0.6) on float32: the bounds as meant, though neither is a float32 (issue 35)."""
    assert x.dtype == torch.float32 and bool(((x.double() >= 0.2) & (x.double() <= 0.6)).all())
    assert y.dtype == torch.float16


def test_device_defaults_to_the_consumers_recorded_device(tmp_path):
    """Drawn on the device the eager code was traced on; ``device=`` overrides it."""
    from leapp.testing.inputs import input_specs

    folder = _write_export(tmp_path / "dev", {"x": ("float32", [2])}, device="cuda:0")
    assert input_specs(read_pipeline(folder)[1])[0].device == torch.device("cuda:0")

    @settings(max_examples=3, database=None)
    @given(drawn=input_strategy(folder, device="cpu"))
    def draw(drawn):
        assert drawn["x"].device == torch.device("cpu")

    draw()


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_hypothesis_is_an_optional_extra():
    """``import leapp`` never imports hypothesis; ``import leapp.testing`` without it says what to install."""
    proc = _python("""
        import sys
        import leapp
        assert "hypothesis" not in sys.modules, "import leapp imported hypothesis"
        sys.modules["hypothesis"] = None  # as if it were not installed
        try:
            import leapp.testing
        except ImportError as e:
            print("IMPORT ERROR:", e)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORT ERROR: leapp.testing needs hypothesis" in proc.stdout and "pip install leapp[testing]" in proc.stdout

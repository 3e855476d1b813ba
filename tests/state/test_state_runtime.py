"""leapp.load carries state (docs/state.md): a GRU policy with the last action fed back, ONNX and PT2, against
the eager code stepping its own state; reset, reset(state), a failed call, run_node, hostile initial values."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leapp
from leapp.pipeline_format import INITIAL_VALUES_FILE, PipelineError, read_pipeline
from leapp.pipeline_format.twin import write_twin

from state_helpers import ACT, HIDDEN, OBS, EagerLoop, Policy, export_policy


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def exported(request, tmp_path_factory):
    return request.param, export_policy(tmp_path_factory.mktemp(request.param), request.param)


def _observations(n: int, seed: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, OBS, generator=gen) for _ in range(n)]


def test_loaded_steps_equal_the_eager_loop_and_reset_restores(exported):
    backend, folder = exported
    pipeline = leapp.load(folder)
    assert list(pipeline.inputs) == ["obs"] and list(pipeline.outputs) == ["action"]
    assert list(pipeline.state_specs) == ["policy/h", "policy/last_action"]
    assert pipeline.state_specs["policy/h"].shape == (1, HIDDEN)
    eager = EagerLoop(Policy(), backend)
    observations = _observations(6)
    with torch.no_grad():
        for obs in observations:
            torch.testing.assert_close(pipeline(obs=obs)["action"], eager.step(obs))
        torch.testing.assert_close(pipeline.state["policy/h"], eager.h)
        torch.testing.assert_close(pipeline.state["policy/last_action"], eager.last)
        pipeline.reset()
        eager.reset()
        assert torch.equal(pipeline.state["policy/h"], torch.zeros(1, HIDDEN))
        for obs in observations[:2]:
            torch.testing.assert_close(pipeline(obs=obs)["action"], eager.step(obs))


def test_state_is_a_clone_and_reset_with_a_state_sets_it(exported):
    _, folder = exported
    pipeline = leapp.load(folder)
    obs = _observations(1)[0]
    first = pipeline(obs=obs)["action"]
    snapshot = pipeline.state
    snapshot["policy/h"].fill_(7.0)  # a clone: the pipeline's state is untouched
    assert not torch.equal(pipeline.state["policy/h"], snapshot["policy/h"])
    pipeline.reset({"policy/h": torch.zeros(1, HIDDEN), "policy/last_action": torch.zeros(1, ACT)})
    torch.testing.assert_close(pipeline(obs=obs)["action"], first)
    saved = pipeline.state
    second = pipeline(obs=obs)["action"]
    pipeline.reset(saved)
    torch.testing.assert_close(pipeline(obs=obs)["action"], second)


@pytest.mark.parametrize("state, text", [
    ({"policy/x": torch.zeros(1)}, r"'policy/x' is no state of the pipeline \(states: "
                                   r"\['policy/h', 'policy/last_action'\]\)"),
    ({"policy/h": torch.zeros(1, HIDDEN, dtype=torch.float64)}, r"'policy/h' is float64\[1, 8\], the state is "
                                                                r"float32\[1, 8\]"),
    ({"policy/h": torch.zeros(2, HIDDEN)}, r"'policy/h' is float32\[2, 8\], the state is float32\[1, 8\]"),
    ({"policy/h": [0.0] * HIDDEN}, r"'policy/h' is a list, expected a torch.Tensor"),
], ids=["unknown-key", "dtype", "shape", "not-a-tensor"])
def test_reset_with_a_bad_state_is_refused_and_changes_nothing(exported, state, text):
    _, folder = exported
    pipeline = leapp.load(folder)
    pipeline(obs=_observations(1)[0])
    before = pipeline.state
    with pytest.raises(PipelineError, match=r"Pipeline 'recurrent': reset\(state\): " + text):
        pipeline.reset({"policy/last_action": torch.ones(1, ACT), **state})
    for key, value in pipeline.state.items():
        assert torch.equal(value, before[key])


def test_a_call_that_raises_leaves_the_state_unchanged(exported):
    _, folder = exported
    pipeline = leapp.load(folder)
    pipeline(obs=_observations(1)[0])
    before = pipeline.state
    with pytest.raises(PipelineError, match=r"obs"):
        pipeline(obs=torch.zeros(1, OBS + 1))
    with pytest.raises(PipelineError):
        pipeline(obs=torch.zeros(1, OBS), h=torch.zeros(1, HIDDEN))  # a state input is no pipeline input
    for key, value in pipeline.state.items():
        assert torch.equal(value, before[key])


def test_run_node_takes_the_state_explicitly_and_leaves_it_alone(exported):
    backend, folder = exported
    pipeline = leapp.load(folder)
    obs = _observations(1)[0]
    h = torch.full((1, HIDDEN), 0.5)
    last = torch.full((1, ACT), -0.5)
    out = pipeline.run_node("policy", obs=obs, h=h, last_action=last)
    with torch.no_grad():
        action, h_new = Policy()(obs, h, last)
    torch.testing.assert_close(out["action"], action)
    torch.testing.assert_close(out["h_out"], h_new)
    torch.testing.assert_close(out["last_action_out"], action)
    assert torch.equal(pipeline.state["policy/h"], torch.zeros(1, HIDDEN))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(st.just("reset"), st.integers(0, 2**16)), min_size=1, max_size=6))
def test_any_step_sequence_equals_the_eager_loop(exported, steps):
    backend, folder = exported
    pipeline = _loaded(folder)
    pipeline.reset()
    eager = EagerLoop(Policy(), backend)
    with torch.no_grad():
        for step in steps:
            if step == "reset":
                pipeline.reset()
                eager.reset()
                continue
            obs = torch.randn(1, OBS, generator=torch.Generator().manual_seed(step))
            torch.testing.assert_close(pipeline(obs=obs)["action"], eager.step(obs))


_LOADED: dict = {}


def _loaded(folder):
    if folder not in _LOADED:
        _LOADED[folder] = leapp.load(folder)
    return _LOADED[folder]


# ---- hostile initial_values.safetensors: digests recomputed, so only the file's own checks refuse it ----


def _rewrite(folder, tmp_path, header: dict | None = None, data: bytes | None = None, raw: bytes | None = None,
             desc_edit=None):
    """A copy of the export whose initial values file is ``raw`` (or ``header`` + ``data``), with pipeline.yaml's
    sha256 (and its twin) recomputed."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    if raw is None and header is not None:
        text = json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + data
    if raw is not None:
        (copy / INITIAL_VALUES_FILE).write_bytes(raw)
    _, desc = read_pipeline(copy)
    desc["initial_values"]["sha256"] = hashlib.sha256((copy / INITIAL_VALUES_FILE).read_bytes()).hexdigest()
    if desc_edit is not None:
        desc_edit(desc)
    write_twin(copy, desc)
    return copy


H = {"dtype": "F32", "shape": [1, HIDDEN], "data_offsets": [0, 32]}
A = {"dtype": "F32", "shape": [1, ACT], "data_offsets": [32, 40]}


@pytest.mark.parametrize("header, data, text", [
    ({"policy/h": dict(H, dtype="F64"), "policy/last_action": A}, bytes(40), r"'policy/h': dtype 'F64'"),
    ({"policy/h": dict(H, shape=[HIDDEN]), "policy/last_action": A}, bytes(40), r"'policy/h': shape \[8\]"),
    ({"policy/h": H}, bytes(32), r"no initial value for state input 'policy/last_action'"),
    ({"policy/h": H, "policy/last_action": A, "policy/obs": dict(A, data_offsets=[40, 48])}, bytes(48),
     r"key 'policy/obs' is no state input"),
    ({"policy/h": H, "policy/last_action": dict(A, data_offsets=[24, 32])}, bytes(32), r"'policy/last_action': "
     r"data_offsets \[24, 32\] overlaps"),
], ids=["dtype", "shape", "missing-key", "extra-key", "overlap"])
def test_load_refuses_hostile_initial_values(exported, tmp_path, header, data, text):
    _, folder = exported
    copy = _rewrite(folder, tmp_path, header, data)
    with pytest.raises(PipelineError, match=rf"{INITIAL_VALUES_FILE}: {text}"):
        leapp.load(copy)


def test_load_refuses_a_header_past_the_file_and_a_huge_header(exported, tmp_path):
    _, folder = exported
    for length, text in ((1000, "runs past the end of the file"), (1 << 40, "is more than 16777216 bytes")):
        raw = struct.pack("<Q", length) + b"{}"
        shutil.rmtree(tmp_path / "copy", ignore_errors=True)
        with pytest.raises(PipelineError, match=rf"{INITIAL_VALUES_FILE}: header length {length} {text}"):
            leapp.load(_rewrite(folder, tmp_path, raw=raw))


def test_load_refuses_a_changed_file_and_a_path_leaving_the_folder(exported, tmp_path):
    _, folder = exported
    copy = tmp_path / "changed"
    shutil.copytree(folder, copy)
    (copy / INITIAL_VALUES_FILE).write_bytes((copy / INITIAL_VALUES_FILE).read_bytes()[:-1] + b"\x01")
    with pytest.raises(PipelineError, match=r"has sha256 .* but pipeline.yaml records"):
        leapp.load(copy)

    def outside(desc):
        desc["initial_values"]["path"] = "../initial_values.safetensors"

    with pytest.raises(PipelineError, match=r"initial_values.path"):
        leapp.load(_rewrite(folder, tmp_path, desc_edit=outside))

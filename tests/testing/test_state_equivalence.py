"""leapp.testing on an export with state: sequences from the reset state, every step compared, a wrong state
update caught at the step it first shows, counterexample files holding the sequence, ``reset`` required.

The export is one ONNX node ``acc``: ``y = tanh(x) + h``, state ``h`` updated to ``0.5 * h + x``. ``Acc(wrong=True)``
updates it to ``0.5 * (h + x)``: step 1's output is the same (the state starts at zero), step 2's is not.
"""

from __future__ import annotations

from pathlib import Path

import hypothesis
import pytest
import torch
from hypothesis import strategies as st

import leapp
from leapp import annotate
from leapp.testing import ROUTES, assert_equivalent, replay_counterexample
from leapp.testing.cpp_runner import leapp_run_path

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

N = 4


class Acc:
    """The eager code with its state: ``reset()`` restores the initial value the trace started from (zeros)."""

    def __init__(self, wrong: bool = False):
        self.wrong = wrong
        self.reset()

    def reset(self) -> None:
        self.h = torch.zeros(N)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        with leapp.node("acc", export_with="onnx"):
            x = annotate.input_tensors("acc", {"x": x})
            h = annotate.state_tensors("acc", {"h": self.h})
            y = torch.tanh(x) + h
            new = 0.5 * (h + x) if self.wrong else 0.5 * h + x
            self.h = annotate.update_state("acc", {"h": new})
            annotate.output_tensors("acc", {"y": y})
        return y


@pytest.fixture(scope="module")
def acc_export(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("acc")
    acc = Acc()
    gen = torch.Generator().manual_seed(0)
    with leapp.trace("acc", save_path=str(folder)) as session:
        for _ in range(3):
            acc.step(torch.randn(N, generator=gen))
    session.compile(validate=False)
    return folder / "acc"


ONES = {"x": st.just(torch.ones(N))}  # the same input every step: the wrong update shows at step 2, exactly


def fixed_inputs():
    return st.fixed_dictionaries(ONES)


def test_an_export_with_state_passes_on_sequences(acc_export, tmp_path):
    acc = Acc()
    result = assert_equivalent(acc.step, acc_export, reset=acc.reset, max_examples=8, counterexample_dir=tmp_path)
    assert result.steps == 4 and result.examples == 8 and "load" in result.ran
    assert set(result.ran) | set(result.skipped) == set(ROUTES)
    if leapp_run_path() is not None:  # one leapp-run --steps 4 process per sequence, the state carried
        assert "cpp-runner" in result.ran, result.skipped
    longer = assert_equivalent(acc.step, acc_export, reset=acc.reset, steps=7, max_examples=2, counterexample_dir=tmp_path)
    assert longer.steps == 7


def test_a_different_state_update_fails_at_the_step_it_shows(acc_export, tmp_path):
    wrong, right = Acc(wrong=True), Acc()
    folder = tmp_path / "cx"
    with pytest.raises(AssertionError) as caught:
        assert_equivalent(wrong.step, acc_export, fixed_inputs(), reset=wrong.reset, counterexample_dir=folder,
                          settings=hypothesis.settings(max_examples=1, database=None))
    text = str(caught.value)
    assert "differs from eager Acc.step on route 'load' at step 2 (of a sequence run from reset()" in text, text
    assert "output 'y': max abs error" in text, text
    assert "  step 1:\n    x: float32[4] on cpu, every element 1.0\n  step 2: (the failing step)\n" in text, text
    assert "step 3:" not in text, "the sequence ends at the failing step"
    assert "replay_counterexample(path, fn, export_dir, reset=reset)" in text, text
    # localised at step 1: the node's state update (output h_out) parts there, before the outputs do
    assert "acc (onnx, acc.onnx): FIRST DIVERGING NODE\n    output 'h_out': max abs error 0.5" in text, text
    assert "observed at step 1 of 2, from reset" in text and "already differs at step 1" in text, text
    (path,) = folder.iterdir()
    saved = torch.load(path, weights_only=True)
    assert saved["version"] == 2 and len(saved["steps"]) == 2 and "inputs" not in saved

    with pytest.raises(AssertionError) as replayed:
        replay_counterexample(path, wrong.step, acc_export, reset=wrong.reset)
    assert str(replayed.value) == text, "the file replays the sequence from reset state"
    fixed = replay_counterexample(path, right.step, acc_export, reset=right.reset)
    assert fixed.examples == 1 and fixed.steps == 2
    with pytest.raises(TypeError, match=r"export 'acc' carries state \(acc/h\).*pass reset="):
        replay_counterexample(path, right.step, acc_export)


def test_drawn_sequences_find_a_wrong_update_and_name_its_step(acc_export, tmp_path):
    wrong = Acc(wrong=True)
    with pytest.raises(AssertionError) as caught:
        assert_equivalent(wrong.step, acc_export, reset=wrong.reset, counterexample_dir=tmp_path, routes=["load"],
                          max_examples=15)
    text = str(caught.value)
    failing = int(text.split(" at step ", 1)[1].split(" ", 1)[0])
    assert 2 <= failing <= 4, text  # step 1 runs from the initial state, which both sides share
    assert f"  step {failing}: (the failing step)" in text and f"step {failing + 1}:" not in text, text


def test_state_needs_reset_and_whole_steps(acc_export):
    acc = Acc()
    with pytest.raises(TypeError, match=r"export 'acc' carries state \(acc/h\), so each example is a sequence of 4 "
                                        r"step\(s\) from its initial state: pass reset="):
        assert_equivalent(acc.step, acc_export, max_examples=1)
    with pytest.raises(TypeError, match=r"reset=3: expected a callable"):
        assert_equivalent(acc.step, acc_export, reset=3, max_examples=1)
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"steps=.*at least 1"):
            assert_equivalent(acc.step, acc_export, reset=acc.reset, steps=steps, max_examples=1)


def test_the_cuda_graphs_route_advances_the_state_once_per_step(acc_export):
    """The route runs its first call three times (direct, capture, replay): each from the state before the step.
    Checked on the CPU with the route's own wrapper around a plain pipeline."""
    from leapp.testing.routes import OpenRoute

    pipeline = leapp.load(acc_export)
    route = OpenRoute(ROUTES["load-cuda-graphs"], pipeline, stateful=True)
    acc = Acc()
    route.reset()
    for value in (1.0, 2.0, 3.0):
        x = torch.full((N,), value)
        torch.testing.assert_close(route.run({"x": x})["y"], acc.step(x))
    torch.testing.assert_close(pipeline.state["acc/h"], acc.h)

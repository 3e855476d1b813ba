"""Observation mode (leapp._recorder.observe): node boundary tensors of eager code, without a trace.

What leapp.testing's localisation relies on: the names are the recorder's, values are copies taken
when declared, the user's code runs exactly as outside a session (no dispatch mode, no Warp tape, the
caller's own objects), only this context observes, and an active session wins.
"""

from __future__ import annotations

import threading

import torch
import warp as wp

import leapp
from leapp import annotate
from leapp._recorder.observe import current_observer, observing


wp.init()


def _stacks():
    return torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack(), wp._src.context.runtime.tape


@leapp.node("dec", export_with="pt2")
def decorated(a, pair, named, scale=2.0):
    decorated.seen = (_stacks(), pair)
    return {"sum": a * scale + pair[0], "second": named["k"] + 0.0}


def _with_block(x):
    with leapp.node("blk", export_with="onnx"):
        got = annotate.input_tensors("blk", {"x": x})
        assert got is x, "observation hands back the caller's tensor"
        y = x + 1
        x.add_(100.0)  # changed after declaration: the observed input is the value at declaration
        annotate.output_tensors("blk", {"y": y, "arr": wp.array([1.0, 2.0], dtype=float, device="cpu")})
    return y


def test_names_values_and_no_recording():
    a, p0, p1, k = torch.ones(2), torch.full((2,), 3.0), torch.zeros(1), torch.full((3,), 7.0)
    pair = [p0, p1]
    x = torch.zeros(3)
    with observing() as observer:
        out = decorated(a, pair, {"k": k}, scale=3.0)
        _with_block(x)
    assert decorated.seen == ((0, 0, None), pair) and decorated.seen[1] is pair, "fn got the caller's own list"
    assert torch.equal(out["sum"], a * 3.0 + p0)
    dec, blk = observer.runs
    assert (dec.name, list(dec.inputs), list(dec.outputs)) == ("dec", ["a", "pair_0", "pair_1", "named_k"], ["sum", "second"])
    assert torch.equal(dec.inputs["pair_0"], p0) and dec.inputs["pair_0"] is not p0
    assert dec.finished and blk.finished
    assert torch.equal(blk.inputs["x"], torch.zeros(3)) and torch.equal(x, torch.full((3,), 100.0))
    assert torch.equal(blk.outputs["y"], torch.ones(3)) and torch.equal(blk.outputs["arr"], torch.tensor([1.0, 2.0]))
    assert current_observer() is None


def test_only_this_context_observes():
    seen = []
    with observing() as observer:
        args = (torch.ones(1), [torch.ones(1)], {"k": torch.ones(1)})
        worker = threading.Thread(target=lambda: seen.append((current_observer(), decorated(*args))))
        worker.start()
        worker.join()
    assert seen[0][0] is None and observer.runs == []


def test_a_session_wins_over_observation(tmp_path):
    with observing() as observer, leapp.trace("obs_session", save_path=str(tmp_path)) as session:
        for _ in range(2):
            decorated(torch.ones(2), [torch.ones(2), torch.ones(1)], {"k": torch.ones(3)})
    assert observer.runs == []
    assert "dec" in session.record.nodes


def test_a_failing_node_is_marked_unfinished():
    @leapp.node("boom", export_with="pt2")
    def boom(x):
        raise ValueError("no")

    with observing() as observer:
        try:
            boom(torch.ones(1))
        except ValueError:
            pass
    (run,) = observer.runs
    assert run.name == "boom" and not run.finished and list(run.inputs) == ["x"]

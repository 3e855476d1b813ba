"""leapp.testing on a dynamic-batch export: input_strategy draws the batch (one per example, shared by the
batched inputs), and every route (leapp.load, ONNX Runtime, the C++ runner with --batch) runs it."""

from __future__ import annotations

import pytest
import torch

import leapp
from leapp.testing import assert_equivalent, input_strategy
from leapp.testing.inputs import dynamic_dimensions

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


@leapp.node("feat", export_with="onnx", dynamic_batch=(1, 40))
def feat(x, y):
    n = x.shape[0]
    return torch.cat([x * 2.0, y.reshape(n, 3)], dim=1)


@leapp.node("pol", export_with="onnx", dynamic_batch=(1, 40))
def pol(f):
    return MLP(f)


def step(x, y):
    with torch.no_grad():
        return pol(feat(x, y))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    save = tmp_path_factory.mktemp("dyneq")
    with leapp.trace("dyneq", save_path=str(save)) as session:
        for _ in range(2):
            step(torch.randn(10, 3), torch.randn(10, 3))
    session.compile(validate=True)
    return save / "dyneq"


def test_input_strategy_draws_one_batch_per_example(export):
    from leapp.pipeline_format import read_pipeline

    _, desc = read_pipeline(export)
    assert dynamic_dimensions(desc) == {"batch": (1, 40)}
    seen = set()
    strategy = input_strategy(export)
    from hypothesis import given, settings

    @settings(max_examples=30, deadline=None, database=None)
    @given(strategy)
    def draw(inputs):
        assert inputs["x"].shape[0] == inputs["y"].shape[0]
        assert inputs["x"].shape[1:] == (3,) and inputs["y"].shape[1:] == (3,)
        seen.add(inputs["x"].shape[0])

    draw()
    assert len(seen) > 3 and min(seen) >= 1 and max(seen) <= 40, seen


def test_every_route_equals_eager_at_drawn_batches(export):
    result = assert_equivalent(step, export, max_examples=12)
    assert result.examples == 12
    assert "load" in result.ran, result
    assert "cpp-runner" in result.ran or "cpp-runner" in result.skipped, result  # leapp-run ... --batch N

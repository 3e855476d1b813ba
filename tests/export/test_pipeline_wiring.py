"""A pipeline call wires values by slot (leapp.runtime.pipeline.Pipeline._make_plan): a diamond of nodes with
several outputs, a caller input read by three nodes and final outputs from different nodes equals eager (CPU)."""

from __future__ import annotations

import pytest
import torch

import leapp

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@leapp.node("split", export_with="pt2")
def split(a, b):
    return a + b, a - b


@leapp.node("scale", export_with="pt2")
def scale(diff, a):
    return diff * a, diff.abs()  # the second output reaches no node: a final output


@leapp.node("join", export_with="pt2")
def join(prod, total, b):
    return prod + 2.0 * total - b


def step(a, b):
    total, diff = split(a, b)
    prod, magnitude = scale(diff, a)
    return join(prod, total, b), magnitude


@pytest.fixture(scope="module")
def diamond(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wiring")
    with leapp.trace("diamond", save_path=str(folder)) as session:
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            step(torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g))
    session.compile(validate=False)
    return leapp.load(str(folder / "diamond"))


def test_diamond_equals_eager_on_fresh_inputs(diamond):
    assert list(diamond.nodes) == ["split", "scale", "join"]
    assert sorted(node for node, _ in diamond.output_sources.values()) == ["join", "scale"], diamond.output_sources
    for seed in (5, 6):  # twice: the plan made by the first call serves the second
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
        out = diamond(a=a, b=b)
        total, diff = a + b, a - b
        expected = {"join": diff * a + 2.0 * total - b, "scale": diff.abs()}
        assert list(out) == list(diamond.outputs)
        for key, (node, output) in diamond.output_sources.items():
            torch.testing.assert_close(out[key], expected[node])
            alone = diamond.run_node(node, **_node_inputs(diamond, node, a, b))[output]
            torch.testing.assert_close(out[key], alone)


def _node_inputs(pipe, node: str, a, b) -> dict:
    """The node's inputs, computed node by node through run_node, wired by name (not by the plan)."""
    values = {"a": a, "b": b}
    for name, n in pipe.nodes.items():
        args = {s.name: values[n.sources[s.name]] for s in n.inputs}
        if name == node:
            return args
        for spec, t in pipe.run_node(name, **args).items():
            values[(name, spec)] = t
    raise AssertionError(node)

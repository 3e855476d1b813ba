"""Pt2Program: the exported graph called directly gives what ExportedProgram.module() gives.

CPU programs here; the Warp-segment programs are covered on the GPU in
tests/e2e/test_gpu_equivalence.py (graph capture, streams, allocations) for both callables.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leapp
from leapp import annotate
from leapp.pipeline_format import PipelineError
from leapp.runtime.runners import load_pt2
from leapp.runtime.pt2_program import Pt2Program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


class Policy(torch.nn.Module):
    """Layers, an activation, a persistent and a non-persistent buffer, a second output."""

    def __init__(self, sizes: list[int], activation: str, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = {"relu": torch.relu, "tanh": torch.tanh, "elu": torch.nn.functional.elu}[activation]
        self.register_buffer("scale", torch.rand(sizes[-1]) + 0.5)
        self.register_buffer("offset", torch.randn(sizes[-1]), persistent=False)

    def forward(self, obs, gain):
        h = obs
        for layer in self.layers:
            h = self.act(layer(h))
        return h * self.scale + self.offset, obs.sum(-1) * gain


@st.composite
def policies(draw):
    sizes = draw(st.lists(st.integers(1, 9), min_size=2, max_size=4))
    activation = draw(st.sampled_from(["relu", "tanh", "elu"]))
    batch = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    return Policy(sizes, activation, seed).eval(), batch, sizes[0], seed


@settings(max_examples=25, deadline=None)
@given(policies())
def test_direct_call_equals_module(case):
    model, batch, n_in, seed = case
    gen = torch.Generator().manual_seed(seed)
    obs, gain = torch.randn(batch, n_in, generator=gen), torch.randn(batch, generator=gen)
    program = torch.export.export(model, (obs, gain))
    direct = Pt2Program(program)
    assert direct.direct, direct.reason
    for _ in range(2):  # new values through the same program
        obs, gain = torch.randn(batch, n_in, generator=gen), torch.randn(batch, generator=gen)
        got, want = direct(obs, gain), program.module()(obs, gain)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
            assert not g.requires_grad  # lifted parameters are bound detached


def test_wrong_number_of_inputs_is_a_clear_error():
    model = Policy([3, 2], "relu", 0)
    direct = Pt2Program(torch.export.export(model, (torch.randn(1, 3), torch.randn(1))))
    with pytest.raises(TypeError, match=r"takes 2 tensor input\(s\), got 1"):
        direct(torch.randn(1, 3))


class Nested(torch.nn.Module):
    def forward(self, x, extra):
        return x + extra["a"]


class Keyword(torch.nn.Module):
    def forward(self, x, y=None):
        return x * y


@pytest.mark.parametrize(
    "program",
    [
        pytest.param(lambda: torch.export.export(Nested(), (torch.ones(2), {"a": torch.ones(2)})), id="nested"),
        pytest.param(lambda: torch.export.export(Keyword(), (torch.ones(2),), {"y": torch.ones(2)}), id="keyword"),
    ],
)
def test_programs_it_cannot_call_directly_use_module(program):
    exported = program()
    wrapped = Pt2Program(exported)
    assert not wrapped.direct and "nested or passed by keyword" in wrapped.reason
    assert wrapped.program is exported


class Counter(torch.nn.Module):
    """State written in place: both callables must leave the same state behind."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


def test_state_written_in_place_matches_module():
    x = torch.zeros(3)
    seen = []
    for make in (lambda ep: ep.module(), Pt2Program):
        callable_ = make(torch.export.export(Counter(), (x,)))
        outs = [callable_(x) for _ in range(3)]
        seen.append([float((o if isinstance(o, torch.Tensor) else o[0])[0]) for o in outs])
    assert seen[0] == seen[1] == [1.0, 2.0, 3.0]


def test_leapp_load_runs_pt2_nodes_directly(tmp_path):
    """A node exported by leapp is a flat function of tensors: leapp.load calls its graph directly."""
    model = Policy([4, 6, 2], "tanh", 3).eval()

    def step(obs, gain):
        with leapp.node("policy", export_with="pt2"):
            obs, gain = annotate.input_tensors("policy", {"obs": obs, "gain": gain})
            action, total = model(obs, gain)
            annotate.output_tensors("policy", {"action": action, "total": total})
        return action, total

    gen = torch.Generator().manual_seed(0)
    with leapp.trace("direct", save_path=str(tmp_path)) as session:
        for _ in range(3):
            step(torch.randn(2, 4, generator=gen), torch.randn(2, generator=gen))
    assert session.compile().ok
    pipeline = leapp.load(tmp_path / "direct")
    runner = pipeline.nodes["policy"].runner
    assert runner.program.direct, runner.program.reason
    obs, gain = torch.randn(2, 4, generator=gen), torch.randn(2, generator=gen)
    got = pipeline(obs=obs, gain=gain)
    want_action, want_total = model(obs, gain)
    module_outs = load_pt2(tmp_path / "direct" / "policy.pt2").module()(obs, gain)
    for key, want, from_module in (("action", want_action, module_outs[0]), ("total", want_total, module_outs[1])):
        name = next(k for k in got if k.endswith(key))
        torch.testing.assert_close(got[name], from_module, rtol=0, atol=0)
        torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-6)
    on_cpu = leapp.load(tmp_path / "direct", cuda_graphs=True).nodes["policy"].runner
    assert on_cpu.call is on_cpu.program and on_cpu.no_graphs_reason == "runs on cpu"
    assert runner.no_graphs_reason == "not requested"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error torch gives without a CUDA device")
def test_a_cuda_node_without_cuda_names_the_artifact(tmp_path):
    import yaml

    model = Policy([3, 2], "relu", 1).eval()

    def step(obs):
        with leapp.node("policy", export_with="pt2"):
            obs = annotate.input_tensors("policy", {"obs": obs})
            action, _ = model(obs, obs.sum(-1))
            annotate.output_tensors("policy", {"action": action})
        return action

    with leapp.trace("moved", save_path=str(tmp_path)) as session:
        for _ in range(3):
            step(torch.randn(2, 3))
    assert session.compile().ok
    spec = tmp_path / "moved" / "pipeline.yaml"
    desc = yaml.safe_load(spec.read_text())
    desc["nodes"][0]["device"] = "cuda:0"  # as if exported on a GPU machine
    spec.write_text(yaml.safe_dump(desc))
    (spec.parent / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    pipeline = leapp.load(tmp_path / "moved")
    with pytest.raises(PipelineError, match=r"policy\.pt2: the node was exported on cuda:0 but torch sees no CUDA"):
        pipeline(obs=torch.randn(2, 3))

"""benchmarks/existing_tool_step.py times the README example's step through the existing tool: the same kernels,
the same policy weights and the same robot states as examples/go2_pipeline.py, which it cannot import (that file
imports this project's leapp, and the existing tool is also ``leapp``). The GPU numbers are in
docs/performance.md; here the copies are checked against the example wherever the suite runs.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest
import torch
from bench_scripts import benchmark_module
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "go2_pipeline.py"
SCRIPT = ROOT / "benchmarks" / "existing_tool_step.py"
KERNELS = ("projected_gravity", "joint_offsets", "scale", "clamp_scale")

pytest.importorskip("warp")
bench = benchmark_module("existing_tool_step")


def _example():
    return benchmark_module("pipeline_step").example()  # examples/go2_pipeline.py as a module


def _functions(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in KERNELS}


def test_the_kernels_are_the_examples():
    example = _functions(EXAMPLE)
    assert set(example) == set(KERNELS)
    assert _functions(SCRIPT) == example


def test_the_policy_has_the_examples_weights():
    example = _example()
    example.Go2("cpu")  # seeds torch and appends the example's policy
    want = [p.detach() for p in example.POLICY_NET[-1].parameters()]
    got = [p.detach() for p in bench.policy_net("cpu").parameters()]
    assert [p.shape for p in got] == [p.shape for p in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 64), seed=st.integers(0, 2**31 - 1))
def test_the_robot_states_are_the_examples(n, seed):
    for got, want in zip(bench.random_state(n, "cpu", seed), _example().random_state(n, "cpu", seed)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_it_refuses_this_projects_leapp():
    with pytest.raises(SystemExit, match="not the existing tool 0.7.2"):
        bench.existing_leapp()


class _Inactive:
    """The existing tool's annotations outside ``leapp.start``: values pass through, blocks do nothing."""

    @staticmethod
    def input_tensors(_node, tensors):
        values = tuple(tensors.values())
        return values[0] if len(values) == 1 else values

    @staticmethod
    def output_tensors(_node, tensors, **_kwargs):
        return tensors

    @staticmethod
    def warp_op(_node):
        return contextlib.nullcontext()


@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_every_variant_computes_the_examples_step(variant):
    import warp as wp

    wp.init()
    example = _example()
    quat, joints = example.random_state(33, "cpu", 5)
    want = example.Go2("cpu").step(quat, joints)
    got = bench.Go2("cpu", _Inactive, *variant.split("/")).step(quat, joints)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

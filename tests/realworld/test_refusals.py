"""Patterns from simulator code that leapp must refuse by name: a TraceError naming the kernel and the line.

Both run eagerly without complaint (Warp accepts them), so an export would be silently wrong or fail later.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import warp as wp
from realworld_helpers import trace_passes

import leapp
from leapp import annotate
from leapp.errors import TraceError

pytestmark = pytest.mark.realworld
N = 4


def _line(tag: str) -> str:
    """``test_refusals.py:<line>`` of the line of this file that carries ``# <tag>``."""
    lines = Path(__file__).read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# <{tag}>"))
    return f"{Path(__file__).name}:{number}"


def test_proxy_array_passed_to_launch_is_refused():
    """Isaac Lab's ``ProxyArray`` handed to ``wp.launch`` instead of ``.warp`` (as ``ArticulationData``'s lazy
    properties do): Warp launches it through ``__array_interface__``, its capture records ``wp.array``s only."""
    pytest.importorskip("isaaclab_experimental",
                        reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")
    from isaaclab_experimental.envs.mdp import observations as obs
    from isaaclab_standin import StandInArticulationData

    data = StandInArticulationData(N, 2, "cpu")

    @leapp.node("gravity")
    def gravity(pose):
        data.root_link_pose_w.torch.copy_(pose)
        out = torch.zeros(N, 3)
        with annotate.warp_op():
            wp.launch(obs._projected_gravity_kernel, dim=N, device="cpu",  # <proxy launch>
                      inputs=[data.root_link_pose_w, data.GRAVITY_VEC_W.warp, wp.from_torch(out)])
        return out

    pose = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 1.0]]).repeat(N, 1)
    torch.testing.assert_close(gravity(pose), torch.tensor([[0.0, 0.0, -1.0]]).repeat(N, 1))  # eager: it runs
    with pytest.raises(TraceError) as info:
        trace_passes(gravity, [[pose]] * 3)
    message = str(info.value)
    launch = r"wp\.launch\('_projected_gravity_kernel'\) at \S*" + re.escape(_line("proxy launch"))
    assert re.search(launch, message), message
    assert "argument 'root_pose_w' is a isaaclab.utils.warp.proxy_array.ProxyArray" in message, message
    assert "ProxyArray.warp" in message, message


@wp.kernel
def accumulate(x: wp.array(dtype=wp.float32), total: wp.array(dtype=wp.float32)):
    i = wp.tid()
    total[i] = total[i] + x[i]


def test_read_modify_write_of_persistent_state_is_refused():
    """A running sum kept in a Warp array made once outside the node: the segment reads its old bytes, which
    no node input carries, so an export would bake this trace's sum."""
    total = wp.zeros(N, dtype=wp.float32, device="cpu")

    @leapp.node("running_sum")
    def running_sum(x):
        with annotate.warp_op():
            wp.launch(accumulate, dim=N, inputs=[wp.from_torch(x)], outputs=[total], device="cpu")  # <accumulate>
        return wp.to_torch(total).clone()

    with pytest.raises(TraceError) as info:
        trace_passes(running_sum, [[torch.ones(N)]] * 3)
    message = str(info.value)
    assert re.search(r"wp\.launch\('accumulate'\) at \S*" + re.escape(_line("accumulate")) + ", argument 'total'",
                     message), message
    assert "depend on what that memory held before it ran" in message, message

"""A Warp node with state on the CPU (docs/state.md): a leaky integrator whose kernel reads the state, exported
with its Warp segment's CPU code, loaded and stepped against the eager code."""

from __future__ import annotations

import pytest
import torch

wp = pytest.importorskip("warp")

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

N = 5


@wp.kernel
def leak(x: wp.array(dtype=float), s: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = 0.75 * s[i] + x[i]


class Integrator:
    """The user's code: the state lives in ``self.s``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.s = torch.full((N,), 0.5)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        with leapp.node("integrate", export_with="pt2"):
            x = annotate.input_tensors("integrate", {"x": x})
            s = annotate.state_tensors("integrate", {"s": self.s})
            out = torch.empty_like(x)
            with annotate.warp_op():
                wp.launch(leak, dim=N, inputs=[wp.from_torch(x), wp.from_torch(s)], outputs=[wp.from_torch(out)],
                          device="cpu")
            y = out * 2.0
            self.s = annotate.update_state("integrate", {"s": out})
            annotate.output_tensors("integrate", {"y": y})
        return y


def _inputs(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randn(N, generator=gen) for _ in range(n)]


def test_a_warp_node_with_state_runs_loaded_as_eager(tmp_path):
    wp.init()
    loop = Integrator()
    with leapp.trace("leaky", save_path=str(tmp_path)) as session:
        for x in _inputs(3):
            loop.step(x)
    session.compile(validate=True)
    pipeline = leapp.load(tmp_path / "leaky")
    assert list(pipeline.inputs) == ["x"] and list(pipeline.state_specs) == ["integrate/s"]
    assert torch.equal(pipeline.state["integrate/s"], torch.full((N,), 0.5))
    loop.reset()
    for x in _inputs(4):
        torch.testing.assert_close(pipeline(x=x)["y"], loop.step(x))
    pipeline.reset()
    loop.reset()
    x = _inputs(1)[0]
    torch.testing.assert_close(pipeline(x=x)["y"], loop.step(x))

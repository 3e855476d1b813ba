"""The real client: LEAPP 0.7.2's InferenceManager runs leapp's LEAPP bundles and equals leapp.load and the eager code.

The client lives in <repo>/.leapp-client (scripts/install-leapp-client.sh) and runs in a child process that cannot
import this project's leapp (``leapp_client.py``); the tests skip without it, except under CI=true.
"""

from __future__ import annotations

import pytest
import torch

import leapp
import leapp.cli
from bundle_pipelines import B, H0, LAST0, obs_act, record_obs_act, record_recurrent, recurrent
from leapp_client import CLIENT, require_client, run_client

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::leapp.interchange.LeappBundleWarning")]
STEPS = 4


def _steps(shapes: dict[str, tuple], seed: int = 11) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{key: torch.randn(*shape, generator=g) for key, shape in shapes.items()} for _ in range(STEPS)]


@pytest.fixture(autouse=True)
def _client():
    require_client()


def test_a_stateless_onnx_and_pt2_pipeline_runs_in_the_client(tmp_path):
    folder = record_obs_act(tmp_path, leapp_bundle=True)
    steps = _steps({"obs/quat": (B, 4), "obs/joints": (B, 2)})
    got = run_client(folder / "robot.yaml", steps, tmp_path)
    assert got["leapp_file"].startswith(str(CLIENT)) and got["inputs"] == ["obs/quat", "obs/joints"]
    assert got["outputs"] == ["act/action"]
    pipeline = leapp.load(folder)
    for step, result in zip(steps, got["results"]):
        eager = obs_act(step["obs/quat"], step["obs/joints"])
        loaded = pipeline.run(quat=step["obs/quat"], joints=step["obs/joints"])["action"]
        torch.testing.assert_close(result["act/action"], eager, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["act/action"], loaded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["onnx", "pt2"])
def test_a_recurrent_policy_carries_its_state_in_the_client(tmp_path, backend):
    folder = record_recurrent(tmp_path, backend)
    text = (folder / "rnn.yaml").read_text()
    assert "feedback_connections:\n    policy/h_out: [policy/h]" in text and "initial_values: initial_values" in text
    steps = _steps({"policy/obs": (B, 3)})
    got = run_client(folder / "rnn.yaml", steps, tmp_path)
    assert got["inputs"] == ["policy/obs"]  # the state is the runtime's, not the caller's
    pipeline = leapp.load(folder)
    carries = hasattr(pipeline, "reset")  # leapp.load carries state (issue 49's runtime part) where it has reset()
    h, last = H0, LAST0
    for step, result in zip(steps, got["results"]):
        action, h, last = recurrent(step["policy/obs"], h, last, backend)
        torch.testing.assert_close(result["policy/action"], action, rtol=1e-5, atol=1e-5)
        if carries:
            torch.testing.assert_close(pipeline.run(obs=step["policy/obs"])["action"], action, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got["results"][0]["policy/action"], got["results"][1]["policy/action"])


def test_the_client_runs_what_the_command_wrote_after_compile(tmp_path):
    """An export compiled without the option gets its bundle from the command."""
    folder = record_obs_act(tmp_path)
    assert not (folder / "robot.yaml").exists()
    assert leapp.cli.main(["write-leapp-bundle", str(folder)]) == 0
    steps = _steps({"obs/quat": (B, 4), "obs/joints": (B, 2)}, seed=3)
    got = run_client(folder / "robot.yaml", steps, tmp_path)
    torch.testing.assert_close(got["results"][-1]["act/action"], obs_act(steps[-1]["obs/quat"],
                                                                         steps[-1]["obs/joints"]), rtol=1e-5, atol=1e-5)

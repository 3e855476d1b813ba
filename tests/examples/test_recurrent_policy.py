"""examples/recurrent_policy.py: a GRU policy with its hidden state and last action carried by the runtime.

The example runs as a user runs it (a fresh process, ``--out`` a temporary folder): it exports, validates,
reloads and compares an episode with eager, printing only its report. Then leapp-run, leapp's C++ runner,
runs the same export over a sequence in one process (``--steps K``) and ``--time N`` runs, carrying the
state from the initial values: every step's action and the final state equal ``leapp.load``'s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import leapp
from leapp.testing.cpp_runner import leapp_run_env, leapp_run_path, value_file
from test_examples import EXAMPLES, NOISE, max_error, report_statuses, run_example

sys.path.insert(0, str(EXAMPLES))
import recurrent_policy  # the example's own inputs (examples/ on sys.path above)

STEPS = 6


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("recurrent")
    proc = run_example("recurrent_policy.py", "--out", str(out), "--steps", str(STEPS))
    return out / "recurrent_policy", proc


def test_the_recurrent_policy_exports_and_runs_an_episode_equal_to_eager(example):
    folder, proc = example
    assert report_statuses(proc.stdout, ["obs", "policy"]) == {"obs": "passed", "policy": "passed"}
    assert "state policy/h: float32[1, 32]" in proc.stdout and "state policy/last_action: float32[1, 12]" in proc.stdout
    assert max_error(proc.stdout, f"max |exported - eager| over {STEPS} steps with state") <= 1e-5
    assert max_error(proc.stdout, "max |exported - eager| at the first step after reset()") <= 1e-5
    noise = [line for line in (proc.stdout + proc.stderr).splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise
    pipeline = leapp.load(folder)
    assert list(pipeline.inputs) == ["quat", "joints"] and list(pipeline.outputs) == ["action"]
    assert sorted(pipeline.state_specs) == ["policy/h", "policy/last_action"]
    assert (folder / "initial_values.safetensors").is_file() and (folder / "recurrent_policy.yaml").is_file()


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def read(path: Path, steps: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).reshape(steps, *shape)


def leapp_run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(leapp_run_path()), *args], capture_output=True, text=True, env=leapp_run_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


STATES = {"h": (1, 32), "last_action": (1, 12)}


@pytest.mark.skipif(leapp_run_path() is None, reason="leapp-run was not built: ONNX Runtime's headers were missing "
                    "(bash scripts/fetch-ort-headers.sh, then pip install -e .)")
def test_leapp_run_carries_the_state_over_steps_like_leapp_load(example, tmp_path):
    """One leapp-run process runs STEPS steps with different inputs (--steps): each step's action, and the state
    after the last, equal leapp.load's sequence from reset(); so does the state after --time runs on one input.
    --describe lists the state."""
    folder, _ = example
    described = leapp_run(str(folder), "--describe").stdout
    assert "state policy/h <- policy/h_out float32[1, 32]" in described, described
    assert "state policy/last_action <- policy/last_action_out float32[1, 12]" in described, described

    pipeline = leapp.load(folder)
    inputs = [recurrent_policy.random_state(1, 200 + k) for k in range(STEPS)]
    want = [pipeline(quat=quat, joints=joints)["action"].clone() for quat, joints in inputs]
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    value_file(in_dir, "quat").write_bytes(b"".join(raw(q) for q, _ in inputs))
    value_file(in_dir, "joints").write_bytes(b"".join(raw(j) for _, j in inputs))
    leapp_run(str(folder), "--in", str(in_dir), "--out", str(out_dir), "--device", "cpu", "--steps", str(STEPS))
    got = read(value_file(out_dir, "action"), STEPS, (1, 12))
    for k in range(STEPS):
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=f"step {k + 1}")
    assert not torch.allclose(got[0], got[1]), "the steps differ (inputs and state both change)"
    for key, shape in STATES.items():
        torch.testing.assert_close(read(out_dir / "state" / "policy" / f"{key}.bin", 1, shape)[0],
                                   pipeline.state[f"policy/{key}"], rtol=1e-5, atol=1e-6, msg=f"state {key}")

    pipeline.reset()  # --time N: N more runs of one input, each carrying the state: 1 + N steps in all
    for _ in range(1 + 4):
        pipeline(quat=inputs[0][0], joints=inputs[0][1])
    one, timed = tmp_path / "one", tmp_path / "timed"
    one.mkdir()
    value_file(one, "quat").write_bytes(raw(inputs[0][0]))
    value_file(one, "joints").write_bytes(raw(inputs[0][1]))
    leapp_run(str(folder), "--in", str(one), "--out", str(timed), "--device", "cpu", "--time", "4")
    for key, shape in STATES.items():
        torch.testing.assert_close(read(timed / "state" / "policy" / f"{key}.bin", 1, shape)[0],
                                   pipeline.state[f"policy/{key}"], rtol=1e-5, atol=1e-6, msg=f"state {key}")


def test_leapp_testing_checks_the_recurrent_policy_on_sequences(example, tmp_path):
    """The export against the eager GRU policy (same seeded weights) on drawn 4-step sequences from reset."""
    from leapp.testing import assert_equivalent, input_strategy, unit_norm

    folder, _ = example
    policy = recurrent_policy.RecurrentPolicy(1).eval()
    with torch.no_grad():
        result = assert_equivalent(policy.step, folder, input_strategy(folder, quat=unit_norm()), reset=policy.reset,
                                   max_examples=6, counterexample_dir=tmp_path)
    assert result.steps == 4 and "load" in result.ran

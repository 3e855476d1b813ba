"""The existing LEAPP tool (0.7.2) as a client of leapp's LEAPP bundles, run in a child process that cannot see leapp.

``bash scripts/install-leapp-client.sh`` installs it into <repo>/.leapp-client; without it the client tests skip,
except under CI=true, where a missing client is a failure (CI runs the install script first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

CLIENT = Path(__file__).resolve().parents[2] / ".leapp-client"
RUNNER = Path(__file__).with_name("leapp_client_run.py")


def require_client() -> None:
    if (CLIENT / "leapp" / "inference_manager.py").is_file():
        return
    why = f"the LEAPP 0.7.2 client is not installed in {CLIENT} (bash scripts/install-leapp-client.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def run_client(bundle: Path, steps: list[dict[str, torch.Tensor]], scratch: Path) -> dict:
    """``InferenceManager(bundle).run_policy(step)`` for each step, in the client's process: its results, its
    ``inputs``/``outputs`` and the file its ``leapp`` came from."""
    require_client()
    steps_file, out_file = scratch / "client_steps.pt", scratch / "client_out.pt"
    torch.save(steps, steps_file)
    site = sysconfig.get_paths()["purelib"]
    proc = subprocess.run([sys.executable, "-S", str(RUNNER), str(CLIENT), site, str(bundle), str(steps_file),
                           str(out_file)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"the LEAPP client failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return torch.load(out_file, weights_only=True)

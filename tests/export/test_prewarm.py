"""leapp._export.prewarm: the exporter's imports in a thread during the trace (opt-in, LEAPP_EXPORT_PREWARM=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    import leapp
    from leapp._export import prewarm

    @leapp.node("double", export_with="pt2")
    def double(x):
        return x * 2.0

    before = [m for m in prewarm.MODULES if m in sys.modules]
    with leapp.trace("pw", save_path=sys.argv[1]) as session:
        threads = [prewarm._THREAD.name] if prewarm._THREAD is not None else []
        double(torch.ones(3))
        double(torch.ones(3))
    report = session.compile(validate=False)
    y = leapp.load(sys.argv[1] + "/pw").run_node("double", x=torch.arange(3.0))["output"]
    print(json.dumps({"before": before, "thread": threads, "after": [m for m in prewarm.MODULES if m in sys.modules],
                      "started_again": prewarm.start(), "y": y.tolist()}))
    """
)


def _run(tmp_path, setting: str | None) -> dict:
    env = dict(os.environ)
    env.pop("LEAPP_EXPORT_PREWARM", None)
    if setting is not None:
        env["LEAPP_EXPORT_PREWARM"] = setting
    env["LEAPP_VALIDATION_PRESTART"] = "0"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_on_request_the_imports_run_in_a_thread_during_the_trace_and_the_export_works(tmp_path):
    out = _run(tmp_path, "1")
    assert "torch.export._trace" not in out["before"], out  # a fresh process: the thread made that import
    assert out["thread"] == ["leapp-export-prewarm"], out
    assert out["after"] == list(__import__("leapp._export.prewarm", fromlist=["MODULES"]).MODULES), out
    assert out["started_again"] is False  # once per process
    assert out["y"] == [0.0, 2.0, 4.0]


def test_off_by_default(tmp_path):
    out = _run(tmp_path, None)
    assert out["thread"] == [] and out["y"] == [0.0, 2.0, 4.0], out

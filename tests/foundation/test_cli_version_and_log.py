"""`leapp --version`, `leapp --help` naming the build tool, and a log that is silent unless configured."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from leapp import cli


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"leapp {importlib.metadata.version('leapp')}\n"


def test_help_names_the_runtime_build_tool(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # the name must not be wrapped apart on a narrow terminal
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "leapp-build-warp-runtime [--status]" in capsys.readouterr().out


def test_leapp_is_silent_unless_the_application_configures_logging():
    code = ("import logging, leapp\n"
            "logging.getLogger('leapp._export.compile').warning('unseen')\n"
            "print(logging.getLogger().handlers, [type(h).__name__ for h in logging.getLogger('leapp').handlers])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "unseen" not in result.stderr  # Python's last-resort handler would print it without leapp's NullHandler
    assert result.stdout.strip() == "[] ['NullHandler']"  # no basicConfig: the root logger is left alone


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_the_leapp_command_answers_without_importing_torch(argv):
    """`leapp --version` and `--help` import neither torch nor Warp (they took 3 to 5 s when they did): the
    command registers the torch op only when a command loads a PT2. Python's import log says what was imported."""
    import os
    from pathlib import Path

    leapp = Path(sys.executable).with_name("leapp")
    result = subprocess.run([str(leapp), *argv], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "leapp.cli" in imported, result.stderr[-2000:]  # the log is there, and it is the command's
    assert not imported & {"torch", "warp", "onnx", "onnxruntime"}, sorted(imported & {"torch", "warp", "onnx"})


def test_import_leapp_in_a_program_still_registers_the_torch_op():
    code = "import leapp, torch\nprint(hasattr(torch.ops.leapp, 'warp_segment'))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"

#!/usr/bin/env bash
# scripts/install-leapp-client.sh: installs the existing LEAPP tool (0.7.2, the client of leapp's LEAPP bundles,
# docs/leapp-bundle.md) into <repo>/.leapp-client (git-ignored), where it cannot see this project's leapp.
#
# Both import as `leapp`, and the virtualenv's editable install of this project is a meta-path finder that
# .pth processing installs, so the client runs as `python -S` with sys.path set explicitly to
# [.leapp-client, the virtualenv's site-packages] (no .pth files read): tests/interchange/leapp_client_run.py.
# The client's other needs (torch, PyYAML, onnx, onnxruntime, onnxscript, numpy) come from the virtualenv; what
# it lacks (safetensors, until it is this project's dependency) goes into .leapp-client too.
# Usage: bash scripts/install-leapp-client.sh [PYTHON]   (default: .venv/bin/python)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-$repo/.venv/bin/python}"
target="$repo/.leapp-client"
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
check='import sys; sys.path[:0] = sys.argv[1:3]
import leapp, safetensors
assert leapp.__file__.startswith(sys.argv[1] + "/"), leapp.__file__
assert leapp.__version__ == "0.7.2", leapp.__version__
from leapp import InferenceManager
print(f"leapp-client: LEAPP {leapp.__version__} at {leapp.__file__}")'
if "$py" -S -c "$check" "$target" "$site" 2>/dev/null; then exit 0; fi
rm -rf "$target"
"$py" -m pip install -q --no-deps --no-compile --target "$target" leapp==0.7.2
if ! "$py" -c 'import safetensors' 2>/dev/null; then
  "$py" -m pip install -q --no-deps --no-compile --target "$target" 'safetensors>=0.5'
fi
"$py" -S -c "$check" "$target" "$site"

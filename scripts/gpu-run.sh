#!/usr/bin/env bash
# scripts/gpu-run.sh: build leapp on a GPU machine without network and run a command there.
#
# The machine has torch, onnx, onnxruntime, nanobind and cmake; what it lacks
# (warp-lang, scikit-build-core, ...) comes as wheels in .whl/, or through the
# optional hook .gpu/w2/install.sh; the ORT headers in third_party/onnxruntime
# (docs/building.md, "Running the GPU tests"). Then:
#   bash scripts/gpu-run.sh python3 -m pytest -m cuda -q
# Use `python3 -m pip`: the machine's bare `pip` belongs to another interpreter.
# The build log and the command's output are written to $OUT when set.
set -uo pipefail
out="${OUT:-/tmp}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
fi
if [ -f .gpu/w2/install.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/w2/install.sh || exit 1
fi
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
python3 -c "import torch, onnxruntime, onnx; print('torch', torch.__version__, 'ort', onnxruntime.__version__, 'onnx', onnx.__version__)"
if ! python3 -m pip install --no-build-isolation --no-deps -e . -v > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"; echo "gpu-run: build failed (full log: build.log)"; exit 1
fi
grep -E "libleapp_warp_(ort|torch)|torch not found|headers not found" "$out/build.log" | head -5
"$@" 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"

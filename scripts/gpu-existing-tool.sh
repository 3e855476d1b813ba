#!/usr/bin/env bash
# scripts/gpu-existing-tool.sh: the existing export tool (LEAPP 0.7.2) on the GPU machine, for
# benchmarks/existing_tool_step.py. Run after scripts/gpu-run.sh (Warp in /tmp/site); it needs no network.
#
# .existing/ (git-ignored, filled by scripts/fetch-existing-tool.sh) holds the wheels of leapp 0.7.2 and
# cupti-python; the machine's torch install has the rest they need. They go into /tmp/existing, never next
# to this project's package: both import as `leapp`, so the benchmark runs with /tmp/existing first on
# PYTHONPATH. The tool's Warp runtime is built with CMake where the tool looks for it
# ($XDG_CACHE_HOME/leapp/warp-runtime/build); its CMake downloads ONNX Runtime's C header when absent, so the
# header from third_party/ is put there first. Then the command given, if any, runs with that PYTHONPATH.
set -euo pipefail
site=/tmp/existing
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/xdg}"
build="$XDG_CACHE_HOME/leapp/warp-runtime/build"
if [ ! -f "$build/libleapp_wrp_torch_custom_op.so" ]; then
  python3 -c "import cuda.bindings, safetensors" || { echo "gpu-existing-tool: cuda-bindings and safetensors must be installed"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .existing/leapp-*.whl \
    .existing/cupti_python-*.whl 2>&1 | tail -2
  src="$site/leapp/leapp_graph/custom_operator_registry/warp_operator/runtime"
  mkdir -p "$build/onnxruntime_headers"
  cp third_party/onnxruntime/include/onnxruntime_c_api.h "$build/onnxruntime_headers/"
  # Its CMake checks that this header exists (split out of onnxruntime_c_api.h in later releases); the
  # 1.21 C API header in third_party/ does not include it, so an empty one satisfies the check.
  [ -f "$build/onnxruntime_headers/onnxruntime_ep_c_api.h" ] || : > "$build/onnxruntime_headers/onnxruntime_ep_c_api.h"
  PYTHONPATH="$site:/tmp/site:${PYTHONPATH:-}" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$(command -v python3)" -DCMAKE_CUDA_ARCHITECTURES=90 > "${OUT:-/tmp}/existing-cmake.log" 2>&1 \
    || { tail -30 "${OUT:-/tmp}/existing-cmake.log"; exit 1; }
  cmake --build "$build" > "${OUT:-/tmp}/existing-build.log" 2>&1 || { tail -40 "${OUT:-/tmp}/existing-build.log"; exit 1; }
  ls -la "$build"/*.so
fi
export PYTHONPATH="$site:/tmp/site:${PYTHONPATH:-}"
if [ "$#" -gt 0 ]; then "$@"; fi

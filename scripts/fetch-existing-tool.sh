#!/usr/bin/env bash
# scripts/fetch-existing-tool.sh: downloads into .existing/ (git-ignored) the wheels that
# scripts/gpu-existing-tool.sh installs on the GPU machine for benchmarks/existing_tool_step.py:
# the existing export tool (LEAPP 0.7.2) and cupti-python, which its Warp tracing requires. That
# machine runs Python 3.12 on x86_64 without network; its torch install already has what these
# two need (cuda-bindings, nvidia-cuda-cupti, safetensors, PyYAML, onnx, onnxscript).
set -euo pipefail
mkdir -p .existing
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .existing \
  leapp==0.7.2 cupti-python==13.0.1
ls -l .existing

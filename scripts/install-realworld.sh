#!/usr/bin/env bash
# scripts/install-realworld.sh: install the simulator packages tests/realworld imports (pytest -m realworld).
#
# Only what those imports need, without the packages' own pins on torch and warp-lang (leapp keeps torch 2.13
# and warp-lang 1.19):
# - MuJoCo Warp 4.0.0 and MuJoCo's Python bindings, without their viewer (glfw, PyOpenGL, mujoco-studio) and
#   their test/CLI dependencies (absl-py, etils): mujoco_warp's kernels and put_model/put_data import neither.
# - Isaac Lab 3.0.0, pure Python; it declares Requires-Python >= 3.12 and pins torch 2.11, warp-lang 1.17 and
#   Isaac Sim/Newton, none of which the Warp-first MDP terms and managers the tests run import. What they do
#   import (lazy_loader, gymnasium, prettytable) is installed normally, with its dependencies.
#
#   bash scripts/install-realworld.sh [PIP]   (default: .venv/bin/pip, from the repository root)
set -euo pipefail
pip="${1:-.venv/bin/pip}"
"$pip" install lazy_loader==0.6 gymnasium==1.4.0 prettytable==3.19.0
"$pip" install --no-deps mujoco-warp==4.0.0 mujoco==4.0.0 mujoco-core==4.0.0
"$pip" install --no-deps --ignore-requires-python isaaclab==3.0.0

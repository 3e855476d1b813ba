"""A lowered model runs with plain onnxruntime in a process where `import leapp` fails and Warp is not loaded."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

wp = pytest.importorskip("warp")
pytest.importorskip("onnxruntime")

from leapp.lowering import lower_kernel  # noqa: E402
from lowering_kernels import k_quat_rotate  # noqa: E402

CHILD = """
import sys
sys.modules["leapp"] = None  # import leapp raises ImportError
sys.modules["warp"] = None
import numpy as np, onnxruntime as ort
try:
    import leapp  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("leapp importable")
d = np.load(sys.argv[2])
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
(out,) = s.run(["out_out"], {"q": d["q"], "v": d["v"], "out": d["v"]})
np.save(sys.argv[3], out)
"""


def test_lowered_model_runs_where_leapp_cannot_be_imported(tmp_path):
    wp.init()
    rng = np.random.default_rng(3)
    q = rng.normal(size=(16, 4)).astype(np.float32)
    v = rng.normal(size=(16, 3)).astype(np.float32)
    out = wp.zeros(16, dtype=wp.vec3, device="cpu")
    wp.launch(k_quat_rotate, dim=16, inputs=[wp.array(q, dtype=wp.quat), wp.array(v, dtype=wp.vec3), out],
              device="cpu")
    model = tmp_path / "lowered.onnx"
    model.write_bytes(lower_kernel(k_quat_rotate).SerializeToString())
    np.savez(tmp_path / "in.npz", q=q, v=v)
    subprocess.run([sys.executable, "-I", "-c", CHILD, str(model), str(tmp_path / "in.npz"), str(tmp_path / "o.npy")],
                   check=True, cwd=tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), out.numpy(), rtol=8e-5, atol=1e-5)

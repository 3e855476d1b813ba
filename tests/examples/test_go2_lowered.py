"""The README robot exported with warp="lower" runs, node by node, where leapp does not exist (issue 48).

examples/go2_pipeline.py is traced on the CPU with its obs node as PT2 (the example's default) and as ONNX
(its ``obs_with`` switch), and compiled with ``warp="lower"``. A fresh interpreter then blocks ``import
leapp``, drops leapp's editable finder and source folder from its import machinery, and runs the export
with nothing but onnxruntime, ``torch.export.load(...).module()`` and PyYAML: it reads pipeline.yaml, orders
the nodes by its edges and feeds each node's outputs to the next by hand. The action it returns must equal the
eager step computed here on the same inputs, and no shared object of leapp may be mapped into that process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import yaml

wp = pytest.importorskip("warp")
pytest.importorskip("onnxruntime")

import leapp  # noqa: E402
from test_examples import cpu_only, max_error, report_statuses, run_example  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import go2_pipeline  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
    pytest.mark.skipif(not (Path(wp.__file__).parent / "bin" / "warp-clang.so").is_file(),
                       reason="this Warp cannot build CPU kernels (no warp-clang.so); the test traces on the CPU"),
]

ENVS = 16
SEEDS = (123, 124)  # inputs never seen while tracing

# The child: no leapp anywhere, only onnxruntime, torch.export and PyYAML; the pipeline chained by hand.
CHILD = r"""
import os, sys
sys.modules["leapp"] = None  # import leapp raises ImportError
sys.meta_path[:] = [f for f in sys.meta_path if "leapp" not in getattr(type(f), "__module__", "")]
sys.path[:] = [p for p in sys.path if not os.path.isfile(os.path.join(p or ".", "leapp", "__init__.py"))]
try:
    import leapp  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("leapp importable")
import numpy as np, onnxruntime as ort, torch, yaml

folder, inputs_npz, out_npz = sys.argv[1:4]
desc = yaml.safe_load(open(os.path.join(folder, "pipeline.yaml")))
source = {}  # (node, input) -> ("", pipeline input) or (producer node, its output)
for entry in desc["inputs"]:
    for c in entry["consumers"]:
        source[(c["node"], c["input"])] = ("", entry["name"])
for e in desc["edges"]:
    source[(e["to_node"], e["to_input"])] = (e["from_node"], e["from_output"])
nodes = {n["name"]: n for n in desc["nodes"]}
order, done = [], set()
while len(order) < len(nodes):  # topological order from the edges alone
    ready = [name for name, n in nodes.items() if name not in done
             and all(source[(name, i["name"])][0] in done | {""} for i in n["inputs"])]
    if not ready:
        raise SystemExit(f"pipeline.yaml edges have a cycle among {sorted(set(nodes) - done)}")
    order.append(ready[0])
    done.add(ready[0])

data = np.load(inputs_npz)
results = {}
for seed in sorted({k.split("/")[0] for k in data.files}):
    values = {("", name): data[f"{seed}/{name}"] for name in ("quat", "joints")}
    for name in order:
        node = nodes[name]
        path = os.path.join(folder, node["artifact"])
        feeds = [values[source[(name, i["name"])]] for i in node["inputs"]]
        if node["backend"] == "onnx":
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            got = sess.run([o["name"] for o in node["outputs"]], {i["name"]: f for i, f in zip(node["inputs"], feeds)})
        elif node["backend"] == "pt2":
            module = torch.export.load(path).module()
            with torch.no_grad():
                got = [t.numpy() for t in module(*[torch.from_numpy(f) for f in feeds])]
        else:
            raise SystemExit(f"node {name}: backend {node['backend']} is not run by this check")
        assert len(got) == len(node["outputs"]), (name, len(got))
        for o, value in zip(node["outputs"], got):
            values[(name, o["name"])] = np.asarray(value)
    for o in desc["outputs"]:
        results[f"{seed}/{o['name']}"] = values[(o["node"], o["output"])]
np.savez(out_npz, order=np.array(order), **results)
if os.path.exists("/proc/self/maps"):
    mapped = {line.split()[-1] for line in open("/proc/self/maps") if ".so" in line}
    leapp_libs = sorted(p for p in mapped if "leapp" in os.path.basename(p) or "/leapp/" in p)
    if leapp_libs:
        raise SystemExit(f"leapp's libraries were loaded: {leapp_libs}")
"""


def _export(folder: Path, obs_with: str) -> tuple[Path, go2_pipeline.Go2]:
    robot = go2_pipeline.Go2("cpu", obs_with=obs_with)
    with leapp.trace("go2", save_path=str(folder)) as session:
        for seed in range(3):
            robot.step(*go2_pipeline.random_state(ENVS, "cpu", seed))
    report = session.compile(warp="lower", validate=False)
    for node in ("obs", "action"):
        assert set(report[node].routes.values()) == {"lowered"}, report[node].routes
    return report.path, robot


def _child_env() -> dict:
    """This environment without anything that could put a leapp library in the child's reach."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
    if "LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in env["LD_LIBRARY_PATH"].split(os.pathsep)
                                                 if "leapp" not in p)
    return env


@pytest.mark.parametrize("obs_with", ["pt2", "onnx"])
def test_go2_lowered_runs_node_by_node_without_leapp(tmp_path, obs_with):
    folder, robot = _export(tmp_path / "export", obs_with)
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert [(n["name"], n["backend"]) for n in desc["nodes"]] == [("obs", obs_with), ("policy", "onnx"),
                                                                   ("action", "onnx")]
    for node in desc["nodes"]:
        assert node["segments"] == [], f"{node['name']} still replays a bundle"
        if node["backend"] == "onnx":
            model = onnx.load(str(folder / node["artifact"]))
            onnx.checker.check_model(model, full_check=True)
            assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}, node["name"]
            assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}, node["name"]
    assert [s["id"] for n in desc["nodes"] for s in n.get("lowered_segments", [])] == [
        "obs/warp_segment_0", "action/warp_segment_0"]

    arrays, eager = {}, {}
    for seed in SEEDS:
        quat, joints = go2_pipeline.random_state(ENVS, "cpu", seed)
        arrays[f"{seed}/quat"], arrays[f"{seed}/joints"] = quat.numpy(), joints.numpy()
        with torch.no_grad():
            eager[seed] = robot.step(quat, joints).numpy()
    np.savez(tmp_path / "in.npz", **arrays)
    proc = subprocess.run([sys.executable, "-I", "-c", CHILD, str(folder), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, cwd=tmp_path,
                          env=_child_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    assert list(out["order"]) == ["obs", "policy", "action"]
    for seed in SEEDS:
        got = out[f"{seed}/action"]
        assert got.shape == (ENVS, go2_pipeline.NUM_JOINTS) and got.dtype == np.float32
        np.testing.assert_allclose(got, eager[seed], rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")
        assert np.abs(eager[seed]).max() > 0.01  # the comparison sees a non-trivial action


@cpu_only
def test_go2_example_lowers_every_segment_with_warp_lower(tmp_path):
    """The example's --warp lower: both Warp segments lowered, every node validated, the loaded export equals
    eager (the default, replay, is tests/examples/test_examples.py's)."""
    proc = run_example("go2_pipeline.py", "--out", str(tmp_path), "--envs", "5", "--warp", "lower")
    assert report_statuses(proc.stdout, ["obs", "policy", "action"]) == dict.fromkeys(["obs", "policy", "action"],
                                                                                      "passed")
    for segment in ("obs/warp_segment_0", "action/warp_segment_0"):
        assert f"segment '{segment}': lowered" in proc.stdout, proc.stdout
    assert max_error(proc.stdout, "max |exported - eager| over 5 robots") <= 1e-5
    text = (tmp_path / "go2" / "pipeline.yaml").read_text()
    desc = yaml.safe_load(text)
    assert [n["segments"] for n in desc["nodes"]] == [[], [], []]
    # a lowered segment's sources are recorded relative, as a replayed one's: no path of this checkout
    constants = desc["constants"]
    assert constants and all(line.startswith("obs/warp_segment_0 (") for line in constants), constants
    assert all("(/" not in line for line in constants), constants
    assert str(ROOT) not in text

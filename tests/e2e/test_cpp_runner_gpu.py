"""GPU: the robot example's export runs in the C++ runner (leapp-run --device cuda) and equals leapp.load.

examples/go2_pipeline.py records and exports the README's robot pipeline on cuda:0 (obs: PT2 with three
Warp kernels in one segment; policy: ONNX MLP; action: ONNX with a Warp segment) and checks leapp.load
against eager itself. ``leapp.aoti.package`` then compiles obs into a CUDA AOTInductor package and records
it in pipeline.yaml, and leapp-run runs the whole export on device buffers on one stream: obs from the
package through libleapp_pipeline_aoti.so, policy and action on ONNX Runtime's CUDA EP. Its outputs are
compared with ``leapp.load(..., onnx_ep="cuda")`` (the same execution provider for the ONNX nodes,
use_tf32=0 on both sides) on the same inputs. The controller example (examples/cpp) runs the same
export with --device cuda, and benchmarks/cpp_runner.py prints the latency table for docs/deploy.md.
The C++ runner replays that step as one CUDA graph (docs/deploy.md, "A step as one CUDA graph"): the
controller's steps upload new values into the same buffers, so its last step checks that the graph reads
them, with obs as a PT2 node (its AOTInductor package inside the graph) and with obs exported as ONNX
(every node on ONNX Runtime's CUDA EP), the latter compared with eager.

Needs: an NVIDIA GPU and driver, torch with CUDA, Warp, onnxruntime-gpu (its CUDA EP), cmake for the
example. CPU CI covers the same code paths with the fake driver (tests/runtime/test_cpp_pipeline_aoti.py).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
ENVS = 64


def _needs_cuda_runner() -> None:
    """Skips without what the C++ runner on CUDA needs."""
    import warp as wp

    wp.init()
    if not torch.cuda.is_available() or not wp.is_cuda_available():
        pytest.skip("torch or Warp sees no CUDA device")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(f"this onnxruntime has no CUDA EP ({onnxruntime.get_available_providers()}): install onnxruntime-gpu")
    if not LEAPP_RUN.is_file():
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing at build time)")
    sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(scope="module")
def go2_export(tmp_path_factory) -> Path:
    """exports/go2 of examples/go2_pipeline.py, with obs's package recorded."""
    from leapp.runtime.libraries import native_dir

    if not (native_dir() / "libleapp_pipeline_aoti.so").is_file():
        pytest.skip("libleapp_pipeline_aoti.so was not built (torch was not found when leapp was built)")
    _needs_cuda_runner()
    import go2_pipeline

    out = tmp_path_factory.mktemp("go2")
    assert go2_pipeline.main(["--envs", str(ENVS), "--out", str(out)]) == 0, "the example's own check failed"
    export = out / "go2"
    import leapp.aoti

    start = time.perf_counter()
    package = leapp.aoti.package(export, "obs")
    print(f"\nleapp aoti go2 obs: {time.perf_counter() - start:.1f} s, {package.stat().st_size} bytes")
    return export


@pytest.fixture(scope="module", autouse=True)
def same_onnxruntime():
    """leapp-run, the controller and the benchmark load the onnxruntime this Python imports (the GPU machine
    overlays onnxruntime-gpu on PYTHONPATH; leapp-run alone would find the CPU build next to leapp's package)."""
    from leapp.runtime.libraries import onnxruntime_library

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_ONNXRUNTIME_LIBRARY", str(onnxruntime_library()))
        yield


@pytest.fixture(scope="module")
def go2_onnx(tmp_path_factory):
    """(export, robot): the example's step traced with obs as ONNX too, and the eager robot to compare with."""
    _needs_cuda_runner()
    import go2_pipeline

    import leapp

    robot = go2_pipeline.Go2("cuda:0", obs_with="onnx")
    out = tmp_path_factory.mktemp("go2onnx")
    with leapp.trace("go2", save_path=str(out)) as session:
        for seed in range(3):
            robot.step(*go2_pipeline.random_state(ENVS, "cuda:0", seed))
    session.compile(validate=False)
    return out / "go2", robot


def _inputs(folder: Path, seed: int) -> dict[str, torch.Tensor]:
    import go2_pipeline

    quat, joints = go2_pipeline.random_state(ENVS, "cpu", seed)
    folder.mkdir()
    inputs = {"quat": quat.contiguous(), "joints": joints.contiguous()}
    for name, t in inputs.items():
        (folder / f"{name}.bin").write_bytes(t.numpy().tobytes())
    return inputs


def test_leapp_run_cuda_equals_leapp_load(go2_export, tmp_path):
    from leapp.runtime.pipeline import load

    pipeline = load(go2_export, onnx_ep="cuda")
    assert set(pipeline.inputs) == {"quat", "joints"}, pipeline.inputs
    for seed in (200, 201):  # inputs never seen while tracing
        inputs = _inputs(tmp_path / f"in{seed}", seed)
        r = subprocess.run([str(LEAPP_RUN), str(go2_export), "--in", str(tmp_path / f"in{seed}"), "--out",
                            str(tmp_path / f"out{seed}"), "--device", "cuda", "--time", "50", "--no-graph"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        print(r.stdout)
        assert "(aoti-cuda)" in r.stdout and "(ort-cuda)" in r.stdout, r.stdout  # per-node times: node by node
        with torch.no_grad():
            want = pipeline(**{k: v.cuda() for k, v in inputs.items()})
        for name, expected in want.items():
            got = torch.frombuffer(bytearray((tmp_path / f"out{seed}" / f"{name}.bin").read_bytes()),
                                   dtype=expected.dtype).reshape(expected.shape)
            diff = (got - expected.cpu()).abs().max().item()
            print(f"seed {seed} output '{name}': max |leapp-run - leapp.load| = {diff:.3e}")
            # obs: the same Warp kernels (package vs exported program); policy/action: the CUDA EP on both sides
            torch.testing.assert_close(got, expected.cpu(), rtol=1e-5, atol=1e-6)


def _controller(build: Path, export: Path, dump: Path, steps: int, **env: str) -> subprocess.CompletedProcess:
    import os

    dump.mkdir()
    return subprocess.run([str(build / "controller"), str(export), "--steps", str(steps), "--device", "cuda", "--dump",
                           str(dump)], capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def _check_dump(export: Path, dump: Path) -> None:
    """The controller's last step (its inputs and outputs, dumped) against leapp.load on the same inputs."""
    from leapp.runtime.pipeline import load

    pipeline = load(export, onnx_ep="cuda")
    inputs = {name: torch.frombuffer(bytearray((dump / f"{name}.in.bin").read_bytes()), dtype=spec.dtype)
              .reshape(spec.shape).cuda() for name, spec in pipeline.inputs.items()}
    with torch.no_grad():
        for name, expected in pipeline(**inputs).items():
            got = torch.frombuffer(bytearray((dump / f"{name}.out.bin").read_bytes()), dtype=expected.dtype)
            torch.testing.assert_close(got.reshape(expected.shape), expected.cpu(), rtol=1e-5, atol=1e-6)


def test_controller_example_runs_the_robot_export_on_cuda(go2_export, tmp_path, cmake_build_with_leapp):
    build = cmake_build_with_leapp(ROOT / "examples" / "cpp", tmp_path / "build")
    r = _controller(build, go2_export, tmp_path / "dump", 500)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "500 steps on cuda" in r.stdout and "aoti-cuda" in r.stdout
    # the PT2 node's package is captured too: its allocations go to the graph's own torch pool
    assert "step   one CUDA graph" in r.stdout and "graph captures 1, graph launches 499" in r.stdout, r.stdout
    _check_dump(go2_export, tmp_path / "dump")


def test_controller_graphs_an_all_onnx_step(go2_onnx, tmp_path, cmake_build_with_leapp):
    """Every node on ONNX Runtime's CUDA EP, two replaying Warp segments: step 1 captures, the later steps launch
    the graph on new sensor values, and the last one equals eager. Off by the variable, the same values node by
    node; a bad value is refused at open."""
    export, robot = go2_onnx
    build = cmake_build_with_leapp(ROOT / "examples" / "cpp", tmp_path / "build")
    r = _controller(build, export, tmp_path / "graph", 50)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.count("ort-cuda") == 3 and "step   one CUDA graph" in r.stdout, r.stdout
    assert "graph captures 1, graph launches 49\n" in r.stdout, r.stdout
    _check_dump_eager(robot, tmp_path / "graph")

    r = _controller(build, export, tmp_path / "off", 5, LEAPP_PIPELINE_GRAPH="0")
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "step   turned off by $LEAPP_PIPELINE_GRAPH=0" in r.stdout and "graph captures 0" in r.stdout, r.stdout
    _check_dump_eager(robot, tmp_path / "off")

    r = _controller(build, export, tmp_path / "bad", 5, LEAPP_PIPELINE_GRAPH="yes")
    assert r.returncode == 1 and "$LEAPP_PIPELINE_GRAPH must be 0 or 1, got 'yes'" in r.stderr, r.stdout + r.stderr


_LOAD_STEPS = """
import sys, torch
from leapp.runtime.pipeline import load
pipeline = load(sys.argv[1], onnx_ep="cuda")
quat, joints = torch.load(sys.argv[2])
quat, joints = quat.cuda(), joints.cuda()
with torch.no_grad():
    for _ in range(30):  # the same buffers every step: the plain-call graphs capture and replay
        action = pipeline(quat=quat, joints=joints)["action"]
    for _ in range(30):  # fresh buffers: the copy graphs
        action = pipeline(quat=quat.clone(), joints=joints.clone())["action"]
torch.cuda.synchronize()
torch.save(action.cpu(), sys.argv[3])
g = pipeline.plain_graphs
print("plain-call graphs:", pipeline.plain_graphs_reason if g is None else f"captures {g.captures}, enabled {g.enabled}")
"""


def test_leapp_load_replays_the_all_onnx_step(go2_onnx, tmp_path):
    """leapp.load on the all-ONNX export, 60 steps, in a process of its own: ONNX Runtime's CUDA EP records a
    host function (a pinned-buffer release) in some captures, whose replay aborted the process (cudaFreeHost
    in a callback, CUDA error 800). Such graphs are refused; the step still equals eager."""
    import go2_pipeline

    export, robot = go2_onnx
    quat, joints = go2_pipeline.random_state(ENVS, "cpu", 400)
    torch.save((quat, joints), tmp_path / "in.pt")
    r = subprocess.run([sys.executable, "-c", _LOAD_STEPS, str(export), str(tmp_path / "in.pt"),
                        str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=600)
    print(r.stdout, r.stderr[-3000:])
    assert r.returncode == 0, f"exit {r.returncode}: " + r.stdout + r.stderr[-4000:]
    with torch.no_grad():
        want = robot.step(quat.cuda(), joints.cuda()).cpu()
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), want, rtol=1e-5, atol=1e-5)


def _check_dump_eager(robot, dump: Path) -> None:
    quat = torch.frombuffer(bytearray((dump / "quat.in.bin").read_bytes()), dtype=torch.float32).reshape(ENVS, 4)
    joints = torch.frombuffer(bytearray((dump / "joints.in.bin").read_bytes()), dtype=torch.float32).reshape(ENVS, -1)
    with torch.no_grad():
        want = robot.step(quat.cuda(), joints.cuda()).cpu()
    got = torch.frombuffer(bytearray((dump / "action.out.bin").read_bytes()), dtype=torch.float32)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_leapp_run_times_the_graphed_step(go2_export, tmp_path):
    from leapp.runtime.pipeline import load

    inputs = _inputs(tmp_path / "in", 300)
    r = subprocess.run([str(LEAPP_RUN), str(go2_export), "--in", str(tmp_path / "in"), "--out",
                        str(tmp_path / "out"), "--device", "cuda", "--time", "50"],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "step: one CUDA graph launch from the second run on" in r.stdout, r.stdout
    assert "(cuda-graph)" in r.stdout and "graph captures 1, graph launches 50" in r.stdout, r.stdout
    with torch.no_grad():
        want = load(go2_export, onnx_ep="cuda")(**{k: v.cuda() for k, v in inputs.items()})["action"].cpu()
    got = torch.frombuffer(bytearray((tmp_path / "out" / "action.bin").read_bytes()), dtype=want.dtype)
    torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_benchmark_table(go2_export):
    """benchmarks/cpp_runner.py on the robot export: prints the table docs/deploy.md records (no threshold)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpp_runner.py"), str(go2_export), "--device", "cuda",
                        "--steps", "300"], capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "| whole step |" in r.stdout


def _allocation_tools(tmp_path):
    """benchmarks/step_allocations.py, its host counter, device counter and bare-graph floor, built here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import step_allocations

    try:
        library, device = step_allocations.counter(tmp_path), step_allocations.device_counter(tmp_path)
        step_allocations.cupti_library()
        floor_program = step_allocations.graph_alone(tmp_path)
    except step_allocations.Unavailable as e:
        pytest.skip(str(e))
    return step_allocations, library, device, floor_program


def test_a_step_allocates_no_device_memory(go2_export, tmp_path):
    """After warm-up, leapp-run's CUDA step (PT2 obs through AOTInductor, ONNX nodes on the CUDA EP) makes no
    driver allocation or free, whoever would make it (a CUPTI callback counts every cuMemAlloc*, cuMemCreate,
    cuMemHostAlloc, ... of the process: leapp's, ONNX Runtime's, torch's), graphed or node by node."""
    step_allocations, library, device, _ = _allocation_tools(tmp_path)
    _inputs(tmp_path / "in", 500)
    run = functools.partial(step_allocations.leapp_run_command, go2_export, tmp_path / "in", tmp_path / "out", None,
                            "--device", "cuda")
    counts = {label: step_allocations.per_step_counts(command, library, (50, 550), repeats=2, device=device)
              for label, command in (("graph", run()), ("node by node", run("--no-graph")))}
    print("per step (host allocations, device allocations, device frees):", counts)
    whole = step_allocations._counts(run()(5), library, device)
    assert whole[1] > 0, f"the counter saw no device allocation at all in a whole run: {whole}"  # it can see them
    assert counts["graph"][1:] == (0.0, 0.0) and counts["node by node"][1:] == (0.0, 0.0), counts


def test_the_graphed_step_makes_no_host_allocation(go2_export, tmp_path):
    """After warm-up, leapp-run's step as one CUDA graph makes no host allocation. Each allocation's call stack
    is taken (processes without CUPTI, whose callbacks allocate themselves): those inside libcuda are the
    driver's own, compared with a bare one-node graph's; every other one counts, by call site. The driver's
    own include those of its threads: a graph holding CUDA user objects made one on the H200 at nearly every
    launch, so the pipeline adopts its captures (leapp::adopt_capture) and its graph holds none."""
    step_allocations, library, _, floor_program = _allocation_tools(tmp_path)
    _inputs(tmp_path / "in", 500)
    steps = (50, 550)
    graphed = step_allocations.leapp_run_command(go2_export, tmp_path / "in", tmp_path / "out", None, "--device", "cuda")
    floor_driver, floor_other, _ = step_allocations.per_step_sites(lambda n: [str(floor_program), str(n)], library,
                                                                   steps, cuda=True)
    driver, other, sites = step_allocations.per_step_sites(graphed, library, steps, cuda=True)
    print(f"graphed step: {driver:.3f} host allocations per step inside the driver (a bare graph: {floor_driver:.3f}), "
          f"{other:.3f} elsewhere (a bare graph: {floor_other:.3f}); growing sites: {sites}")
    assert floor_other < 0.5, (floor_other, "the bare graph program allocates nothing itself")
    # one allocation per step would show as at least 1
    assert driver < floor_driver + 0.5, f"{driver:.3f} driver allocations per graphed step, by site: {sites}"
    assert other < 0.5, f"{other:.3f} host allocations per graphed step outside the driver, by site: {sites}"

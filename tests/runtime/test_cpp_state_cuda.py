"""GPU: state in the C++ runner on device buffers (issue 49): leapp-run --device cuda and leapp::Pipeline with
Memory::kDevice carry it as leapp.load on cuda:0 does.

test_cpp_state.py's recurrent export (a GRU cell whose hidden state and last action are state, then a
post-processing node), traced on cuda:0 twice: every node ONNX, and the policy as PT2 with its AOTInductor
package (``leapp.aoti.package``, a small GRU cell: a quick compile). The state buffers then live on the device
and, from a run's second step on, the copies of the updates into them are part of the step's CUDA graph
(docs/deploy.md, "State" and "A step as one CUDA graph"), a path the CPU machine never runs. Each run is
compared with ``leapp.runtime.pipeline.load(..., onnx_ep="cuda")`` (ONNX Runtime's CUDA EP on both sides) on
the same inputs: every step of ``--steps K`` graphed and node by node, the state after ``--time N`` (a graph
launch per run: the state must advance exactly once per step) and after a ``--rate`` loop, and the C++ API's
reset(), reset(map) and state() on device memory, with its graph counts.

Needs: an NVIDIA GPU and driver, torch with CUDA, onnxruntime-gpu (its CUDA EP), leapp-run, cmake for the C++
program; the PT2 variant also libleapp_pipeline_aoti.so. CPU CI runs the same checks on host buffers
(test_cpp_state.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import leapp
import leapp.aoti
from leapp.pipeline_format import read_pipeline
from leapp.runtime.pipeline import load
from leapp.testing.cpp_runner import LeappRunPipeline, leapp_run_device, leapp_run_env, leapp_run_path

from test_cpp_state import ACT, HIDDEN, OBS, STEPS, Cell, _observations, _write_steps, build_program

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

DEVICE = "cuda:0"
STATES = {"policy/h": (1, HIDDEN), "policy/last_action": (1, ACT)}
# ONNX nodes: the CUDA EP on both sides (use_tf32=0). PT2: Inductor's kernels in the package against the exported
# program's eager kernels in leapp.load, a few ulps apart per step.
TOLERANCE = {"onnx": {"rtol": 1e-5, "atol": 1e-6}, "pt2": {"rtol": 1e-5, "atol": 1e-5}}


class DeviceCell(Cell):
    """test_cpp_state's cell (same seeded weights) with the policy node exported as ``backend``."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend


def _needs_cuda_runner(backend: str) -> None:
    """Skips without what leapp-run on device buffers needs for this export."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(f"this onnxruntime has no CUDA EP ({onnxruntime.get_available_providers()}): install onnxruntime-gpu")
    if leapp_run_path() is None:
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing at build time)")
    if backend == "pt2":
        from leapp.runtime.libraries import native_dir

        if not (native_dir() / "libleapp_pipeline_aoti.so").is_file():
            pytest.skip("libleapp_pipeline_aoti.so was not built (torch was not found when leapp was built)")


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def device_export(request, tmp_path_factory) -> tuple[Path, str]:
    """(the export folder, the policy's backend): traced on cuda:0 from a non-zero initial state."""
    backend = request.param
    _needs_cuda_runner(backend)
    cell = DeviceCell(backend).to(DEVICE)
    h = torch.linspace(-1, 1, HIDDEN, device=DEVICE).reshape(1, HIDDEN)
    last = torch.tensor([[0.5, -0.25]], device=DEVICE)
    g = torch.Generator().manual_seed(7)
    out = tmp_path_factory.mktemp(f"state_{backend}")
    with torch.no_grad(), leapp.trace("stateful", save_path=str(out)) as session:
        for _ in range(3):
            h, last = cell.step(torch.randn(1, OBS, generator=g).to(DEVICE), h, last)
    session.compile(validate=False)
    folder = out / "stateful"
    if backend == "pt2":
        leapp.aoti.package(folder, "policy")
    return folder, backend


def _load(folder: Path):
    pipeline = load(folder, onnx_ep="cuda")
    assert list(pipeline.inputs) == ["obs"] and sorted(pipeline.state) == sorted(STATES)
    assert all(t.device.type == "cuda" for t in pipeline.state.values()), pipeline.state
    return pipeline


def _leapp_run(folder: Path, *args) -> subprocess.CompletedProcess:
    r = subprocess.run([str(leapp_run_path()), str(folder), *map(str, args)], capture_output=True, text=True,
                       env=leapp_run_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r


def _floats(path: Path, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(path.read_bytes(), np.float32).copy()).reshape(shape)


def _state_files(out: Path) -> dict[str, torch.Tensor]:
    return {key: _floats(out / "state" / f"{key}.bin", shape) for key, shape in STATES.items()}


def _assert_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], backend: str, what: str) -> None:
    for key in STATES:
        torch.testing.assert_close(got[key], want[key].cpu(), **TOLERANCE[backend], msg=lambda m: f"{what}, {key}: {m}")


def _steps_of_load(pipeline, obs: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The state after each call of ``obs`` in order, from the pipeline's current state (index 0: before any)."""
    states = [{k: v.cpu() for k, v in pipeline.state.items()}]
    with torch.no_grad():
        for o in obs:
            pipeline(obs=o.to(DEVICE))
            states.append({k: v.cpu() for k, v in pipeline.state.items()})
    return states


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], backend: str) -> bool:
    return any(not torch.allclose(a[k], b[k], **TOLERANCE[backend]) for k in STATES)


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "no-graph"])
def test_steps_on_device_equal_leapp_load(device_export, tmp_path, graph):
    """--steps K with --device cuda (what leapp.testing's cpp-runner route passes for a CUDA export): each step's
    outputs equal leapp.load's, and OUT_DIR/state its state after the last. Graphed, steps 2.. are the step's
    CUDA graph (captured at step 2, launched after) with the state copies inside; --no-graph: node by node."""
    folder, backend = device_export
    _, desc = read_pipeline(folder)
    assert leapp_run_device(desc) == "cuda", [n["device"] for n in desc["nodes"]]
    obs = _observations(STEPS)
    _write_steps(tmp_path / "in", obs)
    _leapp_run(folder, "--in", tmp_path / "in", "--out", tmp_path / "out", "--device", "cuda", "--steps", STEPS,
               *([] if graph else ["--no-graph"]))
    pipeline = _load(folder)
    with torch.no_grad():
        want = [pipeline(obs=obs[k].to(DEVICE))["command"].cpu() for k in range(STEPS)]
    got = _floats(tmp_path / "out" / "command.bin", (STEPS, 1, ACT))
    for k in range(STEPS):
        torch.testing.assert_close(got[k], want[k], **TOLERANCE[backend], msg=lambda m: f"step {k + 1}: {m}")
    assert all(not torch.allclose(got[k], got[k + 1]) for k in range(STEPS - 1)), got
    _assert_state(_state_files(tmp_path / "out"), pipeline.state, backend, f"state after {STEPS} steps")
    # without the carried state the second step would be the first one's from the initial values
    pipeline.reset()
    with torch.no_grad():
        assert not torch.allclose(pipeline(obs=obs[1].to(DEVICE))["command"].cpu(), got[1], **TOLERANCE[backend])


def test_cpp_runner_route_runs_a_sequence_on_device(device_export):
    """leapp.testing's cpp-runner route (LeappRunPipeline.run_steps: one leapp-run --steps K process, --device
    as leapp_run_device picks it) on cuda inputs: each step equals leapp.load's and comes back on cuda."""
    folder, backend = device_export
    _, desc = read_pipeline(folder)
    runner = LeappRunPipeline(folder, desc)
    assert runner.device == "cuda"
    obs = [o.to(DEVICE) for o in _observations(4, seed=5)]
    got = runner.run_steps([{"obs": o} for o in obs])
    pipeline = _load(folder)
    with torch.no_grad():
        for k, o in enumerate(obs):
            want = pipeline(obs=o)["command"]
            assert got[k]["command"].device.type == "cuda"
            torch.testing.assert_close(got[k]["command"], want, **TOLERANCE[backend], msg=lambda m: f"step {k + 1}: {m}")


def test_time_runs_of_the_graphed_step_advance_the_state_once_each(device_export, tmp_path):
    """--steps 2 --time N on device: step 1 runs node by node, step 2 captures the step's graph and launches it,
    the N timed runs launch it. The state written after them is leapp.load's after 2 + N calls: not one call
    fewer or more (a capture that also ran the step, or a launch that skipped the copies, would show)."""
    folder, backend = device_export
    n = 5
    obs = _observations(2, seed=2)
    _write_steps(tmp_path / "in", obs)
    r = _leapp_run(folder, "--in", tmp_path / "in", "--out", tmp_path / "t", "--device", "cuda", "--steps", 2,
                   "--time", n)
    assert "step: one CUDA graph launch from the second run on" in r.stdout, r.stdout
    assert "(cuda-graph)" in r.stdout and f"graph captures 1, graph launches {n + 1}\n" in r.stdout, r.stdout
    states = _steps_of_load(_load(folder), [obs[0]] + [obs[1]] * (n + 2))
    got = _state_files(tmp_path / "t")
    _assert_state(got, states[2 + n], backend, f"state after --steps 2 --time {n}")
    for other in (1 + n, 3 + n):  # the test tells one step more or less apart
        assert _differs(states[other], states[2 + n], backend), other

    r = _leapp_run(folder, "--in", tmp_path / "in", "--out", tmp_path / "plain", "--device", "cuda", "--steps", 2,
                   "--time", n, "--no-graph")
    assert "(ort-cuda)" in r.stdout and "cuda-graph" not in r.stdout, r.stdout
    _assert_state(_state_files(tmp_path / "plain"), states[2 + n], backend, f"node by node, --time {n}")


def test_rate_loop_on_device_carries_the_state(device_export, tmp_path):
    """--rate HZ on device: the activation step captures the graph, the loop launches it; the state after them
    is leapp.load's after as many calls."""
    folder, backend = device_export
    obs = _observations(2, seed=3)
    _write_steps(tmp_path / "in", obs)
    r = _leapp_run(folder, "--in", tmp_path / "in", "--out", tmp_path / "r", "--device", "cuda", "--steps", 2,
                   "--rate", 200, "--duration", 0.05)
    assert "step: one CUDA graph launch from the second run on" in r.stdout, r.stdout
    loop_steps = int(re.search(r"': (\d+) steps at 200 Hz on cuda", r.stdout).group(1))
    states = _steps_of_load(_load(folder), [obs[0]] + [obs[1]] * (1 + 1 + loop_steps))  # steps, activation, loop
    _assert_state(_state_files(tmp_path / "r"), states[-1], backend, f"state after a {loop_steps}-step loop")


_PROGRAM = r"""
#include <leapp/pipeline.h>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

static std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
static void dump(const std::string& path, const std::vector<char>& data) {
  std::ofstream(path, std::ios::binary).write(data.data(), std::streamsize(data.size()));
}

int main(int, char** argv) {
  leapp::PipelineOptions options;
  options.memory = leapp::Memory::kDevice;  // device buffers: the state's too, and a step as one CUDA graph
  auto p = leapp::Pipeline::open(argv[1], options);
  const std::string out = argv[3];
  const leapp::TensorInfo &in = p->inputs()[0], &res = p->outputs()[0];
  const std::vector<char> obs = slurp(argv[2]);
  const size_t step_bytes = in.byte_size(), steps = obs.size() / step_bytes;
  std::shared_ptr<void> d_obs = p->allocate(step_bytes), d_res = p->allocate(res.byte_size());
  auto fetch = [&](const void* buffer, size_t bytes) {  // device -> host, waited for
    std::vector<char> host(bytes);
    p->download(host.data(), buffer, bytes);
    p->synchronize();
    return host;
  };
  auto episode = [&](const std::string& name) {
    std::vector<char> all;
    for (size_t k = 0; k < steps; ++k) {  // new values into the same buffers: the graph's
      p->upload(d_obs.get(), obs.data() + k * step_bytes, step_bytes);
      p->run({{in.name, d_obs.get()}}, {{res.name, d_res.get()}});
      const std::vector<char> r = fetch(d_res.get(), res.byte_size());
      all.insert(all.end(), r.begin(), r.end());
    }
    dump(out + "/" + name, all);
  };
  for (const leapp::StateInfo& s : p->state_infos())
    std::printf("state %s node=%s input=%s output=%s %s %zu\n", s.name.c_str(), s.node.c_str(), s.input.c_str(),
                s.output.c_str(), s.dtype.c_str(), s.byte_size());
  const leapp::StateInfo &h = p->state_infos()[0], &last = p->state_infos()[1];
  const void* h_buffer = p->state(h.name);
  episode("first.bin");
  dump(out + "/h_after.bin", fetch(p->state(h.name), h.byte_size()));
  dump(out + "/last_after.bin", fetch(p->state(last.name), last.byte_size()));
  p->reset();
  dump(out + "/h_reset.bin", fetch(p->state(h.name), h.byte_size()));
  dump(out + "/last_reset.bin", fetch(p->state(last.name), last.byte_size()));
  episode("again.bin");
  const std::vector<char> zeros(h.byte_size(), 0);
  std::shared_ptr<void> d_zeros = p->allocate(h.byte_size());
  p->upload(d_zeros.get(), zeros.data(), zeros.size());
  const std::vector<char> last_before = fetch(p->state(last.name), last.byte_size());
  p->reset({{h.name, d_zeros.get()}});  // h only, from a device buffer: last_action keeps its value
  std::printf("h zeroed %d, last_action kept %d\n", int(fetch(p->state(h.name), h.byte_size()) == zeros),
              int(fetch(p->state(last.name), last.byte_size()) == last_before));
  episode("from_zero_h.bin");
  const std::vector<char> before = fetch(p->state(h.name), h.byte_size());
  try {
    p->run({}, {{res.name, d_res.get()}});
  } catch (const leapp::PipelineError& e) {
    std::printf("refused run: %s\n", e.what());
  }
  std::printf("unchanged %d\n", int(before == fetch(p->state(h.name), h.byte_size())));
  try {
    p->reset({{h.name, d_zeros.get()}, {"nope", d_zeros.get()}});
  } catch (const leapp::PipelineError& e) {
    std::printf("refused reset: %s\n", e.what());
  }
  std::printf("h kept %d, same buffer %d\n", int(before == fetch(p->state(h.name), h.byte_size())),
              int(p->state(h.name) == h_buffer));
  std::printf("graphs: captures %lld, launches %lld, reason '%s'\n", static_cast<long long>(p->graph_captures()),
              static_cast<long long>(p->graph_replays()), p->graph_reason().c_str());
  return 0;
}
"""


def test_cpp_api_on_device_memory_carries_resets_and_reads_the_state(device_export, tmp_path, cmake_build_with_leapp):
    """leapp::Pipeline with Memory::kDevice: the state buffers are device memory; run() carries them through the
    step's graph (one capture for the whole program: reset() and reset(map) write into the same buffers, no new
    capture); reset() restores the initial values, reset(map) sets h from a device buffer and keeps last_action,
    state() reads them; a refused run or reset changes nothing. Every episode equals leapp.load's."""
    folder, backend = device_export
    build = build_program("use_state_cuda", _PROGRAM, tmp_path, cmake_build_with_leapp)
    steps = 4
    obs = _observations(steps, seed=3)
    (tmp_path / "obs.bin").write_bytes(obs.numpy().tobytes())
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(build / "use_state_cuda"), str(folder), str(tmp_path / "obs.bin"), str(out)],
                       capture_output=True, text=True, env=leapp_run_env(), timeout=300)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert f"state policy/h node=policy input=h output=h_out float32 {HIDDEN * 4}" in r.stdout
    assert f"state policy/last_action node=policy input=last_action output=last_action_out float32 {ACT * 4}" in r.stdout
    # 3 episodes of 4 steps on the same buffers: step 1 node by node, step 2 captures and launches, the rest launch
    assert f"graphs: captures 1, launches {3 * steps - 1}, reason ''" in r.stdout, r.stdout
    assert "h zeroed 1, last_action kept 1" in r.stdout and "unchanged 1" in r.stdout, r.stdout
    assert "h kept 1, same buffer 1" in r.stdout, r.stdout
    assert "refused run: Pipeline 'stateful': inputs missing ['obs']; expected ['obs']" in r.stdout, r.stdout
    assert ("refused reset: Pipeline 'stateful': reset(state): 'nope' is no state of the pipeline (states: "
            "['policy/h', 'policy/last_action'])") in r.stdout, r.stdout

    pipeline = _load(folder)
    initial = {k: v.cpu() for k, v in pipeline.state.items()}
    torch.testing.assert_close(initial["policy/h"], torch.linspace(-1, 1, HIDDEN).reshape(1, HIDDEN))  # not zero

    def episode() -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([pipeline(obs=o.to(DEVICE))["command"].cpu() for o in obs])

    tol = TOLERANCE[backend]
    first = episode()
    torch.testing.assert_close(_floats(out / "first.bin", first.shape), first, **tol)
    torch.testing.assert_close(_floats(out / "h_after.bin", (1, HIDDEN)), pipeline.state["policy/h"].cpu(), **tol)
    torch.testing.assert_close(_floats(out / "last_after.bin", (1, ACT)), pipeline.state["policy/last_action"].cpu(),
                               **tol)
    # reset(): the initial values exactly (copied from initial_values.safetensors)
    assert (out / "h_reset.bin").read_bytes() == initial["policy/h"].numpy().tobytes()
    assert (out / "last_reset.bin").read_bytes() == initial["policy/last_action"].numpy().tobytes()
    torch.testing.assert_close(_floats(out / "again.bin", first.shape), first, **tol)
    pipeline.reset({"policy/h": torch.zeros(1, HIDDEN, device=DEVICE)})
    from_zero = episode()
    assert not torch.allclose(from_zero, first, **tol)  # h mattered
    torch.testing.assert_close(_floats(out / "from_zero_h.bin", first.shape), from_zero, **tol)

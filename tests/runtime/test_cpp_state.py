"""State in the C++ runner (issue 49): leapp-run and leapp::Pipeline carry it as leapp.load does, on the CPU.

One real export through leapp's public API: a recurrent policy (a GRU cell whose hidden state and last action are
state, annotate.state_tensors / update_state) and a post-processing node, both ONNX. Its initial state is not zero,
so a reset is visible. leapp-run over K steps (--steps) must equal leapp.load stepping the same inputs bit for bit,
--time and --rate runs must carry the state too, the C++ API's reset()/state() must behave as Pipeline.reset and
Pipeline.state, and both readers must refuse bad state wiring and hostile initial values with one text.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import struct
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import leapp
from leapp import annotate
from leapp.pipeline_format import (PipelineError, check_initial_values, read_pipeline, sha256_file, state_edges)

from test_cpp_pipeline import LEAPP_RUN, _leapp_run, _python_text, _replacements_refused_alike, _write_both

pytestmark = pytest.mark.skipif(
    not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's headers are missing "
    "(bash scripts/fetch-ort-headers.sh, then pip install -e . again)")

OBS, HIDDEN, ACT = 3, 6, 2
STEPS = 6


class Cell(torch.nn.Module):
    """A GRU cell and a head that also reads the last action."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell = torch.nn.GRUCell(OBS + ACT, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, ACT)

    backend = "onnx"  # the policy node's (test_cpp_state_cuda exports it as PT2 too)

    def step(self, obs, h, last):
        with leapp.node("policy", export_with=self.backend):
            obs = annotate.input_tensors("policy", {"obs": obs})
            h, last = annotate.state_tensors("policy", {"h": h, "last_action": last})
            h = self.cell(torch.cat([obs, last], -1), h)
            action = torch.tanh(self.head(h))
            h, action = annotate.update_state("policy", {"h": h, "last_action": action})
            annotate.output_tensors("policy", {"action": action})
        with leapp.node("post", export_with="onnx"):
            action = annotate.input_tensors("post", {"action": action})
            annotate.output_tensors("post", {"command": action * 0.5 + 0.1})
        return h, action


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    cell = Cell()
    h, last = torch.linspace(-1, 1, HIDDEN).reshape(1, HIDDEN), torch.tensor([[0.5, -0.25]])  # the initial state
    g = torch.Generator().manual_seed(7)
    out = tmp_path_factory.mktemp("state")
    with torch.no_grad(), leapp.trace("stateful", save_path=str(out)) as session:
        for _ in range(3):
            h, last = cell.step(torch.randn(1, OBS, generator=g), h, last)
    session.compile(validate=False)
    return out / "stateful"


@pytest.fixture
def folder(export, tmp_path) -> Path:
    """A private copy to tamper with."""
    return Path(shutil.copytree(export, tmp_path / "stateful"))


def _observations(steps: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(steps, 1, OBS, generator=torch.Generator().manual_seed(seed))


def _write_steps(folder: Path, obs: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "obs.bin").write_bytes(obs.numpy().tobytes())


def _state_files(out: Path) -> dict[str, bytes]:
    return {f"{p.parent.name}/{p.stem}": p.read_bytes() for p in (out / "state").glob("*/*.bin")}


def _bytes(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: v.contiguous().numpy().tobytes() for k, v in state.items()}


def test_steps_equal_leapp_load_and_the_state_is_written(export, tmp_path):
    """--steps K: each step's outputs equal leapp.load's step by step, bit for bit, and OUT_DIR/state holds the
    state after the last step, equal to Pipeline.state."""
    obs = _observations(STEPS)
    _write_steps(tmp_path / "in", obs)
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--steps", STEPS)
    assert r.returncode == 0, r.stderr
    pipeline = leapp.load(export)
    assert list(pipeline.inputs) == ["obs"]  # the state inputs are the pipeline's own
    expected = [pipeline(obs=obs[k]) for k in range(STEPS)]
    got = np.frombuffer((tmp_path / "out" / "command.bin").read_bytes(), np.float32).reshape(STEPS, 1, ACT)
    for k in range(STEPS):
        assert got[k].tobytes() == expected[k]["command"].numpy().tobytes(), k
    assert len({got[k].tobytes() for k in range(STEPS)}) == STEPS
    assert _state_files(tmp_path / "out") == _bytes(pipeline.state)
    # without the carried state every step would be the first one's from the initial values
    pipeline.reset()
    assert pipeline(obs=obs[1])["command"].numpy().tobytes() != got[1].tobytes()


def test_time_and_rate_runs_carry_the_state(export, tmp_path):
    """--time N and --rate HZ steps are steps too: the state after them is leapp.load's after as many calls."""
    obs = _observations(2, seed=2)
    _write_steps(tmp_path / "in", obs)
    pipeline = leapp.load(export)
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "t", "--steps", 2, "--time", 3)
    assert r.returncode == 0, r.stderr
    for k in (0, 1, 1, 1, 1):
        pipeline(obs=obs[k])
    assert _state_files(tmp_path / "t") == _bytes(pipeline.state)

    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "r", "--steps", 2, "--rate", 200,
                   "--duration", 0.02)
    assert r.returncode == 0, r.stderr
    loop_steps = int(re.search(r"': (\d+) steps at 200 Hz", r.stdout).group(1))
    pipeline.reset()
    for k in [0] + [1] * (1 + 1 + loop_steps):  # the steps, the activation step, the loop
        pipeline(obs=obs[k])
    assert _state_files(tmp_path / "r") == _bytes(pipeline.state)


def test_describe_lists_the_state(export):
    r = _leapp_run(export, "--describe")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"state policy/h <- policy/h_out float32[1, {HIDDEN}] {{}}" in lines
    assert f"state policy/last_action <- policy/last_action_out float32[1, {ACT}] {{}}" in lines
    assert [line for line in lines if line.startswith("input ")] == [f"input obs float32[1, {OBS}] {{}}"]


_PROGRAM = r"""
#include <leapp/pipeline.h>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
static void dump(const std::string& path, const void* data, size_t n) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), std::streamsize(n));
}

int main(int, char** argv) {
  auto p = leapp::Pipeline::open(argv[1]);
  const std::string out = argv[3];
  std::vector<char> obs = slurp(argv[2]), command(p->outputs()[0].byte_size()), all;
  const size_t step_bytes = p->inputs()[0].byte_size(), steps = obs.size() / step_bytes;
  for (const leapp::StateInfo& s : p->state_infos())
    std::printf("state %s node=%s input=%s output=%s %s %zu\n", s.name.c_str(), s.node.c_str(), s.input.c_str(),
                s.output.c_str(), s.dtype.c_str(), s.byte_size());
  auto episode = [&](const std::string& name) {
    all.clear();
    for (size_t k = 0; k < steps; ++k) {
      p->run({{"obs", obs.data() + k * step_bytes}}, {{"command", command.data()}});
      all.insert(all.end(), command.begin(), command.end());
    }
    dump(out + "/" + name, all.data(), all.size());
  };
  episode("first.bin");
  const leapp::StateInfo& h = p->state_infos()[0];
  dump(out + "/h_after.bin", p->state(h.name), h.byte_size());
  p->reset();
  dump(out + "/h_reset.bin", p->state(h.name), h.byte_size());
  episode("again.bin");
  std::vector<float> zeros(h.byte_size() / sizeof(float), 0.0f);
  p->reset({{h.name, zeros.data()}});  // h only: last_action keeps its value
  episode("from_zero_h.bin");
  std::vector<char> before(static_cast<const char*>(p->state(h.name)),
                           static_cast<const char*>(p->state(h.name)) + h.byte_size());
  try {
    p->run({}, {{"command", command.data()}});
  } catch (const leapp::PipelineError& e) {
    std::printf("refused run: %s\n", e.what());
  }
  std::printf("unchanged %d\n", int(before == std::vector<char>(static_cast<const char*>(p->state(h.name)),
                                                                 static_cast<const char*>(p->state(h.name)) + h.byte_size())));
  try {
    p->state("policy/nope");
  } catch (const leapp::PipelineError& e) {
    std::printf("refused state: %s\n", e.what());
  }
  try {
    p->reset({{h.name, zeros.data()}, {"nope", zeros.data()}});
  } catch (const leapp::PipelineError& e) {
    std::printf("refused reset: %s\n", e.what());
  }
  std::printf("h kept %d\n", int(before == std::vector<char>(static_cast<const char*>(p->state(h.name)),
                                                             static_cast<const char*>(p->state(h.name)) + h.byte_size())));
  return 0;
}
"""


def build_program(name: str, program: str, tmp_path: Path, cmake_build_with_leapp) -> Path:
    """Builds ``program`` (main.cpp) as executable ``name`` against leapp::pipeline; returns its build folder."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.18)
        project({name} CXX)
        find_package(leapp 0.1 REQUIRED)
        add_executable({name} main.cpp)
        target_compile_features({name} PRIVATE cxx_std_17)
        target_link_libraries({name} PRIVATE leapp::pipeline)
        set_target_properties({name} PROPERTIES BUILD_RPATH "$<TARGET_FILE_DIR:leapp::pipeline>")
        """))
    (src / "main.cpp").write_text(program)
    return cmake_build_with_leapp(src, tmp_path / "build")


def test_cpp_api_carries_resets_and_reads_the_state(export, tmp_path, cmake_build_with_leapp):
    """leapp::Pipeline: run() takes the external inputs only; reset() restores the initial values, reset(map) sets
    some states, state(name) reads one; a refused run or reset leaves the state as it was; all as leapp.load."""
    build = build_program("use_state", _PROGRAM, tmp_path, cmake_build_with_leapp)
    obs = _observations(4, seed=3)
    (tmp_path / "obs.bin").write_bytes(obs.numpy().tobytes())
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(build / "use_state"), str(export), str(tmp_path / "obs.bin"), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"state policy/h node=policy input=h output=h_out float32 {HIDDEN * 4}" in r.stdout
    assert f"state policy/last_action node=policy input=last_action output=last_action_out float32 {ACT * 4}" in r.stdout

    pipeline = leapp.load(export)
    initial = _bytes(pipeline.state)
    first = b"".join(pipeline(obs=o)["command"].numpy().tobytes() for o in obs)
    assert (out / "first.bin").read_bytes() == first
    assert (out / "h_after.bin").read_bytes() == _bytes(pipeline.state)["policy/h"]
    assert (out / "h_reset.bin").read_bytes() == initial["policy/h"]
    assert (out / "again.bin").read_bytes() == first
    pipeline.reset({"policy/h": torch.zeros(1, HIDDEN)})
    assert (out / "from_zero_h.bin").read_bytes() == b"".join(pipeline(obs=o)["command"].numpy().tobytes() for o in obs)
    assert "refused run: Pipeline 'stateful': inputs missing ['obs']; expected ['obs']" in r.stdout
    assert "unchanged 1" in r.stdout and "h kept 1" in r.stdout
    assert ("refused state: Pipeline 'stateful': state(name): 'policy/nope' is no state of the pipeline (states: "
            "['policy/h', 'policy/last_action'])") in r.stdout
    with pytest.raises(PipelineError) as python:
        pipeline.reset({"nope": torch.zeros(1)})
    assert f"refused reset: {python.value}" in r.stdout


_THREADS_PROGRAM = r"""
#include <leapp/pipeline.h>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

int main(int, char** argv) {
  auto p = leapp::Pipeline::open(argv[1]);
  std::ifstream f(argv[2], std::ios::binary);
  const std::vector<char> obs((std::istreambuf_iterator<char>(f)), {});
  const int threads = std::stoi(argv[4]), runs = std::stoi(argv[5]);
  const size_t bytes = p->outputs()[0].byte_size();
  std::vector<std::vector<char>> got(threads, std::vector<char>(bytes * runs));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {  // every thread steps the one pipeline, each into its own buffers
      std::vector<char> command(bytes);
      for (int k = 0; k < runs; ++k) {
        p->run({{"obs", obs.data()}}, {{"command", command.data()}});
        std::copy(command.begin(), command.end(), got[t].begin() + k * bytes);
      }
    });
  for (auto& t : pool) t.join();
  std::ofstream all(std::string(argv[3]) + "/commands.bin", std::ios::binary);
  for (const auto& g : got) all.write(g.data(), std::streamsize(g.size()));
  const leapp::StateInfo& h = p->state_infos()[0];
  std::ofstream(std::string(argv[3]) + "/h.bin", std::ios::binary)
      .write(static_cast<const char*>(p->state(h.name)), std::streamsize(h.byte_size()));
  return 0;
}
"""


def test_cpp_pipeline_called_from_threads_runs_one_step_at_a_time(export, tmp_path, cmake_build_with_leapp):
    """Four threads step one leapp::Pipeline at once, on one observation: each step runs whole (the lock), so the
    commands they got are the commands of that many steps in a row, and the state is the state after them all."""
    threads, runs = 4, 40
    build = build_program("threads", _THREADS_PROGRAM, tmp_path, cmake_build_with_leapp)
    obs = _observations(1, seed=5)[0]
    (tmp_path / "obs.bin").write_bytes(obs.numpy().tobytes())
    r = subprocess.run([str(build / "threads"), str(export), str(tmp_path / "obs.bin"), str(tmp_path), str(threads),
                        str(runs)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pipeline = leapp.load(export)
    steps = [pipeline(obs=obs)["command"].numpy().tobytes() for _ in range(threads * runs)]
    data = (tmp_path / "commands.bin").read_bytes()
    got = [data[i:i + len(steps[0])] for i in range(0, len(data), len(steps[0]))]
    assert len(set(steps)) > threads  # the state moves the command: an interleaved step would show
    assert sorted(got) == sorted(steps)
    assert (tmp_path / "h.bin").read_bytes() == _bytes(pipeline.state)["policy/h"]


# ---- refusals: both readers, one text ----


def _refusals(folder: Path) -> tuple[str | None, str | None]:
    """(leapp.load's text, pipeline.yaml named as pipeline.json; leapp-run --check's), None where one accepts."""
    try:
        leapp.load(folder)
        python = None
    except PipelineError as e:
        python = _python_text(e, folder)
    r = _leapp_run(folder, "--check")
    assert r.returncode in (0, 1), r.stderr
    return python, r.stderr.strip().removeprefix("leapp-run: ") if r.returncode else None


def _wiring_edits(desc: dict):
    def edit(fn):
        d = copy.deepcopy(desc)
        fn(d)
        return d
    state = next(i for i, e in enumerate(desc["edges"]) if e.get("state"))
    yield "state without feedback", edit(lambda d: d["edges"][state].pop("feedback"))
    yield "state across nodes", edit(lambda d: d["edges"][state].update(to_node="post", to_input="action",
                                                                        from_output="last_action_out"))
    yield "state update as output", edit(lambda d: d["outputs"].append(
        {"name": "h_out", "node": "policy", "output": "h_out", "dtype": "float32", "shape": [1, HIDDEN]}))
    yield "no initial values", edit(lambda d: d.pop("initial_values"))
    yield "initial values without state", edit(lambda d: [e.pop("state", None) for e in d["edges"]] and d["inputs"].extend(
        {"name": e["to_input"], "dtype": "float32", "shape": [1, HIDDEN if e["to_input"] == "h" else ACT],
         "consumers": [{"node": "policy", "input": e["to_input"]}]} for e in d["edges"] if e.get("feedback")))
    yield "state input also a pipeline input", edit(lambda d: d["inputs"].append(
        {"name": "h", "dtype": "float32", "shape": [1, HIDDEN], "consumers": [{"node": "policy", "input": "h"}]}))
    yield "initial values outside", edit(lambda d: d["initial_values"].update(path="../initial_values.safetensors"))
    yield "initial values missing", edit(lambda d: d["initial_values"].update(path="gone.safetensors"))


def test_state_wiring_refused_with_leapp_loads_text(export, tmp_path):
    _, desc = read_pipeline(export)
    for what, bad in _wiring_edits(desc):
        folder = Path(shutil.copytree(export, tmp_path / what.replace(" ", "_")))
        _write_both(folder, bad)
        python, cpp = _refusals(folder)
        assert python is not None and cpp == python, (what, cpp, python)


def _safetensors(header: dict | list | bytes, data: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _parts(export: Path) -> tuple[dict, bytes]:
    blob = (export / "initial_values.safetensors").read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _hostile(header: dict, data: bytes):
    """Named hostile initial_values.safetensors contents."""
    def edit(fn, tail=data):
        h = copy.deepcopy(header)
        fn(h)
        return _safetensors(h, tail)
    h_entry = header["policy/h"]
    yield "wrong dtype", edit(lambda h: h["policy/h"].update(dtype="F64"))
    yield "dtype not a string", edit(lambda h: h["policy/h"].update(dtype=[1]))
    yield "wrong shape", edit(lambda h: h["policy/h"].update(shape=[HIDDEN, 1]))
    yield "float dimension", edit(lambda h: h["policy/h"].update(shape=[1.0, HIDDEN]))
    yield "missing key", edit(lambda h: h.pop("policy/h"))
    yield "extra key", edit(lambda h: h.update(other=h_entry))
    yield "extra field", edit(lambda h: h["policy/h"].update(extra=1))
    yield "entry not an object", edit(lambda h: h.update({"policy/h": [1, 2]}))
    yield "metadata not strings", edit(lambda h: h.update(__metadata__={"a": 1}))
    yield "offsets reversed", edit(lambda h: h["policy/h"].update(data_offsets=h_entry["data_offsets"][::-1]))
    yield "offsets one value", edit(lambda h: h["policy/h"].update(data_offsets=[0]))
    yield "offsets negative", edit(lambda h: h["policy/h"].update(data_offsets=[-4, h_entry["data_offsets"][1]]))
    yield "offsets a bool", edit(lambda h: h["policy/h"].update(data_offsets=[False, h_entry["data_offsets"][1]]))
    yield "offsets wrong size", edit(lambda h: h["policy/h"].update(data_offsets=[0, 4]))
    yield "offsets beyond 64 bits", edit(lambda h: h["policy/h"].update(
        data_offsets=[2**70, 2**70 + HIDDEN * 4]))
    yield "offsets overlap", edit(lambda h: [e.update(data_offsets=[0, e["data_offsets"][1] - e["data_offsets"][0]])
                                            for k, e in h.items() if k != "__metadata__"])
    yield "offsets gap", edit(lambda h: [e.update(data_offsets=[o + 4 for o in e["data_offsets"]])
                                        for k, e in h.items() if k != "__metadata__"], data + b"\0" * 4)
    yield "trailing bytes", edit(lambda h: None, data + b"\0" * 8)
    yield "short data", edit(lambda h: None, data[:-4])
    yield "header a list", _safetensors([1], data)
    yield "header length huge", _safetensors(header, data, length=2**40)
    yield "header past the end", _safetensors(header, data, length=len(json.dumps(header)) + len(data) + 1)
    yield "too short", b"\1\0\0\0"
    yield "empty", b""


def _with_initial_values(folder: Path, blob: bytes) -> None:
    """``blob`` as the export's initial values, its digest recorded in pipeline.yaml and its twin."""
    (folder / "initial_values.safetensors").write_bytes(blob)
    _, desc = read_pipeline(folder)
    desc["initial_values"]["sha256"] = sha256_file(folder / "initial_values.safetensors")
    _write_both(folder, desc)


def test_hostile_initial_values_refused_with_leapp_loads_text(folder):
    with open(folder / "initial_values.safetensors", "ab") as f:  # changed after export: the digest says so
        f.write(b"\0")
    python, cpp = _refusals(folder)
    assert python is not None and "has sha256" in python and cpp == python
    header, data = _parts(folder)
    for what, blob in _hostile(header, data[:-1]):
        _with_initial_values(folder, blob)
        python, cpp = _refusals(folder)
        assert python is not None and cpp == python, (what, cpp, python)
        assert str(folder.resolve() / "initial_values.safetensors") in cpp, (what, cpp)


def test_initial_values_header_json_refused_by_both(folder):
    """Not strict JSON (a duplicate key, NaN, bad UTF-8): both refuse naming the file's header; the JSON parsers'
    own wording differs between the languages."""
    header, data = _parts(folder)
    text = json.dumps(header)
    for raw in (text[:-1] + ', "policy/h": {}}', text.replace('"F32"', "NaN", 1), b"\xff" + text.encode()[1:]):
        _with_initial_values(folder, _safetensors(raw if isinstance(raw, bytes) else raw.encode(), data))
        python, cpp = _refusals(folder)
        prefix = f"{(folder / 'initial_values.safetensors').resolve()}: header"
        assert python is not None and cpp is not None and python.startswith(prefix) and cpp.startswith(prefix), (
            raw, python, cpp)


_POOL = [None, True, False, 0, -1, 4, 24, 2**63, 2**80, 4.0, "", "F32", "F64", "I64", [], [0], [0, 24], [1, 6],
         [24, 32], [1, 2**64], {}, {"a": "b"}]


def test_random_header_edits_refused_alike(folder):
    """Seeded replacements (or removals) of any value in the header: Python's check and the C++ reader accept
    alike, or refuse with one text."""
    header, data = _parts(folder)
    _, desc = read_pipeline(folder)
    edges = state_edges(desc)
    path = folder.resolve() / "initial_values.safetensors"

    def paths(value, prefix=()):
        yield prefix
        if isinstance(value, dict):
            for k, v in value.items():
                yield from paths(v, (*prefix, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from paths(v, (*prefix, i))

    every = [p for p in paths(header) if p]
    rng = random.Random(49)
    refused = 0
    for case in range(40):
        bad = copy.deepcopy(header)
        at = rng.choice(every)
        parent = bad
        for part in at[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and rng.random() < 0.25:
            del parent[at[-1]]
        else:
            parent[at[-1]] = copy.deepcopy(rng.choice(_POOL))
        blob = _safetensors(bad, data)
        try:
            check_initial_values(blob, str(path), edges)
            python = None
        except PipelineError as e:
            python = str(e)
        _with_initial_values(folder, blob)
        r = _leapp_run(folder, "--check")
        cpp = r.stderr.strip().removeprefix("leapp-run: ") if r.returncode else None
        assert r.returncode in (0, 1) and cpp == python, (case, at, cpp, python)
        refused += python is not None
    assert refused >= 20  # the cases mostly break something


_WIRING_POOL = [None, True, False, 0, "", "policy", "post", "h", "h_out", "last_action_out", "action",
                "initial_values.safetensors", "../x", "a" * 64, [], {}, {"path": "x"}]


def test_random_state_wiring_edits_refused_alike(export, tmp_path):
    """Seeded replacements (or removals) of any value of the edges, outputs and initial_values of an export with
    state: both readers accept, or both refuse with one text (leapp.load decides where the wiring passes)."""
    wiring = ("edges", "outputs", "initial_values")
    refused = _replacements_refused_alike(export, tmp_path, 4949, 30, _WIRING_POOL, load=True,
                                          paths_of=lambda paths: [p for p in paths if p[0] in wiring])
    assert refused >= 15

"""Issue 46 item 6: what leapp-run allocates from pipeline.yaml's shapes is bounded before it allocates.

An attacker may edit an export folder and recompute every digest (pipeline.yaml's and pipeline.json's twin
digest). One edited output shape made leapp-run allocate 8.2 GiB (a node's output buffer and its own copy),
and ``[2^36, 12]`` printed only ``std::bad_alloc``. Both readers now refuse a tensor above MAX_TENSOR_BYTES
(a dynamic batch at its maximum) and a description whose tensors hold more than MAX_PIPELINE_BYTES, with one
text naming the field, the node and tensor, and the bytes (docs/pipeline-format.md, "Tensor sizes"). Each
case runs leapp-run in a fresh helper process that reports its child's peak RSS.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import record_mlp

import leapp
from leapp.pipeline_format import (MAX_PIPELINE_BYTES, MAX_TENSOR_BYTES, PipelineError, read_pipeline, sha256_file,
                                   twin_text, yaml_text)

LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's headers are "
                                "missing (bash scripts/fetch-ort-headers.sh, then pip install -e . again)")

PEAK_LIMIT_MIB = 200  # leapp-run with ONNX Runtime loaded takes a few tens of MiB; the unbounded case took 8.2 GiB

_PEAK = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)
sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + "\\n" + str(r.returncode) + "\\n")
sys.stdout.write(r.stderr)
"""


def _peak_run(*args) -> tuple[int, int, str]:
    """(peak RSS in MiB, exit status, stderr) of ``leapp-run args``, measured in a fresh helper process (its only
    child is leapp-run, so RUSAGE_CHILDREN is leapp-run's own peak)."""
    r = subprocess.run([sys.executable, "-c", _PEAK, str(LEAPP_RUN), *map(str, args)], capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr
    peak_kib, status, stderr = r.stdout.split("\n", 2)
    return int(peak_kib) // 1024, int(status), stderr.strip()


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """Two ONNX nodes recorded on the CPU: policy (obs[16, 48] -> [16, 12]) and post (clamp and offset)."""
    return record_mlp(tmp_path_factory.mktemp("bounds"))


def _write_both(folder: Path, description: dict) -> None:
    """pipeline.yaml in leapp's canonical text and its twin bound to it: every digest recomputed."""
    (folder / "pipeline.yaml").write_text(yaml_text(description), encoding="utf-8")
    (folder / "pipeline.json").write_text(twin_text(description, sha256_file(folder / "pipeline.yaml")),
                                          encoding="utf-8")


def _set_shape(desc: dict, node: str, output: str, shape: list[int], batch: list[int] | None = None) -> None:
    """Gives node ``node``'s output ``output`` ``shape`` wherever it is named: the edges' consumers and the pipeline
    outputs it feeds take it too, so the edited file passes every cross-reference check."""
    entries = [e for n in desc["nodes"] if n["name"] == node for e in n["outputs"] if e["name"] == output]
    entries += [e for e in desc["outputs"] if (e["node"], e["output"]) == (node, output)]
    for edge in desc["edges"]:
        if (edge["from_node"], edge["from_output"]) == (node, output):
            entries += [e for n in desc["nodes"] if n["name"] == edge["to_node"] for e in n["inputs"]
                        if e["name"] == edge["to_input"]]
    for entry in entries:
        entry["shape"] = list(shape)
        if batch is not None:
            entry["batch"] = list(batch)


def _inputs(folder: Path, desc: dict) -> Path:
    ins = folder / "in"
    ins.mkdir()
    for entry in desc["inputs"]:
        n = 1
        for d in entry["shape"]:
            n *= d
        (ins / f"{entry['name']}.bin").write_bytes(b"\0" * (4 * n))
    return ins


def _edited(export: Path, tmp_path: Path, name: str, edit) -> tuple[Path, dict]:
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    edit(bad)
    folder = Path(shutil.copytree(export, tmp_path / name))
    _write_both(folder, bad)
    return folder, desc


def _output_name(desc: dict, node: str) -> str:
    return next(n for n in desc["nodes"] if n["name"] == node)["outputs"][0]["name"]


def _cases(desc: dict):
    policy_out, post_out = _output_name(desc, "policy"), _output_name(desc, "post")
    yield "output 2^36 x 12", lambda d: _set_shape(d, "post", post_out, [2**36, 12]), \
        f"(node 'post' output '{post_out}'): float32[68719476736, 12] is 3298534883328 bytes, more than the " \
        f"{MAX_TENSOR_BYTES} bytes a tensor may hold"
    # the brief's 8.2 GiB case: one output of 4.1 GiB (leapp-run's buffer and its own copy of it)
    yield "output 4.1 GiB", lambda d: _set_shape(d, "post", post_out, [16, 2**26]), \
        f"(node 'post' output '{post_out}'): float32[16, 67108864] is 4294967296 bytes, more than the"
    yield "one byte over", lambda d: _set_shape(d, "policy", policy_out, [2**28 + 1]), \
        f"(node 'policy' output '{policy_out}'): float32[268435457] is 1073741828 bytes"
    yield "product past 2^63", lambda d: _set_shape(d, "post", post_out, [2**62, 2**62, 3]), \
        "is more than 9223372036854775807 bytes, more than the"
    yield "batch maximum", lambda d: _set_shape(d, "post", post_out, [16, 12], batch=[1, 2**31 - 1]), \
        f"(node 'post' output '{post_out}'): float32[2147483647, 12] at its batch maximum 2147483647 is " \
        "103079215056 bytes"
    # each tensor at the bound, four of them (policy's output, post's input, post's output, the pipeline's output)
    yield "sum", lambda d: (_set_shape(d, "policy", policy_out, [16, 2**24]),
                            _set_shape(d, "post", post_out, [16, 2**24])), \
        f"bytes in all, more than the {MAX_PIPELINE_BYTES} bytes a pipeline's tensors may hold (MAX_PIPELINE_BYTES"


def test_sizes_from_the_file_are_bounded_before_leapp_run_allocates(export, tmp_path):
    _, desc = read_pipeline(export)
    for name, edit, expected in _cases(desc):
        folder, _ = _edited(export, tmp_path, name.replace(" ", "_"), edit)
        with pytest.raises(PipelineError) as python:
            leapp.load(folder)
        assert expected in str(python.value), (name, str(python.value))
        peak, status, stderr = _peak_run(folder, "--in", _inputs(folder, desc), "--out", folder / "out")
        text = str(python.value).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")
        assert status == 1 and stderr == f"leapp-run: {text}", (name, stderr, text)
        assert "bad_alloc" not in stderr
        assert peak < PEAK_LIMIT_MIB, (name, peak)


def test_a_tensor_at_the_bound_is_read_by_both(export, tmp_path):
    """Exactly MAX_TENSOR_BYTES is allowed (the bound is inclusive): the readers accept it, and leapp-run then
    gets to the model, whose real shape differs (ONNX Runtime's refusal, not a reader's)."""
    _, desc = read_pipeline(export)
    post_out = _output_name(desc, "post")
    folder, _ = _edited(export, tmp_path, "at_bound", lambda d: _set_shape(d, "post", post_out, [16, 2**24]))
    _, read = read_pipeline(folder)
    assert read["outputs"][0]["shape"] == [16, 2**24]
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


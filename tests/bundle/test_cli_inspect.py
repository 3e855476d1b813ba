"""``leapp inspect`` on a bundle file, a hand-made ONNX model, a PT2 archive and an export folder; ``leapp doctor``."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from leapp import cli
from leapp.cli import inspect as cli_inspect
from leapp.bundle import read_bundle, signature_json
from leapp.bundle.testing import example_bundle, reseal

BUNDLE = example_bundle()
DIGEST = read_bundle(BUNDLE).digest
SIGNATURE = signature_json(read_bundle(BUNDLE))


def run(*argv: str, capsys) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def onnx_model(bundle: bytes = BUNDLE, signature: str = SIGNATURE, bundle_dtype=np.uint8) -> onnx.ModelProto:
    """x -> WarpSegment(x, bundle) -> y -> Mul(y, 2) -> z, as leapp's exporter lays it out."""
    bundle_init = numpy_helper.from_array(np.frombuffer(bundle, dtype=np.uint8).astype(bundle_dtype), "seg0_bundle")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [
        helper.make_node("WarpSegment", ["x", "seg0_bundle"], ["y"], name="obs_warp_segment_0", domain="leapp.warp",
                         signature=signature),
        helper.make_node("Mul", ["y", "two"], ["z"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes, "obs",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        outputs=[helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
        initializer=[bundle_init, two],
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("leapp.warp", 1)],
                             ir_version=9, producer_name="leapp", producer_version="0.1.0")


def test_inspect_bundle_file(tmp_path, capsys):
    path = tmp_path / "seg.lwb"
    path.write_bytes(BUNDLE)
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 0, out
    assert out.splitlines()[0] == "seg.lwb: leapp segment bundle, 2.8 KiB"
    for text in (
        "segment example/warp_segment_0 (source leapp/bundle/testing.py:1)",
        f"digest {DIGEST} (format v2, 2.8 KiB, 3 blobs)",
        "[0] leapp_example_module: ptx sm_75 (1.1 KiB)",
        "[0] leapp_example_scale_cuda_kernel_forward (example_scale): module 0, block_dim 256, smem 0 B",
        "buffers: 4 (1 input, 1 output, 1 scratch, 1 constant, 64 B in all)",
        "[3] constant: 16 B, init blob 1",
        "ops: 3 (1 launch, 1 memset, 1 copy)",
        "producer: cuda_toolkit none, leapp 0.1.0, param_abi warp-1.19, ptx_isa 7.5, warp 1.19.0",
        f"signature: {SIGNATURE}",
    ):
        assert text in out
    # which binary loads, from the native loader's own choice: this machine's GPUs, or named GPUs without a driver
    assert "binary choice (docs/portability.md):" in out
    from leapp import _native

    if not _native.driver_status()["available"]:
        assert "this machine: no CUDA GPU here" in out
        assert "H200 (9.0): loads ptx sm_75: driver JIT of compute_75 PTX (ISA 7.5) for 9.0" in out, out
        assert "Jetson Thor (11.0): loads ptx sm_75" in out, out


def test_inspect_corrupt_bundle_file(tmp_path, capsys):
    path = tmp_path / "seg.lwb"
    path.write_bytes(reseal(BUNDLE[:64] + b"\x07" + BUNDLE[65:]))  # blob 0's offset, with a valid file hash
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 1
    assert f"error: {path}: bundle: blob 0 offset " in out and "is not 8-aligned" in out


def test_onnx_checker_accepts_a_warp_segment_model(tmp_path):
    model = onnx_model()
    onnx.checker.check_model(model, full_check=False)
    path = tmp_path / "obs.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def test_inspect_onnx(tmp_path, capsys):
    path = tmp_path / "obs.onnx"
    onnx.save(onnx_model(), str(path))
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0].startswith("obs.onnx: ONNX model, ") and "(ir_version 9; opsets ai.onnx 17, leapp.warp 1; producer leapp 0.1.0)" in lines[0]
    assert "inputs: x: float32[4]" in lines and "outputs: z: float32[4]" in lines
    assert "nodes: 2 (leapp.warp::WarpSegment x1, Mul x1)" in lines
    assert "node obs_warp_segment_0 (leapp.warp::WarpSegment): inputs ['x'], bundle 'seg0_bundle', outputs ['y']" in lines
    assert f"digest {DIGEST} (format v2, 2.8 KiB, 3 blobs)" in lines
    assert f"signature matches the bundle (digest {DIGEST[:16]}...)" in lines
    assert "binary choice (docs/portability.md):" in lines  # each bundle found in an archive too


def test_inspect_onnx_with_external_data(tmp_path, capsys):
    path = tmp_path / "obs.onnx"
    onnx.save(onnx_model(), str(path), save_as_external_data=True, location="obs.data", size_threshold=0)
    assert (tmp_path / "obs.data").stat().st_size >= len(BUNDLE)
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 0, out
    assert f"digest {DIGEST}" in out


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (lambda: onnx_model(signature=SIGNATURE.replace(DIGEST, "0" * 64)),
         f"error: obs.onnx: node obs_warp_segment_0: signature digest {'0' * 64} differs from the bundle's {DIGEST}"),
        (lambda: onnx_model(signature=SIGNATURE.replace('"name":"y"', '"name":"q"')),
         "error: obs.onnx: node obs_warp_segment_0: signature {"),
        (lambda: onnx_model(signature="{not json"), "error: obs.onnx: node obs_warp_segment_0: signature: not valid JSON"),
        (lambda: onnx_model(bundle_dtype=np.int8),
         "error: obs.onnx: node obs_warp_segment_0: bundle initializer 'seg0_bundle' is int8, expected uint8"),
        (lambda: onnx_model(bundle=BUNDLE[:-1] + bytes([BUNDLE[-1] ^ 1])),
         "error: obs.onnx: node obs_warp_segment_0: bundle: whole-file sha256 mismatch"),
    ],
)
def test_inspect_onnx_problems(tmp_path, capsys, model, message):
    path = tmp_path / "obs.onnx"
    onnx.save(model(), str(path))
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 1
    assert message in out, out


def _pt2(tmp_path, bundle: bytes = BUNDLE, signature: str = SIGNATURE):
    torch = pytest.importorskip("torch")
    from leapp.runtime import ops

    try:
        ops.ensure_registered()
    except (ImportError, OSError, RuntimeError) as e:  # no op library and no Python fallback in this build
        pytest.skip(f"leapp::warp_segment cannot be registered here: {e}")

    class Segment(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("warp_segment_0_bundle", torch.frombuffer(bytearray(bundle), dtype=torch.uint8))

        def forward(self, x):
            (y,) = torch.ops.leapp.warp_segment([x], self.warp_segment_0_bundle, signature)
            return y * 2

    path = tmp_path / "obs.pt2"
    torch.export.save(torch.export.export(Segment(), (torch.zeros(4),)), str(path))
    return path


def test_inspect_pt2(tmp_path, capsys):
    code, out = run("inspect", str(_pt2(tmp_path)), capsys=capsys)
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0].startswith("obs.pt2: PT2 archive, ")
    assert "leapp::warp_segment calls: 1" in lines
    assert "call warp_segment: inputs ['x'], bundle 'b_warp_segment_0_bundle', outputs ['getitem']" in lines
    assert "bundle in obs/data/weights/weight_0 (tensor warp_segment_0_bundle):" in lines
    assert f"signature matches the bundle (digest {DIGEST[:16]}...)" in lines


def test_inspect_pt2_with_a_foreign_signature(tmp_path, capsys):
    other = read_bundle(example_bundle(n=8))
    code, out = run("inspect", str(_pt2(tmp_path, signature=signature_json(other))), capsys=capsys)
    assert code == 1
    assert f"error: obs.pt2: call warp_segment: no bundle in the archive has the signature's digest {other.digest}" in out


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _export_folder(tmp_path) -> dict:
    """obs.onnx (one WarpSegment) and a complete pipeline.yaml for it, as leapp writes them."""
    onnx.save(onnx_model(), str(tmp_path / "obs.onnx"))
    def spec():
        return {"name": "x", "dtype": "float32", "shape": [4]}

    pipeline = {
        "format": "leapp.pipeline", "version": 1, "name": "go2",
        "producer": {"leapp": "0.1.0", "warp": "1.19.0"},
        "nodes": [{"name": "obs", "backend": "onnx", "artifact": "obs.onnx", "sha256": _sha(tmp_path / "obs.onnx"),
                   "files": [], "source": "go2.py:10", "device": "cuda:0",
                   "inputs": [spec()], "outputs": [{"name": "z", "dtype": "float32", "shape": [4]}],
                   "segments": [{"id": "obs/warp_segment_0", "source": "go2.py:12", "device": "cuda:0",
                                 "digest": DIGEST, "kernels": ["example_scale"], "producer": {"warp": "1.19.0"}}]}],
        "edges": [], "inputs": [spec() | {"consumers": [{"node": "obs", "input": "x"}]}],
        "outputs": [{"name": "z", "node": "obs", "output": "z", "dtype": "float32", "shape": [4]}],
        "constants": [],
    }
    _write_pipeline(tmp_path, pipeline)
    return pipeline


def _write_pipeline(folder, pipeline) -> None:
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))


def test_inspect_export_folder(tmp_path, capsys):
    pipeline = _export_folder(tmp_path)
    code, out = run("inspect", str(tmp_path), capsys=capsys)
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == f"pipeline go2 (leapp.pipeline v1) in {tmp_path}"
    assert "producer: leapp 0.1.0, warp 1.19.0" in lines
    assert "node obs: backend onnx, artifact obs.onnx" in lines
    assert f"segment obs/warp_segment_0: digest {DIGEST}, kernels ['example_scale']" in lines
    assert f"signature matches the bundle (digest {DIGEST[:16]}...)" in lines

    pipeline["nodes"][0]["sha256"] = "0" * 64
    pipeline["nodes"][0]["segments"][0]["digest"] = "f" * 64
    pipeline["nodes"][0]["files"] = [{"path": "obs.data", "sha256": "0" * 64}]
    _write_pipeline(tmp_path, pipeline)
    code, out = run("inspect", str(tmp_path), capsys=capsys)
    assert code == 1
    assert f"error: node obs: obs.onnx sha256 differs from pipeline.yaml's {'0' * 64}" in out
    assert "error: node obs: obs.data is missing" in out
    assert f"error: node obs: segment obs/warp_segment_0 (digest {'f' * 64}) is not in obs.onnx" in out
    assert out.count("error: ") == 3


def test_inspect_missing_and_unknown(tmp_path, capsys):
    code, out = run("inspect", str(tmp_path / "nope.onnx"), capsys=capsys)
    assert (code, out) == (1, f"error: {tmp_path / 'nope.onnx'}: no such file or directory\n")
    (tmp_path / "notes.txt").write_text("hello")
    code, out = run("inspect", str(tmp_path / "notes.txt"), capsys=capsys)
    assert code == 1 and "not a bundle (.lwb), ONNX (.onnx), PT2 (.pt2) or TorchScript (.pt) file" in out


def test_inspect_path_returns_problem_count(tmp_path):
    out = io.StringIO()
    (tmp_path / "a.lwb").write_bytes(BUNDLE[:10])
    assert cli.inspect_path(tmp_path / "a.lwb", out) == 1
    assert "bundle: truncated: 10 bytes" in out.getvalue()


def test_doctor(capsys):
    code, out = run("doctor", capsys=capsys)
    assert code == 0
    assert out.startswith("leapp ")
    assert "CUDA driver: " in out and "pt2 op library: " in out and "packages: torch " in out
    from leapp import _native

    status = _native.driver_status()
    if not status["available"]:
        assert f"CUDA driver: not available ({status['error']})" in out
        assert "binaries: no CUDA driver here; a default export (cubins sm_75, sm_80, sm_86, sm_90, sm_100, sm_110, " \
               "sm_120 and PTX sm_75 of ISA 8.0, all by the NVRTC of CUDA 13.4) needs a CUDA 13.0 driver for its " \
               "cubins and CUDA 12.0 or later for its PTX" in out, out
        assert "    Jetson Orin, JetPack 6.0 (8.7, CUDA 12.2 (12020) driver): loads ptx sm_75: " in out, out
    else:
        assert "binaries: the CUDA " in out and " driver reads PTX up to ISA " in out, out


def test_doctor_says_which_cpu_code_exports_carry_and_runs_here(capsys, monkeypatch):
    from leapp.bundle.format import this_machine

    monkeypatch.setenv("LEAPP_CPU_CODE", "1")
    code, out = run("doctor", capsys=capsys)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("CPU code: "))
    assert line.startswith(f"CPU code: runs here for {this_machine()}; exports carry it for every segment "
                           "($LEAPP_CPU_CODE=always), built for "), line
    monkeypatch.setenv("LEAPP_CPU_CODE", "sometimes")
    code, out = run("doctor", capsys=capsys)
    assert "exports: cannot tell ($LEAPP_CPU_CODE='sometimes': expected 'auto'" in out, out


def test_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2


# --- hostile and damaged inputs --------------------------------------------------------------------------------


def test_inspect_refuses_a_malformed_pipeline_yaml(tmp_path, capsys):
    """A truncated file once described a pipeline of 0 nodes and exited 0."""
    _export_folder(tmp_path)
    text = (tmp_path / "pipeline.yaml").read_text()
    (tmp_path / "pipeline.yaml").write_text("".join(text.splitlines(keepends=True)[:5]))
    code, out = run("inspect", str(tmp_path), capsys=capsys)
    assert code == 1 and out.startswith(f"error: {tmp_path / 'pipeline.yaml'}: "), out
    (tmp_path / "pipeline.yaml").write_text(text.replace("  sha256:", "  sha257:", 1))
    code, out = run("inspect", str(tmp_path), capsys=capsys)
    assert (code, out) == (1, f"error: {tmp_path / 'pipeline.yaml'}: nodes[0].sha256: missing\n")


def test_inspect_refuses_an_alias_bomb(tmp_path, capsys):
    lines = ["format: leapp.pipeline", "version: 1", "a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append("nodes: [{name: *i}]")
    (tmp_path / "pipeline.yaml").write_text("\n".join(lines) + "\n")
    code, out = run("inspect", str(tmp_path), capsys=capsys)
    assert code == 1 and "line 3, column 4: YAML anchor &a (leapp never writes anchors" in out and len(out) < 300, out


def _outside_variants(tmp_path):
    """(label, mutate) pairs pointing a node's artifact or files[0] outside the export folder."""
    return [
        ("artifact ../", lambda p, name: p["nodes"][0].update(artifact=f"../{name}")),
        ("artifact absolute", lambda p, name: p["nodes"][0].update(artifact=str(tmp_path / name))),
        ("files ../", lambda p, name: p["nodes"][0].update(files=[{"path": f"../{name}", "sha256": "0" * 64}])),
        ("symlink", None),
    ]


def test_inspect_is_no_oracle_for_files_outside_the_folder(tmp_path, capsys, monkeypatch):
    """An outside path is refused before any open: the same report whether the file exists, matches or not."""
    folder = tmp_path / "export"
    folder.mkdir()
    _export_folder(folder)
    (tmp_path / "secret.onnx").write_bytes((folder / "obs.onnx").read_bytes())
    secret_sha = _sha(tmp_path / "secret.onnx")
    opened = []
    real = cli_inspect.read_bounded  # the one read inspect makes of a file it names
    monkeypatch.setattr(cli_inspect, "read_bounded", lambda p, *a, **k: opened.append(p) or real(p, *a, **k))
    for label, mutate in _outside_variants(tmp_path):
        reports = []
        for name in ("secret.onnx", "absent.onnx"):  # exists (same sha256 as recorded) / does not exist
            pipeline = _export_folder(folder)
            pipeline["nodes"][0]["sha256"] = secret_sha
            if mutate is None:
                (folder / "link.onnx").unlink(missing_ok=True)
                os.symlink(tmp_path / name, folder / "link.onnx")
                pipeline["nodes"][0]["artifact"] = "link.onnx"
            else:
                mutate(pipeline, name)
            _write_pipeline(folder, pipeline)
            opened.clear()
            code, out = run("inspect", str(folder), capsys=capsys)
            assert code == 1, (label, out)
            assert "leaves the pipeline folder" in out and "missing" not in out and "differs" not in out, (label, out)
            assert not any(Path(p).name == name for p in opened), (label, opened)
            reports.append(out.replace(name, "NAME"))
        assert reports[0] == reports[1], label


def test_inspect_without_pipeline_yaml_does_not_follow_symlinks_out(tmp_path, capsys):
    folder = tmp_path / "export"
    folder.mkdir()
    onnx.save(onnx_model(), str(tmp_path / "secret.onnx"))
    os.symlink(tmp_path / "secret.onnx", folder / "a.onnx")
    code, out = run("inspect", str(folder), capsys=capsys)
    assert code == 1 and "path 'a.onnx' leaves the pipeline folder" in out and "ONNX model" not in out, out


def test_inspect_truncated_pt2_is_corrupt(tmp_path, capsys):
    """Cut where the archive's sample-inputs .pt (a zip inside) ends, zipfile opened the inner archive
    and inspect exited 0 with '0 calls'. Every truncation must now exit 1 saying the file is corrupt."""
    data = _pt2(tmp_path).read_bytes()
    path = tmp_path / "cut.pt2"
    inner_opened = 0
    for size in sorted(set(range(0, len(data), max(1, len(data) // 97))) | {len(data) - 1, len(data) - 22}):
        path.write_bytes(data[:size])
        try:
            zipfile.ZipFile(path).close()
            inner_opened += 1
        except zipfile.BadZipFile:
            pass
        code, out = run("inspect", str(path), capsys=capsys)
        assert code == 1 and f"error: {path}: corrupt or truncated" in out, (size, out)
    assert inner_opened, "no cut opened as a zip: the nested-archive case was not exercised"


def test_inspect_pt2_with_a_damaged_entry_is_corrupt(tmp_path, capsys):
    """A flipped byte inside a stored entry fails its CRC: once an uncaught BadZipFile traceback."""
    path = _pt2(tmp_path)
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("models/model.json"))
    data = bytearray(path.read_bytes())
    name_length, extra_length = int.from_bytes(data[info.header_offset + 26:][:2], "little"), \
        int.from_bytes(data[info.header_offset + 28:][:2], "little")  # the local header's own lengths
    start = info.header_offset + 30 + name_length + extra_length
    data[start + 10] ^= 0x20
    path.write_bytes(bytes(data))
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 1 and f"error: {path}: corrupt or truncated PT2 archive: BadZipFile: Bad CRC-32" in out, out


def test_inspect_empty_onnx_is_corrupt(tmp_path, capsys):
    """protobuf parses an empty file as an empty model, which inspect described with exit status 0."""
    path = tmp_path / "obs.onnx"
    path.write_bytes(b"")
    code, out = run("inspect", str(path), capsys=capsys)
    assert code == 1 and f"error: {path}: corrupt or truncated: the ONNX checker refuses it" in out, out

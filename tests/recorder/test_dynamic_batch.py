"""Dynamic batch on the recorder side (docs/recorder.md section 1.0): probes, rules learned, refusals.

CPU Warp: the captures record the launches; bundles are built with NVRTC (no GPU needed).
"""

from __future__ import annotations

import pytest
import recorder_kernels as K
import torch
import warp as wp

import leapp
from leapp import annotate
from leapp._export.exportable import build_exportable
from leapp.bundle import read_bundle
from leapp.errors import ExportError, TraceError

wp.init()


@wp.kernel
def scaled(src: wp.array(dtype=float), s: float, dst: wp.array(dtype=float)):
    i = wp.tid()
    dst[i] = src[i] * s


@wp.kernel
def rows2d(src: wp.array2d(dtype=float), dst: wp.array2d(dtype=float)):
    i, j = wp.tid()
    dst[i, j] = src[i, j] * 2.0


def _quat(n):
    return torch.nn.functional.normalize(torch.randn(n, 4, generator=torch.Generator().manual_seed(n)), dim=-1)


def _gravity_obs():
    """A fresh ``obs`` node (dynamic batch 1..64): projected gravity (one Warp launch) joined to the joints."""

    @leapp.node("obs", export_with="pt2", dynamic_batch=(1, 64))
    def obs(quat, joints):
        grav = torch.empty(quat.shape[0], 3)
        with annotate.warp_op():
            wp.launch(K.projected_gravity, dim=quat.shape[0],
                      inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                      outputs=[wp.from_torch(grav, dtype=wp.vec3)], device="cpu")
        return torch.cat([grav, joints], dim=-1)

    return obs


def test_decorator_probes_min_and_max_and_learns_rules(tmp_path):
    obs = _gravity_obs()
    q, j = _quat(16), torch.randn(16, 5)
    with leapp.trace("t", save_path=str(tmp_path)) as s:
        obs(q, j)
        obs(q, j)
    record = s.record.nodes["obs"]
    assert record.dynamic_batch == (1, 64)
    assert [p.batch for p in record.probes] == [1, 64]
    assert [x.inputs[0].shape[0] for x in record.samples] == [16, 1, 64]  # probes are validation samples
    node = build_exportable(record)
    m = read_bundle(node.segments[0].bundle).manifest
    assert m["batch"] == {"traced": 16, "min": 1, "max": 64}
    launch = m["ops"][0]
    assert launch["size_rule"] == [1, 0]
    assert {(p["param"], p["offset"]) for p in launch["patches"]} == {(0, 0), (0, 8), (1, 16), (3, 16)}
    assert [b.get("bytes_rule") for b in m["buffers"]] == [[16, 0], [12, 0]]
    from leapp._export.pt2_export import to_exported_program

    program = to_exported_program(node)
    (rng,) = program.range_constraints.values()
    assert (rng.lower, rng.upper) == (2, 64)


def test_2d_launch_and_scratch_rules(tmp_path):
    @leapp.node("two", export_with="pt2", dynamic_batch=(2, 40))
    def two(x):
        out = torch.zeros(x.shape[0], 3)
        with annotate.warp_op():
            tmp = wp.zeros((x.shape[0], 3), dtype=float, device="cpu")
            wp.launch(rows2d, dim=(x.shape[0], 3), inputs=[wp.from_torch(x)], outputs=[tmp], device="cpu")
            wp.launch(rows2d, dim=(x.shape[0], 3), inputs=[tmp], outputs=[wp.from_torch(out)], device="cpu")
        return out

    with leapp.trace("t2", save_path=str(tmp_path)) as s:
        two(torch.randn(8, 3))
        two(torch.randn(8, 3))
    node = build_exportable(s.record.nodes["two"])
    m = read_bundle(node.segments[0].bundle).manifest
    roles = {b["role"]: b.get("bytes_rule") for b in m["buffers"]}
    assert roles["scratch"] == [12, 0]
    launch = next(op for op in m["ops"] if op["op"] == "launch")
    # launch bounds shape[0] follows the batch, shape[1] = 3 stays; size = 3 * batch
    assert {"param": 0, "offset": 0, "width": 4, "rule": [1, 0]} in launch["patches"]
    assert {"param": 0, "offset": 8, "width": 4, "rule": [3, 0]} in launch["patches"]
    assert launch["size_rule"] == [3, 0]


def test_non_affine_value_is_refused_with_the_launch_file_line(tmp_path):
    @leapp.node("bad", export_with="pt2", dynamic_batch=(1, 64))
    def bad(x):
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(scaled, dim=x.shape[0], inputs=[wp.from_torch(x), 1.0 / x.shape[0]],
                      outputs=[wp.from_torch(y)], device="cpu")
        return y

    with leapp.trace("t3", save_path=str(tmp_path)) as s:
        bad(torch.randn(16))
        bad(torch.randn(16))
    with pytest.raises(ExportError) as e:
        build_exportable(s.record.nodes["bad"])
    text = str(e.value)
    assert "launch of 'scaled' at " in text and "test_dynamic_batch.py:" in text, text
    assert "argument 's'" in text and "not affine in the batch" in text, text


def test_constant_that_changes_size_is_refused(tmp_path):
    @leapp.node("konst", export_with="pt2", dynamic_batch=(1, 64))
    def konst(x):
        y = torch.empty_like(x)
        weights = wp.full(x.shape[0], 2.0, dtype=float, device="cpu")  # made outside the block: a constant
        with annotate.warp_op():
            wp.launch(K.add_arrays, dim=x.shape[0], inputs=[wp.from_torch(x), weights],
                      outputs=[wp.from_torch(y)], device="cpu")
        return y

    with leapp.trace("t4", save_path=str(tmp_path)) as s:
        konst(torch.randn(16))
        konst(torch.randn(16))
    with pytest.raises(ExportError, match="a constant would have to change size") as e:
        build_exportable(s.record.nodes["konst"])
    assert "argument 'b' of the launch of 'add_arrays' at " in str(e.value)
    assert "test_dynamic_batch.py:" in str(e.value), str(e.value)


def test_output_not_following_the_batch_is_refused(tmp_path):
    n_envs = 16

    @leapp.node("baked", export_with="pt2", dynamic_batch=(1, 64))
    def baked(x):
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(scaled, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)],
                      device="cpu")
        return y + torch.zeros(n_envs)  # a baked size, not x.shape[0]: (16,) at every batch

    with leapp.trace("t5", save_path=str(tmp_path)):
        baked(torch.randn(16))
        with pytest.raises(TraceError, match=r"output 'output' has shape \(16,\).*batch, 1 here"):
            baked(torch.randn(16))


def test_with_form_needs_probes_and_bad_ranges_are_refused(tmp_path):
    def step(x):
        with leapp.node("w", export_with="pt2", dynamic_batch=True):
            x = annotate.input_tensors("w", {"x": x})
            y = torch.empty_like(x)
            with annotate.warp_op():
                wp.launch(scaled, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)],
                          device="cpu")
            annotate.output_tensors("w", {"y": y})

    with leapp.trace("t6", save_path=str(tmp_path)) as s:
        step(torch.randn(8))
        step(torch.randn(8))
    with pytest.raises(TraceError, match="ran at only 1 distinct batch size"):
        s.record.check_complete()
    with leapp.trace("t7", save_path=str(tmp_path)) as s:
        for n in (8, 8, 3, 8, 20):
            step(torch.randn(n))
    record = s.record.nodes["w"]
    assert [p.batch for p in record.probes] == [3, 20]
    s.record.check_complete()
    assert read_bundle(build_exportable(record).segments[0].bundle).manifest["batch"]["max"] == 65536
    for bad in [(5, 2), (0, 4), (1.0, 4), "yes", (1, 2**31)]:
        with pytest.raises(TraceError, match="dynamic_batch="):
            leapp.node("x", dynamic_batch=bad)


def test_sizes_baked_from_the_batch_become_expressions_and_validate_at_min_and_max(tmp_path):
    """torch.zeros(n, 3), x.reshape(n, 2, 3), x.view(2 * n, 3): the recorder bakes n; the exporter compares the
    probes' graphs and computes these from input 0's dim 0, so PT2 and ONNX run at any batch of the range."""
    @leapp.node("shapey", export_with="pt2", dynamic_batch=(1, 64))
    def shapey(x):
        n = x.shape[0]
        return torch.cat([x.reshape(n, 2, 3).sum(1) + torch.zeros(n, 3), torch.ones(n, 1)], dim=1)

    @leapp.node("shapeo", export_with="onnx", dynamic_batch=(1, 64))
    def shapeo(x):
        n = x.shape[0]
        return x.view(n * 2, 3)[:n] + torch.arange(3.0).expand(n, 3)

    x = torch.randn(16, 6)
    with leapp.trace("sh", save_path=str(tmp_path)) as s:
        for _ in range(2):
            shapey(x)
            shapeo(x)
    report = s.compile(validate=True)  # samples at 16 (traced), 1 and 64 (the probes): smallest and largest
    assert report["shapey"].validation.status == "passed" and report["shapeo"].validation.status == "passed"
    assert [t.inputs[0].shape[0] for t in s.record.nodes["shapey"].samples] == [16, 1, 64]
    pipeline = leapp.load(str(tmp_path / "sh"))
    for n in (1, 5, 63):
        x = torch.randn(n, 6)
        torch.testing.assert_close(pipeline.run_node("shapey", x=x)["output"], shapey(x))
        torch.testing.assert_close(pipeline.run_node("shapeo", x=x)["output"], shapeo(x))
    with pytest.raises(Exception, match=r"batch 65 is outside the exported range 1..64"):
        pipeline.run_node("shapey", x=torch.randn(65, 6))
    with pytest.raises(Exception, match=r"expects float32\[batch 1..64, 6\], got float32\[4, 5\]"):
        pipeline.run_node("shapey", x=torch.randn(4, 5))
    # the C++ runner's reader takes the batch field too (its schema checker knows every keyword the schema uses)
    import subprocess
    import sys
    from pathlib import Path

    leapp_run = Path(sys.executable).with_name("leapp-run")
    if leapp_run.is_file():
        proc = subprocess.run([str(leapp_run), str(tmp_path / "sh"), "--check"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_size_not_affine_in_the_batch_is_refused_naming_the_op(tmp_path):
    @leapp.node("sq", export_with="pt2", dynamic_batch=(1, 64))
    def sq(x):
        n = x.shape[0]
        return x + torch.zeros(n * n).sum()

    with leapp.trace("sq", save_path=str(tmp_path)) as s:
        sq(torch.randn(4))
        sq(torch.randn(4))
    with pytest.raises(ExportError, match=r"aten.zeros.default \(args\[0\]\[0\]\) is 16 at batch 4, 1 at batch 1, "
                                          r"4096 at batch 64: not affine"):
        build_exportable(s.record.nodes["sq"])


def test_dynamic_exports_are_byte_identical(tmp_path, monkeypatch):
    """A dynamic-batch pipeline (PT2 with a Warp segment and its rules, ONNX with a symbolic batch) exported twice
    into different folders gives the same bytes in every file: probes, learned rules and Dims are deterministic."""
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "90")  # one cubin target keeps it fast; determinism does not depend on it
    obs = _gravity_obs()

    @leapp.node("post", export_with="onnx", dynamic_batch=(1, 64))
    def post(x):
        return torch.tanh(x) * 0.5

    digests = []
    for i in range(2):
        folder = tmp_path / f"e{i}"
        with leapp.trace("rep", save_path=str(folder)) as s:
            for _ in range(2):
                post(obs(_quat(16), torch.ones(16, 5)))
        s.compile(validate=False)
        files = sorted(p for p in (folder / "rep").iterdir() if p.is_file())
        digests.append({p.name: p.read_bytes() for p in files})
    assert set(digests[0]) >= {"obs.pt2", "post.onnx", "pipeline.yaml", "pipeline.json"}, sorted(digests[0])
    different = [name for name in digests[0] if digests[0][name] != digests[1].get(name)]
    assert not different, different

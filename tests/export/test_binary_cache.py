"""The persistent binary cache (leapp/_export/binary_cache.py): reuse across processes, hostile entries, the switch.

NVRTC runs without a GPU, so everything here is real: modules are compiled for PTX sm_75 and a cubin
sm_90 (one target keeps it fast), written to the session's cache folder (tests/conftest.py) or a
folder of the test's own, read back in another process, corrupted, resealed, raced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

wp = pytest.importorskip("warp")

import size_pipeline  # noqa: E402

from leapp._export import binary_cache as bc  # noqa: E402
from leapp._export import cuda_code  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

ARCHS = (90,)


@wp.kernel
def k_cached(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


def _digest(compiled: cuda_code.CompiledModule) -> str:
    return hashlib.sha256(repr([(k, a, d) for k, a, d in compiled.binaries()] + [compiled.smem_bytes]).encode()).hexdigest()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(bc.CACHE_DIR_ENV, str(folder))
    cuda_code.clear_cache()
    yield folder / bc.SUBDIR
    cuda_code.clear_cache()


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.bin"))


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("leapp._export")]


# ------------------------------------------------------------------ across processes

_FRESH = textwrap.dedent(
    """
    import hashlib, logging, sys
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    import warp as wp
    from leapp._export import cuda_code

    @wp.kernel
    def k_fresh(a: wp.array(dtype=float), out: wp.array(dtype=float)):
        i = wp.tid()
        out[i] = wp.sin(a[i]) * 3.0

    c = cuda_code.compile_module(k_fresh, 128, (90,))
    print("DIGEST", hashlib.sha256(repr(c.binaries() + [c.smem_bytes]).encode()).hexdigest())
    """
)


def test_a_fresh_process_reads_what_another_compiled(tmp_path, cache_dir):
    script = tmp_path / "fresh_compile.py"  # a file: Warp reads kernels' source
    script.write_text(_FRESH)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ), cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(out.stdout)
    assert "compiled PTX sm_75, cubin sm_90" in runs[0] and "binary cache" not in runs[0], runs[0]
    assert "PTX sm_75, cubin sm_90 read from the binary cache" in runs[1] and "compiled PTX" not in runs[1], runs[1]
    digests = [line for run in runs for line in run.splitlines() if line.startswith("DIGEST")]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert len(_entries(cache_dir)) == 2


# ------------------------------------------------------------------ hit, miss and the switch give the same bytes


def test_exports_are_byte_identical_on_hit_miss_and_without_cache(tmp_path, cache_dir, monkeypatch, caplog):
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "90")
    folders = {}
    with caplog.at_level(logging.INFO, logger="leapp._export.cuda_code"):
        for run in ("miss", "hit", "off"):
            if run == "off":
                monkeypatch.setenv(bc.DISABLE_ENV, "1")
            cuda_code.clear_cache()  # the in-process store: only the persistent cache may serve the binaries
            caplog.clear()
            folders[run] = size_pipeline.export(tmp_path / run, 64, names=("seg_pt2", "seg_onnx"))
            logged = " ".join(_messages(caplog))
            assert ("read from the binary cache" in logged) == (run == "hit"), (run, logged)
            assert ("compiled PTX sm_75" in logged) == (run != "hit"), (run, logged)
    files = sorted(p.name for p in folders["miss"].iterdir())
    assert {"seg_pt2.pt2", "seg_onnx.onnx", "pipeline.yaml"} <= set(files)
    for name in files:
        data = {run: (folder / name).read_bytes() for run, folder in folders.items()}
        assert data["miss"] == data["hit"] == data["off"], name


def test_the_switch_reads_and_writes_nothing(cache_dir, monkeypatch, caplog):
    monkeypatch.setenv(bc.DISABLE_ENV, "1")
    assert bc.default_cache() is None
    cuda_code.compile_module(k_cached, 64, ARCHS)
    assert not cache_dir.exists()
    monkeypatch.setenv(bc.DISABLE_ENV, "0")  # "0" / "false" / "off" / "" leave it on
    cuda_code.clear_cache()
    cuda_code.compile_module(k_cached, 64, ARCHS)
    assert len(_entries(cache_dir)) == 2


# ------------------------------------------------------------------ hostile entries


def _flip_last_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-bc._DIGEST - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_entry_is_refused_and_replaced(cache_dir, caplog):
    good = _digest(cuda_code.compile_module(k_cached, 64, ARCHS))
    entries = _entries(cache_dir)
    assert len(entries) == 2
    for path in entries:
        _flip_last_payload_byte(path)
    cuda_code.clear_cache()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        again = cuda_code.compile_module(k_cached, 64, ARCHS)
    assert _digest(again) == good
    warnings = [m for m in _messages(caplog) if "refused" in m]
    assert len(warnings) == 2 and all("sha256 mismatch" in m and "making it again" in m for m in warnings), warnings
    cuda_code.clear_cache()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="leapp"):
        assert _digest(cuda_code.compile_module(k_cached, 64, ARCHS)) == good  # rewritten: a clean hit now
    assert any("read from the binary cache" in m for m in _messages(caplog)) and not any(
        "refused" in m for m in _messages(caplog))


def _one_entry(cache_dir) -> tuple[bc.CacheKey, bc.Entry, bytes]:
    """A real cubin entry of k_cached: its key, its decoded entry and its file bytes."""
    compiled = cuda_code.compile_module(k_cached, 64, ARCHS)
    key = cuda_code._cache_key(k_cached.module.name, compiled.module_hash, 64, compiled.toolkit, "cubin", 90)
    data = (cache_dir / key.filename()).read_bytes()
    return key, bc.decode_entry(key, data), data


def _resealed(data: bytes) -> bytes:
    body = data[: -bc._DIGEST]
    return body + hashlib.sha256(body).digest()


def test_resealed_tampering_is_refused_by_the_content_checks(cache_dir):
    key, entry, data = _one_entry(cache_dir)
    cubin = bytearray(entry.payload)
    cubin[49] ^= 0x01  # e_flags' SM byte: sm_90 -> sm_91
    other_arch = bc.encode_entry(key, bc.Entry(bytes(cubin), entry.meta))
    other_key = bc.CacheKey(**{**key.__dict__, "arch": 80})
    cases = {
        "lengths": _resealed(data[:-bc._DIGEST - 1]),  # one payload byte short, digest recomputed
        "magic": _resealed(b"X" + data[1:-bc._DIGEST]),
        "e_flags": other_arch,
        "ELF machine": bc.encode_entry(key, bc.Entry(entry.payload[:18] + b"\x00\x00" + entry.payload[20:], entry.meta)),
        "another key": bc.encode_entry(other_key, entry),
        "meta": bc.encode_entry(key, bc.Entry(entry.payload, {"entry": -1})),
        "shorter than a header": data[:40],
    }
    for why, bad in cases.items():
        with pytest.raises(bc.CacheEntryError, match=why):
            bc.decode_entry(key, bad)
    ptx_key = bc.CacheKey(**{**key.__dict__, "kind": "ptx", "arch": 75})
    with pytest.raises(bc.CacheEntryError, match="PTX is not text targeting sm_75"):
        bc.decode_entry(ptx_key, bc.encode_entry(ptx_key, bc.Entry(b".version 9.4\n.target sm_90\n\0", {})))
    assert bc.decode_entry(key, data) == entry


def test_entries_others_may_write_are_not_read(cache_dir, caplog):
    key, _, data = _one_entry(cache_dir)
    path = cache_dir / key.filename()
    path.chmod(0o666)
    cache = bc.default_cache()
    with caplog.at_level(logging.WARNING, logger="leapp"):
        assert cache.get(key) is None
    assert any("writable by other users" in m for m in _messages(caplog))
    path.chmod(0o600)
    assert cache.get(key) is not None
    path.unlink()
    os.symlink(cache_dir.parent / "elsewhere.bin", path)
    (cache_dir.parent / "elsewhere.bin").write_bytes(data)
    assert cache.get(key) is None  # never followed


def test_a_shared_cache_folder_is_not_used(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "shared"
    (folder / bc.SUBDIR).mkdir(parents=True)
    (folder / bc.SUBDIR).chmod(0o777)
    monkeypatch.setenv(bc.CACHE_DIR_ENV, str(folder))
    cache = bc.BinaryCache(folder, 1 << 20)
    with caplog.at_level(logging.WARNING, logger="leapp"):
        assert not cache.usable()
    assert any("writable by other users" in m and "going on without it" in m for m in _messages(caplog))


# ------------------------------------------------------------------ writers, the bound, the location


def _ptx(arch: int, filler: int) -> bytes:
    return b".version 9.4\n.target sm_%d\n// %s\n\0" % (arch, b"x" * filler)


def _key(i: int) -> bc.CacheKey:
    return bc.CacheKey(warp="1.19.0", warp_native="1:1", nvrtc="13.4", module=f"m{i}", module_hash="ab" * 32,
                       block_dim=256, kind="ptx", arch=75, bundle_format=1)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _hammer(folder: str, worker: int, rounds: int) -> tuple[int, list[str]]:
    """Writes and reads the same 4 keys many times: (reads that saw a whole, valid entry, warnings logged)."""
    warnings = _Warnings()
    logging.getLogger("leapp").addHandler(warnings)
    cache = bc.BinaryCache(Path(folder), 1 << 30)
    seen = 0
    for r in range(rounds):
        i = (worker + r) % 4
        cache.put(_key(i), bc.Entry(_ptx(75, 200_000 + i), {"e": i}))
        got = cache.get(_key((i + 1) % 4))
        if got is not None:
            assert got.payload == _ptx(75, 200_000 + (i + 1) % 4) and got.meta == {"e": (i + 1) % 4}
            seen += 1
    return seen, warnings.messages


def test_concurrent_writers_leave_whole_entries(tmp_path):
    with ProcessPoolExecutor(4) as pool:
        results = list(pool.map(_hammer, [str(tmp_path)] * 4, range(4), [40] * 4))
    assert sum(seen for seen, _ in results) > 0
    assert [w for _, warnings in results for w in warnings] == []  # no reader ever saw a partial entry
    cache = bc.BinaryCache(tmp_path, 1 << 30)
    for i in range(4):
        assert cache.get(_key(i)).payload == _ptx(75, 200_000 + i)
    assert sorted(p.name for p in cache.folder.iterdir()) == sorted(_key(i).filename() for i in range(4))


def test_trim_removes_the_least_recently_used(tmp_path):
    cache = bc.BinaryCache(tmp_path, 3 * 110_000)
    for i in range(5):
        cache.put(_key(i), bc.Entry(_ptx(75, 100_000), {}))
        os.utime(cache.folder / _key(i).filename(), (1000 + i, 1000 + i))
    cache.get(_key(0))  # a hit makes entry 0 the most recent
    stale = cache.folder / ".tmp-crashed.bin"
    stale.write_bytes(b"partial")
    os.utime(stale, (1, 1))
    cache.trim()
    left = {p.name for p in cache.folder.iterdir()}
    assert left == {_key(i).filename() for i in (0, 3, 4)}


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv(bc.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bc.cache_root() == tmp_path / "xdg" / "leapp"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bc.cache_root() == tmp_path / "home" / ".cache" / "leapp"
    monkeypatch.setenv(bc.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert bc.cache_root() == tmp_path / "mine"
    monkeypatch.setenv(bc.MAX_MB_ENV, "7")
    assert bc.default_cache().max_bytes == 7 << 20


def test_key_names_what_changes_the_bytes():
    fields = set(json.loads(_key(0).encoded()))
    assert fields == {"cache", "warp", "warp_native", "nvrtc", "module", "module_hash", "block_dim", "kind", "arch",
                      "bundle_format", "overrides", "kernels"}
    assert len({_key(i).filename() for i in range(3)} | {bc.CacheKey(**{**_key(0).__dict__, "arch": 80}).filename()}) == 4
    subset = bc.CacheKey(**{**_key(0).__dict__, "kernels": "k_a_01234567"})  # a segment's kernels, not the module
    assert subset.filename() != _key(0).filename()

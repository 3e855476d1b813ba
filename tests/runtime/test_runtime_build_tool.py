"""leapp-build-warp-runtime: --status reports libraries and driver; the sources are found for a rebuild."""

from __future__ import annotations

from leapp.runtime import build, libraries


def test_status_lists_libraries_and_driver(capsys):
    assert build.main(["--status"]) == 0
    out = capsys.readouterr().out
    assert f"native dir: {libraries.native_dir()}" in out
    for backend in ("pt2", "onnx"):
        assert f"{backend}: " in out and str(libraries.library_path(backend)) in out
    assert "CUDA driver: " in out


def test_status_names_env_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY", str(tmp_path / "nope.so"))
    lines = build.status_lines()
    assert f"onnx: MISSING {tmp_path / 'nope.so'} (from $LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY)" in lines


def test_sources_are_found():
    sources = build.find_sources()
    assert (sources / "core" / "src" / "replay.cpp").is_file()
    assert (sources / "torch" / "leapp_warp_torch.cpp").is_file()
    assert build.find_sources("/nonexistent") == sources  # a wrong explicit folder falls back to the others
    assert build.find_sources(str(sources.parent)) == sources  # a checkout root works as well as its ext/


def test_built_libraries_and_the_aoti_plugin_are_installed(tmp_path):
    """What CMake installed under prefix/leapp goes next to leapp._native, the C++ runner's plugin included."""
    built = tmp_path / "prefix" / "leapp"
    built.mkdir(parents=True)
    for name in ("libleapp_warp_torch.so", "libleapp_pipeline_aoti.so", "unrelated.so"):
        (built / name).write_bytes(name.encode())
    installed = build.install_built(tmp_path / "prefix", tmp_path / "dest")
    assert sorted(p.name for p in installed) == ["libleapp_pipeline_aoti.so", "libleapp_warp_torch.so"]
    assert (tmp_path / "dest" / "libleapp_pipeline_aoti.so").read_bytes() == b"libleapp_pipeline_aoti.so"
    assert not (tmp_path / "dest" / "unrelated.so").exists()

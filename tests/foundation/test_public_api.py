"""The names `leapp` offers users, pinned: what `import leapp` gives, what each returns, and the error tree.

Changing this list is changing leapp's public API: do it on purpose, here and in docs/recorder.md.
"""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

import leapp

PUBLIC = {
    "trace", "start", "stop", "compile_graph", "node", "annotate", "Session", "CompileReport",
    "load", "Pipeline", "aoti",
    "LeappError", "TraceError", "SegmentDivergenceError", "UnsupportedPlatform", "ExportError", "UnsupportedBackend",
    "ValidationError", "RuntimeLibraryNotFound", "BundleError", "PipelineError", "UnsafeArtifact", "SignatureError",
}
# each error and the built-in base a user would catch it with
ERRORS = {
    "LeappError": RuntimeError, "TraceError": RuntimeError, "SegmentDivergenceError": RuntimeError,
    "UnsupportedPlatform": ImportError, "ExportError": RuntimeError, "UnsupportedBackend": NotImplementedError,
    "ValidationError": RuntimeError, "RuntimeLibraryNotFound": FileNotFoundError, "BundleError": ValueError,
    "PipelineError": RuntimeError, "UnsafeArtifact": RuntimeError, "SignatureError": RuntimeError,
}


def test_the_public_names_are_these_and_all_resolve():
    assert set(leapp.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(leapp, name) is not None, name


def test_every_public_error_is_a_leapp_error_and_its_builtin():
    for name, builtin in ERRORS.items():
        error = getattr(leapp, name)
        assert issubclass(error, leapp.LeappError) and issubclass(error, builtin), name


def test_load_and_compile_are_typed_with_what_they_return():
    names = {name: getattr(leapp, name) for name in PUBLIC}
    assert typing.get_type_hints(leapp.load, localns=names)["return"] is leapp.Pipeline
    assert typing.get_type_hints(leapp.compile_graph, localns=names)["return"] is leapp.CompileReport
    session = typing.get_type_hints(leapp.trace, localns=names)["return"]
    assert typing.get_origin(session) is leapp.Session and typing.get_args(session) == (leapp.CompileReport,)


@pytest.mark.parametrize("module", ["leapp.bundle.lz4_block", "leapp._export.binary_cache"])
def test_internal_errors_join_the_tree(module):
    import importlib

    found = importlib.import_module(module)
    error = {"leapp.bundle.lz4_block": "BlockError", "leapp._export.binary_cache": "CacheEntryError"}[module]
    assert issubclass(getattr(found, error), leapp.LeappError)


def test_import_leapp_stays_light():
    """`import leapp` imports neither Warp nor the recorder nor the exporter (they load on first use)."""
    code = ("import sys, leapp; heavy = [m for m in ('warp', 'leapp._recorder', 'leapp._export', 'onnx') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""leapp.aoti: an AOTInductor package of an exported PT2 node (``leapp aoti EXPORT_DIR NODE``).

An AOTInductor package (``torch._inductor.aoti_compile_and_package``) is the
node compiled to a shared library inside a ``.pt2`` zip, loadable from Python
(``torch._inductor.aoti_load_package``) and from C++ without Python
(``torch::inductor::AOTIModelPackageLoader``). Inductor has no C shim for
``leapp::warp_segment``; it serialises each call into the package and runs it
through its proxy executor, which looks the op up in torch's dispatcher when
the package is loaded. So the loading process must have registered the op
first: ``import leapp`` in Python, ``dlopen("libleapp_warp_torch.so")`` in C++
(docs/aoti.md).

NOTE: nothing process-wide changes. Inductor options go through
``aoti_compile_and_package(inductor_configs=...)`` (scoped by torch; the
``aot_inductor.metadata`` dict torch writes into is a copy), the
package is written into a temporary folder next to the output and renamed into
place, so a failed compile leaves no file behind.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from leapp._export.paths import artifact_path
from leapp.errors import ExportError
from leapp.pipeline_format import PIPELINE_FILE, PipelineError, read_pipeline, sha256_file

log = logging.getLogger(__name__)

__all__ = ["PACKAGE_SUFFIX", "package", "package_path", "compiler_configs", "recorded_path"]

PACKAGE_SUFFIX = ".aoti.pt2"


def package_path(folder: str | Path, node: str, out: str | Path | None = None) -> Path:
    """Where ``package`` writes: ``out`` (a ``.pt2`` file, or a folder), else ``<folder>/<node>.aoti.pt2``.

    The node name comes from an untrusted pipeline.yaml, so a generated file name goes through the
    exporter's path rule (``artifact_path``: one plain name, directly inside its folder). A file the
    user names must end in ``.pt2`` (torch's rule), sit in an existing folder and not be a symbolic
    link that leads out of that folder.
    """
    what = f"node '{node}' of {folder}"
    if out is None:
        return artifact_path(folder, node, PACKAGE_SUFFIX, what)
    out = Path(out)
    if out.is_dir():
        return artifact_path(out, node, PACKAGE_SUFFIX, what)
    if out.suffix != ".pt2":
        raise ExportError(f"{what}: the output {out} must end in .pt2 (AOTInductor packages are .pt2 archives)")
    if not out.parent.is_dir():
        raise ExportError(f"{what}: the output folder {out.parent} does not exist")
    parent = out.parent.resolve()
    resolved = out.resolve()
    if resolved.parent != parent:
        raise ExportError(
            f"{what}: {out} resolves to {resolved}, outside {parent}; leapp writes only inside that folder "
            "(is the path a symbolic link?)"
        )
    return out


def compiler_configs(inductor_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``inductor_configs`` plus what makes Inductor's C++ compiler link the process's shared C++ runtime.

    A compiler whose links carry a private, static copy of libstdc++ makes packages that cannot be
    loaded (``Error: std::bad_cast`` from the package's container, or a crash at load). When the probe link (``leapp._export.cxx_runtime``) shows one, ``-l:libstdc++.so.6``
    is added through ``aot_inductor.custom_op_libs``; when even that link carries a private copy,
    ExportError names the compiler.
    """
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder

    from leapp._export.cxx_runtime import probe_compiler

    configs = dict(inductor_configs or {})
    try:
        with inductor_config.patch(configs):  # scoped: the compiler the user's options select, nothing kept
            try:
                compiler = cpp_builder.get_cpp_compiler()
            except Exception:  # noqa: BLE001 - no usable compiler: Inductor raises its own error, wrapped by package()
                return configs
            existing = list(getattr(inductor_config.aot_inductor, "custom_op_libs", None) or [])
    except AttributeError as e:  # an option this torch does not have
        raise ExportError(f"inductor_configs: {e}") from e
    probe = probe_compiler(compiler)
    if not probe.private:
        return configs
    can_add = hasattr(inductor_config.aot_inductor, "custom_op_libs")
    if probe.fix is None or not can_add:
        why = (f"adding -l:libstdc++.so.6 did not help ({probe.detail.strip()[-500:]})" if can_add
               else "this torch has no aot_inductor.custom_op_libs option to link the shared one")
        raise ExportError(
            f"the C++ compiler Inductor uses ({compiler}: $CXX or torch._inductor.config.cpp.cxx) links a private, "
            f"static copy of libstdc++ into every shared library, and {why}; such AOTInductor packages fail to "
            "load. Set CXX to a compiler with a shared libstdc++ (e.g. CXX=/usr/bin/g++) and run again"
        )
    configs["aot_inductor.custom_op_libs"] = existing + [lib for lib in probe.fix if lib not in existing]
    return configs


def _find_node(folder: Path, desc: dict, node: str) -> tuple[int, dict]:
    names = [entry["name"] for entry in desc["nodes"]]
    for index, entry in enumerate(desc["nodes"]):
        if entry["name"] == node:
            if entry["backend"] != "pt2":
                raise PipelineError(
                    f"{folder / PIPELINE_FILE}: node '{node}' is a {entry['backend']} node ({entry['artifact']}); "
                    "AOTInductor packages are made from PT2 nodes (leapp.node(..., export_with='pt2'))"
                )
            return index, entry
    raise PipelineError(f"{folder / PIPELINE_FILE}: no node named {node!r} (nodes: {', '.join(names) or 'none'})")


def unrunnable_segments(desc: dict, entry: dict) -> str | None:
    """Why a package of node ``entry`` could never run its Warp segments, or None: a node recorded on the CPU
    compiles into a CPU package, which runs its segments only from their CPU code (docs/export-cpu.md); a
    segment without CPU code for this machine replays on CUDA devices only (the C++ pipeline refuses such a
    package at open)."""
    from leapp.bundle.format import segment_runs_on_this_cpu

    segments = entry.get("segments") or []
    device = str(entry.get("device", ""))
    if not segments or device.startswith("cuda"):
        return None
    without = [s.get("id", "?") for s in segments if not segment_runs_on_this_cpu(s)]
    if not without:
        return None
    return (f"pipeline '{desc['name']}' node '{entry['name']}' has {len(segments)} Warp segment(s) recorded on "
            f"{device}, and {without} hold no CPU code for this machine, so they replay on CUDA devices only: its "
            f"AOTInductor package for {device} cannot run them. Export the node with CPU code (docs/export-cpu.md), "
            "or record it on a CUDA device and run `leapp aoti` on that export")


def package(export_dir: str | Path, node: str, out: str | Path | None = None, *,
            inductor_configs: Mapping[str, Any] | None = None, record: bool = True) -> Path:
    """Compiles PT2 node ``node`` of the export folder ``export_dir`` into an AOTInductor package; returns its path.

    The folder is read as ``leapp.load`` reads it (pipeline.yaml checked, the artifact's path kept in
    the folder and its sha256 compared). The package is for the device the node was exported on and
    runs the node's Warp segments through ``libleapp_warp_torch.so``. ``out``: see ``package_path``.
    ``inductor_configs`` are passed to torch (never set globally).

    With ``record`` (the default) a package written inside the export folder is recorded in the
    node's ``aoti`` entry of pipeline.yaml and pipeline.json (path, sha256, torch version): the C++
    runner (``leapp-run``, docs/deploy.md) runs the node from it after checking its sha256. A package
    written elsewhere is not recorded.

    A node whose Warp segments were recorded on the CPU still compiles, with a RuntimeWarning
    (``unrunnable_segments``): the package cannot run them (and the C++ runner refuses it at open).

    Raises:
        FileNotFoundError: no pipeline.yaml in ``export_dir``.
        PipelineError: an unknown node, a node that is not PT2, a changed or missing artifact, a
            pipeline.yaml that breaks its rules, or a .pt2 torch cannot load.
        ExportError: a bad output path, a compiler whose private C++ runtime cannot be replaced by
            the shared one (naming it), or a failed AOTInductor compile (naming the node).
    """
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import aoti_compile_and_package

    from leapp.pipeline_format import read_checked
    from leapp.runtime.artifact_safety import UnsafeArtifact
    from leapp.runtime.runners import load_pt2

    folder, desc = read_pipeline(export_dir)
    yaml_sha256 = sha256_file(folder / PIPELINE_FILE)
    index, entry = _find_node(folder, desc, node)
    where = f"pipeline '{desc['name']}' node '{node}'"
    problem = unrunnable_segments(desc, entry)
    if problem is not None:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    yaml_file = folder / PIPELINE_FILE
    checked = read_checked(folder, entry["artifact"], entry["sha256"], where, f"{yaml_file}: nodes[{index}].artifact")
    artifact = checked.path
    target = package_path(folder, node, out)
    configs = compiler_configs(inductor_configs)
    # torch writes the package's device and platform into aot_inductor.metadata in place (2.13:
    # _inductor/codecache.py), so the global dict would keep them: the compile gets its own copy
    configs["aot_inductor.metadata"] = dict(configs.get("aot_inductor.metadata", inductor_config.aot_inductor.metadata))
    try:
        program = load_pt2(artifact, checked.data)
    except UnsafeArtifact as e:  # refused before torch opened it
        raise PipelineError(f"{where}: {e}") from e
    except Exception as e:  # torch, zipfile and pickle errors have no common base
        raise PipelineError(f"{where}: cannot load {artifact} with torch.export.load: {type(e).__name__}: {e}") from e
    if program.example_inputs is None:  # leapp's .pt2 stores none (its size must not grow with N); AOTI wants some
        from leapp._export.pt2_export import zero_example_inputs

        program.example_inputs = zero_example_inputs(program)
    log.info("%s: compiling %s with AOTInductor into %s", where, artifact.name, target)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".leapp-aoti-") as tmp:
        staged = Path(tmp) / target.name
        try:
            aoti_compile_and_package(program, package_path=str(staged), inductor_configs=configs)
        except Exception as e:  # Inductor raises many types (InductorError, CppCompileError, ...)
            raise ExportError(
                f"{where} ({artifact}): AOTInductor could not compile the node: {type(e).__name__}: {e}"
            ) from e
        package_sha256 = sha256_file(staged)
        os.replace(staged, target)
    recorded = record and recorded_path(folder, target) is not None
    log.info("%s: AOTInductor package %s written in %.2f s%s", where, target.name, time.perf_counter() - start,
             "; recorded in pipeline.yaml" if recorded else "")
    if record:
        _record(folder, desc, yaml_sha256, index, target, package_sha256, str(torch.__version__))
    return target


def recorded_path(folder: Path, target: Path) -> str | None:
    """``target`` as a path relative to the export folder (``/``-separated), or None when it lies outside it."""
    try:
        return target.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


def _record(folder: Path, desc: dict, yaml_sha256: str, index: int, target: Path, sha256: str, torch_version: str) -> None:
    """Writes the package into node ``index``'s ``aoti`` entry of pipeline.yaml (and pipeline.json), when it is in the folder.

    The entry (``{path, sha256, torch}``) is how the C++ runner finds the package and checks it before
    loading it: the export stays self-verifying. pipeline.yaml is rewritten with the exporter's writer
    (read back and compared before anything is written) and replaced atomically, then its twin;
    a pipeline.yaml changed since this command read it is not overwritten.
    """
    rel = recorded_path(folder, target)
    if rel is None:
        return
    from leapp._export.pipeline_yaml import dump_pipeline_yaml
    from leapp.pipeline_format import write_twin

    node = desc["nodes"][index]
    node["aoti"] = {"path": rel, "sha256": sha256, "torch": torch_version}
    yaml_file = folder / PIPELINE_FILE
    if sha256_file(yaml_file) != yaml_sha256:
        raise ExportError(
            f"{yaml_file} changed while `leapp aoti` compiled node '{node['name']}'; the package {target} "
            "is not recorded in it: run the command again"
        )
    dump_pipeline_yaml(desc)  # checks what write_twin writes
    write_twin(folder, desc)

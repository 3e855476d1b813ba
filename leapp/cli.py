"""leapp/cli.py: the ``leapp`` command: ``leapp inspect PATH``, ``leapp doctor`` and ``leapp aoti EXPORT_DIR NODE``.

NOTE: ``inspect`` reads artifacts without running them, so it works where
there is no GPU, no Warp and no torch: bundles through ``leapp.bundle``, ONNX
through the ``onnx`` package, PT2 archives (zip files) by reading their
entries (the graph JSON for ``leapp::warp_segment`` calls and every stored
tensor that holds a bundle), export folders through ``leapp.pipeline_format``
(the reader ``leapp.load`` uses; no path it names is opened before it passes
the containment rule). Each problem it finds is printed as an ``error:`` line
and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from leapp.bundle import Bundle, BundleError, parse_signature, read_bundle, signature_json
from leapp.bundle.describe import describe_bundle, format_bytes
from leapp.bundle.format import HEADER, MAGIC
from leapp.pipeline_format import PIPELINE_FILE, PipelineError, contained_path, read_pipeline, sha256_file

__all__ = ["main", "inspect_path", "doctor", "aoti"]

ONNX_DOMAIN = "leapp.warp"
ONNX_OP = "WarpSegment"
PT2_OP_TARGET = "torch.ops.leapp.warp_segment"


class _Report:
    """Indented lines on ``out``; counts the problems (``error:`` lines)."""

    def __init__(self, out: TextIO):
        self.out = out
        self.problems = 0
        self.digests: set[str] = set()  # of every bundle read and described

    def line(self, text: str, indent: int = 0) -> None:
        print("  " * indent + text, file=self.out)

    def lines(self, texts: list[str], indent: int = 0) -> None:
        for text in texts:
            self.line(text, indent)

    def problem(self, text: str, indent: int = 0) -> None:
        self.problems += 1
        self.line(f"error: {text}", indent)


# --- bundles and signatures ------------------------------------------------------------------------------


def _check_signature(report: _Report, where: str, text: str | None, bundle: Bundle | None, indent: int) -> None:
    """The signature string must parse and describe ``bundle`` exactly (digest, segment, tensors)."""
    if text is None:
        report.problem(f"{where}: no signature", indent)
        return
    try:
        sig = parse_signature(text)
    except BundleError as e:
        report.problem(f"{where}: {e}", indent)
        return
    if bundle is None:
        return
    if sig["digest"] != bundle.digest:
        report.problem(f"{where}: signature digest {sig['digest']} differs from the bundle's {bundle.digest}", indent)
    elif sig != json.loads(signature_json(bundle)):
        report.problem(f"{where}: signature {text} differs from the bundle's {signature_json(bundle)}", indent)
    else:
        report.line(f"signature matches the bundle (digest {bundle.digest[:16]}...)", indent)


def _read(report: _Report, where: str, data: bytes, indent: int) -> Bundle | None:
    try:
        bundle = read_bundle(data)
    except BundleError as e:
        report.problem(f"{where}: {e}", indent)
        return None
    report.lines(describe_bundle(bundle, len(data)), indent)
    report.digests.add(bundle.digest)
    return bundle


def _inspect_bundle_file(path: Path, report: _Report, indent: int) -> None:
    data = path.read_bytes()
    report.line(f"{path.name}: leapp segment bundle, {format_bytes(len(data))}", indent)
    bundle = _read(report, str(path), data, indent + 1)
    if bundle is not None:
        report.line(f"signature: {signature_json(bundle)}", indent + 1)


# --- ONNX ------------------------------------------------------------------------------------------------


def _walk_graphs(graph) -> Iterator[Any]:
    """The graph and every subgraph of If/Loop/Scan attributes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_graphs(attr.g)
            for sub in attr.graphs:
                yield from _walk_graphs(sub)


def _onnx_dtype(onnx, elem_type: int) -> str:
    """torch-style names (float32, not FLOAT) so ONNX and bundle dtypes read alike."""
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"


def _value_text(value, onnx) -> str:
    tensor = value.type.tensor_type
    dtype = _onnx_dtype(onnx, tensor.elem_type)
    dims = [d.dim_param or d.dim_value for d in tensor.shape.dim] if tensor.HasField("shape") else "?"
    return f"{value.name}: {dtype}{dims}"


def _inspect_onnx(path: Path, report: _Report, indent: int) -> None:
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        report.problem(f"{path}: the onnx package is needed to inspect ONNX models ({e})", indent)
        return
    try:
        model = onnx.load(str(path))  # external data is read from files next to the model
    except Exception as e:  # noqa: BLE001 - protobuf and external-data errors have no common base
        report.problem(f"{path}: corrupt or truncated: cannot load as ONNX: {type(e).__name__}: {e}", indent)
        return
    try:  # protobuf parses some truncations (an empty file is an empty model): the checker does not
        onnx.checker.check_model(str(path))
    except Exception as e:  # noqa: BLE001 - ValidationError, or the external data's own errors
        report.problem(f"{path}: corrupt or truncated: the ONNX checker refuses it: {type(e).__name__}: {e}", indent)
        return
    graphs = list(_walk_graphs(model.graph))
    nodes = [n for g in graphs for n in g.node]
    initializers = {t.name: t for g in graphs for t in g.initializer}
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = f"; producer {model.producer_name} {model.producer_version}".rstrip() if model.producer_name else ""
    report.line(
        f"{path.name}: ONNX model, {format_bytes(path.stat().st_size)} (ir_version {model.ir_version}; "
        f"opsets {opsets}{producer})",
        indent,
    )
    report.line("inputs: " + ("; ".join(_value_text(v, onnx) for v in model.graph.input) or "none"), indent + 1)
    report.line("outputs: " + ("; ".join(_value_text(v, onnx) for v in model.graph.output) or "none"), indent + 1)
    counts = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in nodes)
    report.line(f"nodes: {len(nodes)} (" + ", ".join(f"{k} x{v}" for k, v in counts.most_common()) + ")", indent + 1)
    segments = [n for n in nodes if n.domain == ONNX_DOMAIN and n.op_type == ONNX_OP]
    if not segments:
        report.line(f"no {ONNX_DOMAIN} {ONNX_OP} nodes", indent + 1)
    for number, node in enumerate(segments):
        name = node.name or f"#{number}"
        where = f"{path.name}: node {name}"
        bundle_input = node.input[-1] if node.input else None
        report.line(
            f"node {name} ({ONNX_DOMAIN}::{ONNX_OP}): inputs {list(node.input[:-1])}, bundle '{bundle_input}', "
            f"outputs {list(node.output)}",
            indent + 1,
        )
        signature = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "signature"), None)
        tensor = initializers.get(bundle_input)
        bundle = None
        if tensor is None:
            report.problem(f"{where}: its last input '{bundle_input}' (the bundle) is not an initializer", indent + 2)
        elif tensor.data_type != onnx.TensorProto.UINT8:
            dtype = _onnx_dtype(onnx, tensor.data_type)
            report.problem(f"{where}: bundle initializer '{bundle_input}' is {dtype}, expected uint8", indent + 2)
        else:
            try:
                data = numpy_helper.to_array(tensor, base_dir=str(path.parent)).tobytes()
            except Exception as e:  # noqa: BLE001 - missing external data files, bad raw data
                report.problem(f"{where}: cannot read bundle initializer '{bundle_input}': {e}", indent + 2)
            else:
                bundle = _read(report, where, data, indent + 2)
        _check_signature(report, where, signature, bundle, indent + 2)
        if bundle is not None and (len(node.input) - 1, len(node.output)) != (len(bundle.inputs), len(bundle.outputs)):
            report.problem(
                f"{where}: {len(node.input) - 1} inputs and {len(node.output)} outputs, but the bundle has "
                f"{len(bundle.inputs)} and {len(bundle.outputs)}",
                indent + 2,
            )


# --- PT2 (and any zip archive) ---------------------------------------------------------------------------


def _magic_offsets(data: bytes) -> Iterator[int]:
    start = data.find(MAGIC)
    while start >= 0:
        yield start
        start = data.find(MAGIC, start + 1)


def _find_calls(obj: Any) -> Iterator[dict]:
    """Serialized FX nodes (dicts) whose target is the leapp::warp_segment op, anywhere in a JSON document."""
    if isinstance(obj, dict):
        target = obj.get("target")
        if isinstance(target, str) and target.startswith(PT2_OP_TARGET) and isinstance(obj.get("inputs"), list):
            yield obj
        for value in obj.values():
            yield from _find_calls(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _find_calls(value)


def _tensor_names(arg: Any) -> list[str]:
    if not isinstance(arg, dict):
        return []
    if isinstance(arg.get("as_tensor"), dict):
        return [str(arg["as_tensor"].get("name"))]
    return [str(t.get("name")) for t in arg.get("as_tensors", []) if isinstance(t, dict)]


def _pt2_calls(archive: zipfile.ZipFile) -> list[dict]:
    calls = []
    for info in archive.infolist():
        if not info.filename.endswith(".json"):
            continue
        raw = archive.read(info)
        if PT2_OP_TARGET.encode() not in raw:
            continue
        try:
            document = json.loads(raw)
        except ValueError:
            continue
        for node in _find_calls(document):
            args = {a.get("name"): a.get("arg") for a in node["inputs"] if isinstance(a, dict)}
            signature = args.get("signature")
            calls.append({
                "name": node.get("name", "?"),
                "inputs": _tensor_names(args.get("inputs")),
                "bundle": (_tensor_names(args.get("bundle")) or ["?"])[0],
                "outputs": [n for out in node.get("outputs", []) for n in _tensor_names(out)],
                "signature": signature.get("as_string") if isinstance(signature, dict) else None,
            })
    return calls


def _pt2_entry_names(archive: zipfile.ZipFile) -> dict[str, str]:
    """Archive entry -> the module attribute (buffer/constant FQN) stored there, from the weights/constants configs."""
    names = {}
    for info in archive.infolist():
        if not info.filename.endswith(("model_weights_config.json", "model_constants_config.json")):
            continue
        try:
            config = json.loads(archive.read(info)).get("config", {})
        except (ValueError, AttributeError):
            continue
        folder = info.filename.rsplit("/", 1)[0]
        for fqn, entry in config.items() if isinstance(config, dict) else ():
            if isinstance(entry, dict) and "path_name" in entry:
                names[f"{folder}/{entry['path_name']}"] = fqn
    return names


_EOCD = b"PK\x05\x06"  # end of central directory record
_EOCD_SIZE = 22
# what reading a damaged entry raises: bad headers or CRC, bad deflate data, short reads, unknown methods
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError)


def _zip_damage(path: Path, archive: zipfile.ZipFile) -> str | None:
    """Why ``archive``'s directory does not describe all of ``path`` (truncated or damaged), else None.

    zipfile finds a directory by searching backwards, so a truncated PT2 archive can open as the
    archive stored inside it (its sample-inputs ``.pt``) and list none of the outer entries.
    torch writes archives from byte 0 with the end record last.
    """
    size = path.stat().st_size
    tail = _EOCD_SIZE + len(archive.comment)
    with path.open("rb") as f:
        f.seek(max(size - tail, 0))
        record = f.read(4)
    if size < tail or record != _EOCD:
        return "its end-of-central-directory record is not at the end of the file"
    entries = archive.infolist()
    if entries and min(info.header_offset for info in entries) != 0:
        return "its first entry does not start at byte 0"
    return None


def _inspect_zip(path: Path, report: _Report, indent: int, kind: str) -> None:
    try:
        archive = zipfile.ZipFile(path)
        damage = _zip_damage(path, archive)
    except _ZIP_ERRORS as e:
        report.problem(f"{path}: corrupt or truncated: not a readable {kind} archive ({e})", indent)
        return
    with archive:
        if damage:
            report.problem(f"{path}: corrupt or truncated {kind} archive: {damage}", indent)
            return
        try:
            _describe_archive(path, archive, report, indent, kind)
        except _ZIP_ERRORS as e:  # an entry that cannot be read back (CRC, header, deflate data)
            report.problem(f"{path}: corrupt or truncated {kind} archive: {type(e).__name__}: {e}", indent + 1)


def _describe_archive(path: Path, archive: zipfile.ZipFile, report: _Report, indent: int, kind: str) -> None:
    entries = archive.infolist()
    report.line(f"{path.name}: {kind} archive, {format_bytes(path.stat().st_size)}, {len(entries)} entries", indent)
    calls = _pt2_calls(archive)
    entry_names = _pt2_entry_names(archive)
    report.line(f"leapp::warp_segment calls: {len(calls)}", indent + 1)
    for call in calls:
        report.line(
            f"call {call['name']}: inputs {call['inputs']}, bundle '{call['bundle']}', outputs {call['outputs']}",
            indent + 2,
        )
    bundles: dict[str, Bundle] = {}
    found = 0
    for info in entries:
        data = archive.read(info)
        for offset in _magic_offsets(data):
            if offset + HEADER.size > len(data):
                continue
            size = HEADER.unpack_from(data, offset)[3]
            label = info.filename + (f" @{offset}" if offset else "")
            if info.filename in entry_names:
                label += f" (tensor {entry_names[info.filename]})"
            try:
                bundle = read_bundle(data[offset:offset + size])
            except BundleError as e:
                if offset == 0:  # an entry that starts like a bundle but is not one: corrupt
                    report.problem(f"{path.name}: {label}: {e}", indent + 1)
                continue  # the magic bytes inside unrelated data
            found += 1
            report.line(f"bundle in {label}:", indent + 1)
            report.lines(describe_bundle(bundle, size), indent + 2)
            report.digests.add(bundle.digest)
            bundles[bundle.digest] = bundle
    if not found:
        report.line("no segment bundles", indent + 1)
    for call in calls:
        where = f"{path.name}: call {call['name']}"
        try:
            digest = parse_signature(call["signature"] or "")["digest"]
        except BundleError:
            digest = None
        bundle = bundles.get(digest) if digest else None
        if digest and bundle is None:
            report.problem(f"{where}: no bundle in the archive has the signature's digest {digest}", indent + 1)
        report.line(f"call {call['name']}:", indent + 1)
        _check_signature(report, where, call["signature"], bundle, indent + 2)


# --- export folders --------------------------------------------------------------------------------------


def _tensor_list(entries: list[dict]) -> str:
    return "; ".join(f"{e['name']}: {e['dtype']}{e['shape']}" for e in entries) or "none"


def _inspect_dir(path: Path, report: _Report, indent: int) -> None:
    pipeline_file = path / PIPELINE_FILE
    if not pipeline_file.is_file():
        artifacts = sorted(p for p in path.iterdir() if p.suffix in _INSPECTORS)
        report.line(f"{path}: no {PIPELINE_FILE}; inspecting {len(artifacts)} artifact files", indent)
        for artifact in artifacts:
            try:
                contained_path(path, artifact.name, str(artifact))  # a symlink out of the folder is not followed
            except PipelineError as e:
                report.problem(str(e), indent + 1)
                continue
            _inspect_file(artifact, report, indent + 1)
        return
    try:
        _, pipeline = read_pipeline(path)
    except PipelineError as e:
        report.problem(str(e), indent)
        return
    except OSError as e:  # unreadable (permissions), or gone since the check above
        report.problem(f"{pipeline_file}: cannot read: {e}", indent)
        return
    report.line(f"pipeline {pipeline['name']} ({pipeline['format']} v{pipeline['version']}) in {path}", indent)
    if pipeline["producer"]:
        report.line("producer: " + ", ".join(f"{k} {v}" for k, v in pipeline["producer"].items()), indent + 1)
    report.line(f"inputs: {_tensor_list(pipeline['inputs'])}", indent + 1)
    report.line(f"outputs: {_tensor_list(pipeline['outputs'])}", indent + 1)
    for edge in pipeline["edges"]:
        feedback = " (feedback)" if edge.get("feedback") else ""
        report.line(
            f"edge {edge['from_node']}.{edge['from_output']} -> {edge['to_node']}.{edge['to_input']}{feedback}", indent + 1
        )
    report.line(f"nodes: {len(pipeline['nodes'])}", indent + 1)
    for index, node in enumerate(pipeline["nodes"]):
        _inspect_pipeline_node(path, index, node, report, indent + 2)


def _inspect_pipeline_node(folder: Path, index: int, node: dict, report: _Report, indent: int) -> None:
    """One checked node entry: its files (contained, present, sha256) and its artifact's contents."""
    name = node["name"]
    report.line(f"node {name}: backend {node['backend']}, artifact {node['artifact']}", indent)
    report.line(f"inputs: {_tensor_list(node['inputs'])}", indent + 1)
    report.line(f"outputs: {_tensor_list(node['outputs'])}", indent + 1)
    for seg in node["segments"]:
        report.line(f"segment {seg['id']}: digest {seg['digest']}, kernels {seg['kernels']}", indent + 1)
    entries = [(node["artifact"], node["sha256"], f"nodes[{index}].artifact")] + [
        (entry["path"], entry["sha256"], f"nodes[{index}].files[{i}].path") for i, entry in enumerate(node["files"])
    ]
    artifact = None
    for number, (rel, expected, field) in enumerate(entries):
        try:  # before anything touches the file: an outside path is refused, never reported missing or different
            file = contained_path(folder, rel, f"node {name}: {PIPELINE_FILE} {field}")
        except PipelineError as e:
            report.problem(str(e), indent + 1)
            continue
        if not file.is_file():
            report.problem(f"node {name}: {rel} is missing", indent + 1)
            continue
        if sha256_file(file) != expected:
            report.problem(f"node {name}: {rel} sha256 differs from pipeline.yaml's {expected}", indent + 1)
        if number == 0:
            artifact = file
    if artifact is not None:
        before = report.problems
        digests = _inspect_file(artifact, report, indent + 1)
        for seg in node["segments"]:
            if seg["digest"] not in digests and report.problems == before:
                report.problem(
                    f"node {name}: segment {seg['id']} (digest {seg['digest']}) is not in {artifact.name}", indent + 1
                )


# --- dispatch --------------------------------------------------------------------------------------------


def _inspect_pt2(path: Path, report: _Report, indent: int) -> None:
    _inspect_zip(path, report, indent, "PT2")


def _inspect_torchscript(path: Path, report: _Report, indent: int) -> None:
    _inspect_zip(path, report, indent, "TorchScript")


_INSPECTORS = {".lwb": _inspect_bundle_file, ".onnx": _inspect_onnx, ".pt2": _inspect_pt2, ".pt": _inspect_torchscript}


def _inspect_file(path: Path, report: _Report, indent: int = 0) -> set[str]:
    """Inspects one artifact; returns the digests of the bundles it holds."""
    digests_before = set(report.digests)
    suffix = path.suffix.lower()
    inspector = _INSPECTORS.get(suffix)
    if inspector is None:
        with path.open("rb") as f:
            head = f.read(8)
        if head == MAGIC:
            inspector = _inspect_bundle_file
        elif head.startswith(b"PK\x03\x04"):
            inspector = _inspect_pt2
        else:
            report.problem(f"{path}: not a bundle (.lwb), ONNX (.onnx), PT2 (.pt2) or TorchScript (.pt) file", indent)
            return set()
    inspector(path, report, indent)
    return report.digests - digests_before


def inspect_path(path: str | Path, out: TextIO | None = None) -> int:
    """Prints what ``path`` (bundle, ONNX, PT2, TorchScript or export folder) holds; returns the problem count."""
    report = _Report(out if out is not None else sys.stdout)
    path = Path(path)
    if path.is_dir():
        _inspect_dir(path, report, 0)
    elif path.is_file():
        _inspect_file(path, report, 0)
    else:
        report.problem(f"{path}: no such file or directory")
    return report.problems


# --- doctor ----------------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def doctor(out: TextIO | None = None) -> int:
    """Prints the CUDA driver, devices, op libraries and package versions; returns the problem count.

    A machine without a driver is reported, not a problem: export works there, GPU replay does not.
    """
    report = _Report(out if out is not None else sys.stdout)
    report.line(f"leapp {_version('leapp')} (Python {sys.version.split()[0]})")
    try:
        from leapp import _native
    except ImportError as e:
        report.problem(f"native module leapp._native cannot be imported: {e} (rebuild: pip install -e .)")
        return report.problems
    report.line(f"native module: {_native.__file__}")
    status = _native.driver_status()
    if status["available"]:
        version = int(status["version"])
        report.line(f"CUDA driver: available, CUDA {version // 1000}.{version % 1000 // 10} ({version})")
        devices = status["devices"]
        if not devices:
            report.line("devices: none (the driver sees no GPU)", 1)
        for device in devices:
            major, minor = device["compute_capability"]
            report.line(f"device {device['ordinal']}: {device['name']}, compute capability {major}.{minor} "
                        f"(bundle arch {10 * major + minor})", 1)
    else:
        report.line(f"CUDA driver: not available ({status['error']})")
        report.line("export and CPU tests work; replaying Warp segments needs an NVIDIA driver", 1)
    try:
        from leapp.runtime import libraries

        for backend in ("pt2", "onnx"):
            path = libraries.library_path(backend)
            state = "found" if path.is_file() else "MISSING"
            report.line(f"{backend} op library: {path} ({state})")
    except Exception as e:  # noqa: BLE001 - diagnostics must not fail
        report.line(f"op libraries: cannot locate ({e})")
    versions = ", ".join(f"{d} {_version(d)}" for d in ("torch", "warp-lang", "onnx", "onnxruntime"))
    report.line(f"packages: {versions}")
    return report.problems


# --- aoti ------------------------------------------------------------------------------------------------


def aoti(export_dir: str, node: str, out: str | None = None, err: TextIO | None = None) -> int:
    """``leapp aoti``: writes the AOTInductor package of a PT2 node (``leapp.aoti.package``); prints its path.

    Returns 0, or 1 after printing the reason (bad folder, node, artifact, output path or compile).
    """
    from leapp import aoti as _aoti  # noqa: PLC0415 - its package() imports torch; other commands need none
    from leapp.errors import LeappError  # noqa: PLC0415

    err = err if err is not None else sys.stderr
    try:
        path = _aoti.package(export_dir, node, out)
    except ImportError as e:
        print(f"leapp aoti: error: AOTInductor packages need torch with Inductor ({type(e).__name__}: {e})", file=err)
        return 1
    except (LeappError, FileNotFoundError) as e:
        print(f"leapp aoti: error: {e}", file=err)
        return 1
    print(path)
    folder = Path(export_dir) if Path(export_dir).is_dir() else Path(export_dir).parent
    if _aoti.recorded_path(folder, path) is None:
        print(f"leapp aoti: note: {path} is outside {export_dir}, so pipeline.yaml does not record it and "
              "leapp's C++ runner will not use it (docs/aoti.md)", file=err)
    return 0


# --- entry point -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leapp",
        description="leapp: exported PyTorch + Warp pipelines.",
        epilog="The native op libraries are built and checked by a second command:\n"
        "  leapp-build-warp-runtime [--status]   (--status: which libraries exist, where, and the driver state)",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the command's name on one line
    )
    parser.add_argument("--version", action="version", version=f"leapp {_version('leapp')}")
    parser.add_argument("--cmake-dir", action=_PrintCmakeDir,
                        help="print the folder holding leappConfig.cmake (find_package(leapp): docs/deploy.md) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect",
        help="describe a bundle, ONNX model, PT2 archive or export folder",
        description="Describe the Warp segments an artifact holds: kernels, buffers, ops, binaries, versions. "
        "Exit status 1 when a bundle is corrupt or disagrees with its signature or pipeline.yaml.",
    )
    inspect.add_argument("path", help="a .lwb bundle, .onnx, .pt2 or .pt file, or an export folder with pipeline.yaml")
    commands.add_parser("doctor", help="report the CUDA driver, devices and op libraries",
                        description="Report the CUDA driver, devices, op libraries and package versions.")
    aoti_parser = commands.add_parser(
        "aoti",
        help="compile a PT2 node of an export folder into an AOTInductor package",
        description="Compile PT2 node NODE of EXPORT_DIR with AOTInductor (torch._inductor.aoti_compile_and_package) "
        "into a .pt2 package that torch._inductor.aoti_load_package and C++'s AOTIModelPackageLoader load "
        "(after registering leapp::warp_segment: import leapp, or dlopen libleapp_warp_torch.so). "
        "Prints the package's path.",
    )
    aoti_parser.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    aoti_parser.add_argument("node", metavar="NODE", help="the name of a PT2 node in it")
    aoti_parser.add_argument("-o", "--output", metavar="OUT", default=None,
                             help="the package file (ending in .pt2) or a folder; default EXPORT_DIR/NODE.aoti.pt2")
    write_json = commands.add_parser(
        "write-json",
        help="write pipeline.json, the JSON twin of pipeline.yaml that the C++ runner reads",
        description="Read EXPORT_DIR/pipeline.yaml (checked as leapp.load checks it) and write EXPORT_DIR/pipeline.json: "
        "the same description plus the sha256 of pipeline.yaml (docs/pipeline-format.md, 'pipeline.json'). "
        "Exports made by this leapp have it already; run this after editing pipeline.yaml or for older exports.",
    )
    write_json.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    return parser


class _PrintCmakeDir(argparse.Action):
    """``leapp --cmake-dir``: like ``--version``, it prints and exits without a command."""

    def __init__(self, option_strings, dest, help=None):  # noqa: A002 - argparse's name
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from leapp.runtime.libraries import native_dir

        folder = native_dir() / "cmake"
        if not (folder / "leappConfig.cmake").is_file():
            parser.exit(1, f"leapp: {folder}/leappConfig.cmake is missing: this build has no C++ pipeline library "
                           "(it needs ONNX Runtime's headers: bash scripts/fetch-ort-headers.sh, then reinstall)\n")
        print(folder)  # stdout: cmake -Dleapp_DIR="$(leapp --cmake-dir)"
        parser.exit(0)


def _write_json(export_dir: str) -> int:
    from leapp.pipeline_format import PipelineError, write_twin

    try:
        print(write_twin(export_dir))
    except (PipelineError, FileNotFoundError) as e:
        print(f"leapp write-json: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``leapp`` console script; returns the exit status (0 ok, 1 problems found, 2 usage)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "inspect":
            return 1 if inspect_path(args.path) else 0
        if args.command == "aoti":
            return aoti(args.export_dir, args.node, args.output)
        if args.command == "write-json":
            return _write_json(args.export_dir)
        return 1 if doctor() else 0
    except BrokenPipeError:  # `leapp inspect x | head`: stop quietly, as other command-line tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())

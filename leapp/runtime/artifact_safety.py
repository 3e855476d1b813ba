"""leapp/runtime/artifact_safety.py: what leapp checks in a node's artifact before a third-party loader opens it.

An export folder may come from anywhere. pipeline.yaml's sha256 proves only that a file is the one
the folder names, and the loaders trust their files further than leapp's exporter ever needs:

- **PT2** (``check_pt2_archive``). ``torch.export.load`` unpickles payloads marked ``use_pickle``
  with Python's full unpickler (``torch.load(weights_only=False)``), opaque objects with
  ``pickle.loads``, sample inputs and pre-2.8 files with a fallback to the full unpickler when the
  weights-only one refuses them, and it loads (``dlopen``) any AOTInductor model under
  ``data/aotinductor/``. A pickle can call any function it names and a shared library runs its
  initialisers, so a crafted archive would run its code on load. leapp's exporter writes none of
  these (raw tensor bytes, empty sample inputs, AOTInductor packages as separate files): an archive
  passes only when every member is one torch.export.save writes for a plain program (an allowlist
  of folders), stored uncompressed (no zip bomb), and every pickle in it (declared in the weights
  or constants config, or a ``.pt`` file) loads with torch's weights-only unpickler, which is then
  what torch's own load does with those bytes. Custom and opaque objects are refused.
- **ONNX** (``check_onnx_external_data``). A tensor may keep its bytes in another file
  (``data_location: EXTERNAL``, key ``location``), which ONNX Runtime reads relative to the model.
  ORT keeps that path inside the model's folder only from 1.24 on; leapp supports 1.20 and up,
  so a crafted model could name ``../../home/user/.ssh/id_rsa`` and hand its bytes back as an
  output. leapp's exporter lists a node's external files in pipeline.yaml (``files``, each with
  its sha256): every external location, in the graph, node attributes and subgraphs alike, must
  be one of those verified files.

Refusals are ``UnsafeArtifact`` (a PipelineError) naming the file and what in it; a file the
loader could not read anyway gets a plain PipelineError. The cost is a read of the archive's
directory and two small configs, or one parse of the ONNX model without its external data.
"""

from __future__ import annotations

import io
import json
import posixpath
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from leapp.pipeline_format import PipelineError

__all__ = ["MAX_MEMBERS", "UnsafeArtifact", "check_onnx_external_data", "check_pt2_archive", "external_locations"]


class UnsafeArtifact(PipelineError):
    """An artifact its loader would run code from, or read files outside the export through: refused."""


MAX_MEMBERS = 100_000  # torch writes one per weight and constant, plus a dozen
# What torch.export.save writes for a program without AOTInductor code (relative to the archive's root folder).
_ALLOWED = ("archive_format", "archive_version", "byteorder", ".data/", "models/", "data/weights/",
            "data/constants/", "data/sample_inputs/", "extra/")
_CONFIGS = ("data/weights/", "_weights_config.json"), ("data/constants/", "_constants_config.json")
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # torch's CUSTOM_OBJ_ and OPAQUE_OBJ_FILENAME_PREFIX
_TRUST = ("leapp's exporter writes no such data; re-export the node, or, if you trust where the file comes "
          "from, load it with torch.export.load yourself")


def check_pt2_archive(path: str | Path) -> None:
    """Refuses an archive ``torch.export.load`` would run code from: UnsafeArtifact naming the file and the
    member. A file that is not a PT2 archive at all gets a plain PipelineError (corrupt, not hostile)."""
    path = Path(path)

    def refuse(member: str, why: str) -> UnsafeArtifact:
        return UnsafeArtifact(f"{path.name}: {member}: {why}")

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise PipelineError(f"{path.name} is not a PT2 archive (a zip file): {e}") from e
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UnsafeArtifact(f"{path.name}: {len(members)} members, more than {MAX_MEMBERS}")
        roots = {m.filename.split("/", 1)[0] for m in members}
        if len(roots) != 1 or any("/" not in m.filename for m in members):
            raise PipelineError(f"{path.name}: not one root folder as torch.export.save writes "
                                f"(top level: {sorted(roots)[:5]})")
        root = roots.pop() + "/"
        by_name = {}
        for m in members:
            name = m.filename[len(root):]
            if name in by_name:  # which copy a reader takes differs (Python's zipfile the last): one is checked
                raise refuse(name, "stored twice in the archive; torch.export.save writes each member once")
            if m.compress_type != zipfile.ZIP_STORED:
                raise refuse(name, "compressed; torch.export.save stores members uncompressed (a compressed member "
                                   "could expand without bound when torch reads it)")
            if name and not name.endswith("/") and not name.startswith(_ALLOWED):
                detail = (" (an AOTInductor model, which torch.export.load loads as native code)"
                          if name.startswith("data/aotinductor/") else "")
                raise refuse(name, f"not a member of a PT2 program archive{detail}; {_TRUST}")
            by_name[name] = m
        if by_name.get("archive_format") is None or archive.read(by_name["archive_format"]) != b"pt2":
            raise PipelineError(f"{path.name}: no archive_format 'pt2' (not written by torch.export.save "
                                "of torch 2.8 or later, whose older format leapp does not read)")

        pickles = [name for name in by_name if name.endswith(".pt") and by_name[name].file_size > 0]
        for name, member in by_name.items():
            folder = next((f for f, suffix in _CONFIGS if name.startswith(f) and name.endswith(suffix)), None)
            if folder is None:
                continue
            for fqn, payload in _config_entries(archive.read(member), name, refuse):
                file = payload.get("path_name")
                if not isinstance(file, str):
                    raise refuse(name, f"entry {fqn!r} has no path_name")
                read_as = posixpath.join(folder, file)  # the member torch reads for it
                if file.startswith(_OBJECT_PREFIXES):
                    kind = "a custom" if file.startswith("custom") else "an opaque"
                    raise refuse(read_as, f"{kind} object ({fqn!r}), which torch unpickles with a pickler "
                                          f"that can run code; {_TRUST}")
                if payload.get("use_pickle"):  # any true value: torch tests it with `if`
                    pickles.append(read_as)
        if pickles:
            import torch  # noqa: PLC0415 - only an archive with pickles needs it (leapp inspect runs without)
        for name in pickles:
            member = by_name.get(name)
            if member is None:
                raise refuse(name, "named by the archive's config but missing")
            try:
                torch.load(io.BytesIO(archive.read(member)), weights_only=True)
            except Exception as e:  # noqa: BLE001 - any refusal of the weights-only unpickler
                raise refuse(name, f"a pickle torch's weights-only unpickler refuses ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:200] if str(e) else ''}); torch.export.load would run "
                                   f"it with Python's full unpickler, which can run any code; {_TRUST}") from e


def _config_entries(data: bytes, name: str, refuse) -> list[tuple[str, dict]]:
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise refuse(name, f"not JSON: {e}") from e
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise refuse(name, "not a payload config ({'config': {name: {...}}})")
    return list(entries.items())


def check_onnx_external_data(model: str | Path, files: Iterable[Path]) -> None:
    """Refuses (UnsafeArtifact) an ONNX model with an external tensor whose file is not one of ``files``
    (the node's verified ``files``, resolved). A model onnx cannot parse gets a plain PipelineError.
    The C++ runner applies the same walk and texts to the model's bytes (ext/pipeline/src/onnx_external.cpp)."""
    model = Path(model)
    try:
        import onnx  # noqa: PLC0415 - only ONNX nodes need it
        from google.protobuf.message import DecodeError  # noqa: PLC0415
    except ImportError as e:
        raise PipelineError(f"{model.name}: checking its external data needs the onnx package, a dependency of "
                            f"leapp that is not installed here ({e}): pip install 'onnx>=1.16'") from e
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except (DecodeError, OSError, ValueError, RuntimeError) as e:
        raise PipelineError(f"{model.name} is not an ONNX model onnx can parse: {type(e).__name__}: {e}") from e
    allowed = {Path(f).resolve() for f in files}
    for place, location in external_locations(proto):
        pure = PurePosixPath(location) if location else None
        if pure is None or "\0" in location or pure.is_absolute() or ".." in pure.parts:
            raise UnsafeArtifact(f"{model.name}: {place}: external data location {location!r} is not a plain "
                                 "relative path inside the export folder")
        try:
            target = (model.parent / location).resolve()
        except (OSError, RuntimeError, ValueError):
            target = None  # a loop: not one of the files, which resolved
        if target not in allowed:
            raise UnsafeArtifact(f"{model.name}: {place}: external data location {location!r} is not one of the "
                                 "node's files in pipeline.yaml (files: the external data leapp exported, each "
                                 "with its sha256); ONNX Runtime before 1.24 would read it wherever it points")


def external_locations(model) -> Iterator[tuple[str, str]]:
    """(where in the model, location) for every ``location`` entry of every tensor, and ``""`` for a tensor
    marked EXTERNAL without one: the graph, then functions, then training graphs, in document order."""
    yield from _graph_locations(model.graph, "graph")
    for function in model.functions:
        yield from _graph_locations(function, f"function {function.name!r}")
    for i, info in enumerate(model.training_info):
        yield from _graph_locations(info.initialization, f"training_info[{i}].initialization")
        yield from _graph_locations(info.algorithm, f"training_info[{i}].algorithm")


def _tensor_locations(tensor, place: str) -> Iterator[tuple[str, str]]:
    locations = [e.value for e in tensor.external_data if e.key == "location"]
    if tensor.data_location == 1 and not locations:  # TensorProto.EXTERNAL
        locations = [""]
    for location in locations:
        yield place, location


def _sparse_locations(sparse, place: str) -> Iterator[tuple[str, str]]:
    yield from _tensor_locations(sparse.values, place)
    yield from _tensor_locations(sparse.indices, f"{place} indices")


def _graph_locations(graph, where: str) -> Iterator[tuple[str, str]]:
    """A graph's (or a function's: nodes only) initializers, sparse initializers, then its nodes' attributes:
    tensors, sparse tensors, then subgraphs."""
    for tensor in getattr(graph, "initializer", ()):
        yield from _tensor_locations(tensor, f"{where}.initializer {tensor.name!r}")
    for sparse in getattr(graph, "sparse_initializer", ()):
        yield from _sparse_locations(sparse, f"{where}.sparse_initializer {sparse.values.name!r}")
    for node in graph.node:
        for attr in node.attribute:
            place = f"{where}.node {node.name or node.op_type!r} attribute {attr.name!r}"
            if attr.HasField("t"):
                yield from _tensor_locations(attr.t, place)
            for tensor in attr.tensors:
                yield from _tensor_locations(tensor, place)
            if attr.HasField("sparse_tensor"):
                yield from _sparse_locations(attr.sparse_tensor, place)
            for sparse in attr.sparse_tensors:
                yield from _sparse_locations(sparse, place)
            if attr.HasField("g"):
                yield from _graph_locations(attr.g, place)
            for sub in attr.graphs:
                yield from _graph_locations(sub, place)

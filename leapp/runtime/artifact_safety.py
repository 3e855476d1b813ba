"""leapp/runtime/artifact_safety.py: what leapp checks in a node's artifact before a third-party loader opens it.

An export folder may come from anywhere. pipeline.yaml's sha256 proves only that a file is the one
the folder names, and the loaders trust their files further than leapp's exporter ever needs:

- **PT2** (``canonical_pt2``). ``torch.export.load`` unpickles payloads marked ``use_pickle``
  with Python's full unpickler (``torch.load(weights_only=False)``), opaque objects with
  ``pickle.loads``, sample inputs and pre-2.8 files with a fallback to the full unpickler when the
  weights-only one refuses them, and it loads (``dlopen``) any AOTInductor model under
  ``data/aotinductor/``. A pickle can call any function it names and a shared library runs its
  initialisers, so a crafted archive would run its code on load. leapp's exporter writes none of
  these (raw tensor bytes, empty sample inputs, AOTInductor packages as separate files): an archive
  passes only when every member has exactly a name torch.export.save writes for a plain program (one
  case, each once), is stored uncompressed (no zip bomb), and every pickle in it (declared in the
  weights or constants config) loads with torch's weights-only unpickler, which is then what torch's
  own load does with those bytes. Custom and opaque objects are refused. torch is then handed a new
  archive built from the checked members alone, so torch's zip reader (another reader than Python's:
  case-insensitive lookups, its own choice of central directory) sees nothing that was not checked.
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
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from leapp.pipeline_format import PipelineError, read_bounded, short_repr

__all__ = ["MAX_MEMBERS", "UnsafeArtifact", "canonical_pt2", "check_onnx_external_data", "check_pt2_archive",
           "external_locations", "self_contained_onnx"]


class UnsafeArtifact(PipelineError):
    """An artifact its loader would run code from, or read files outside the export through: refused."""


MAX_MEMBERS = 100_000  # torch writes one per weight and constant, plus a dozen
_CONFIGS = ("data/weights/", "_weights_config.json"), ("data/constants/", "_constants_config.json")
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # torch's CUSTOM_OBJ_ and OPAQUE_OBJ_FILENAME_PREFIX
_TRUST = ("leapp's exporter writes no such data; re-export the node, or, if you trust where the file comes "
          "from, load it with torch.export.load yourself")


def check_pt2_archive(path: str | Path) -> None:
    """Refuses an archive ``torch.export.load`` would run code from (``canonical_pt2`` on the file's bytes,
    read once and bounded): UnsafeArtifact naming the file and the member; a file that is not a PT2 archive
    gets a plain PipelineError."""
    path = Path(path)
    canonical_pt2(read_bounded(path, path.name), path.name)


# The members torch.export.save writes for one program named "model" (leapp's exporter names none), relative to
# the archive's root folder: exact names, ASCII, one case. torch's reader finds members case-insensitively and
# falls back to the full unpickler for some, so a name outside this list never reaches it.
_MEMBER = re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|"
                     r"models/model\.json|data/sample_inputs/model\.pt|"
                     r"data/weights/model_weights_config\.json|data/weights/weight_[0-9]{1,9}|"
                     r"data/constants/model_constants_config\.json|data/constants/tensor_[0-9]{1,9}", re.ASCII)
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"


def canonical_pt2(data: bytes, name: str) -> bytes:
    """A new archive holding only the checked members of the PT2 archive ``data`` (file ``name``): what
    ``leapp.load``, the validation worker and ``leapp aoti`` hand to ``torch.export.load``.

    Refused (UnsafeArtifact naming the member): a member outside torch's names for a plain program (an
    AOTInductor model, a custom or opaque object, extra files, another case of an allowed name), a member
    stored twice, a compressed member, a payload marked ``use_pickle`` that torch's weights-only unpickler
    refuses. The copy is written by Python's zipfile from what Python's zipfile read and checked, so torch's
    own zip reader cannot find anything else in it (a second central directory, a member hidden between
    entries, another member under a case-folded name); its sample inputs are left empty (leapp uses none).
    """

    def refuse(member: str, why: str) -> UnsafeArtifact:
        return UnsafeArtifact(f"{name}: {member}: {why}")

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise PipelineError(f"{name} is not a PT2 archive (a zip file): {e}") from e
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UnsafeArtifact(f"{name}: {len(members)} members, more than {MAX_MEMBERS}")
        roots = {m.filename.split("/", 1)[0] for m in members}
        if len(roots) != 1 or any("/" not in m.filename for m in members):
            raise PipelineError(f"{name}: not one root folder as torch.export.save writes "
                                f"(top level: {sorted(roots)[:5]})")
        root = roots.pop() + "/"
        by_name: dict[str, zipfile.ZipInfo] = {}
        folded: set[str] = set()
        for m in members:
            member = m.filename[len(root):]
            if member.casefold() in folded:  # which copy a reader takes differs: only one could be checked
                raise refuse(member, "stored twice in the archive (names compared without case, as torch's reader "
                                     "looks them up); torch.export.save writes each member once")
            folded.add(member.casefold())
            if m.compress_type != zipfile.ZIP_STORED:
                raise refuse(member, "compressed; torch.export.save stores members uncompressed (a compressed member "
                                     "could expand without bound when torch reads it)")
            by_name[member] = m
        try:
            contents = {member: archive.read(info) for member, info in by_name.items()}
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise PipelineError(f"{name}: a member cannot be read ({type(e).__name__}: {e})") from e
    if contents.get("archive_format") != b"pt2":
        raise PipelineError(f"{name}: no archive_format 'pt2' (not written by torch.export.save "
                            "of torch 2.8 or later, whose older format leapp does not read)")

    pickles = [_SAMPLE_INPUTS] if contents.get(_SAMPLE_INPUTS) else []
    for member, payload_bytes in contents.items():  # the configs first: they name what a member is for
        folder = next((f for f, suffix in _CONFIGS if member.startswith(f) and member.endswith(suffix)), None)
        if folder is None or not _MEMBER.fullmatch(member):
            continue
        for fqn, payload in _config_entries(payload_bytes, member, refuse):
            file = payload.get("path_name")
            if not isinstance(file, str):
                raise refuse(member, f"entry {fqn!r} has no path_name")
            read_as = posixpath.join(folder, file)  # the member torch reads for it
            if file.startswith(_OBJECT_PREFIXES):
                kind = "a custom" if file.startswith("custom") else "an opaque"
                raise refuse(read_as, f"{kind} object ({fqn!r}), which torch unpickles with a pickler "
                                      f"that can run code; {_TRUST}")
            if read_as not in contents:
                raise refuse(read_as, f"named by {member} (entry {fqn!r}) but not in the archive")
            if payload.get("use_pickle"):  # any true value: torch tests it with `if`
                pickles.append(read_as)
    for member in contents:
        if not _MEMBER.fullmatch(member):
            detail = (" (an AOTInductor model, which torch.export.load loads as native code)"
                      if member.casefold().startswith("data/aotinductor/") else "")
            raise refuse(member, f"not a member of a PT2 program archive{detail}; {_TRUST}")
    if pickles:
        import torch  # only an archive with pickles needs it (leapp inspect runs without)
    for member in pickles:
        try:
            torch.load(io.BytesIO(contents[member]), weights_only=True)
        except Exception as e:  # any refusal of the weights-only unpickler
            raise refuse(member, f"a pickle torch's weights-only unpickler refuses ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''}); torch.export.load would run "
                                 f"it with Python's full unpickler, which can run any code; {_TRUST}") from e
    contents[_SAMPLE_INPUTS] = b""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as copy:
        for member in sorted(contents):
            info = zipfile.ZipInfo("archive/" + member, date_time=(1980, 1, 1, 0, 0, 0))
            copy.writestr(info, contents[member])
    return out.getvalue()


def _config_entries(data: bytes, name: str, refuse) -> list[tuple[str, dict]]:
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise refuse(name, f"not JSON: {e}") from e
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise refuse(name, "not a payload config ({'config': {name: {...}}})")
    return list(entries.items())


def check_onnx_external_data(model: str | Path, files: Iterable[Path], data: bytes | None = None):
    """Refuses (UnsafeArtifact) an ONNX model with an external tensor whose file is not one of ``files``
    (the node's verified ``files``, resolved). A model onnx cannot parse gets a plain PipelineError.
    ``data``: the model's bytes as read and hashed (else the file is read, bounded). Returns the parsed
    ``ModelProto`` (without its external data). The C++ runner applies the same walk and texts to the
    model's bytes (ext/pipeline/src/onnx_external.cpp)."""
    model = Path(model)
    proto = _parse_onnx(model, data)
    allowed = {Path(f).resolve() for f in files}
    for place, location in external_locations(proto):
        _check_location(model, place, location, allowed)
    return proto


def _parse_onnx(model: Path, data: bytes | None):
    try:
        import onnx  # only ONNX nodes need it
        from google.protobuf.message import DecodeError
    except ImportError as e:
        raise PipelineError(f"{model.name}: checking its external data needs the onnx package, a dependency of "
                            f"leapp that is not installed here ({e}): pip install 'onnx>=1.16'") from e
    try:
        return onnx.load_model_from_string(read_bounded(model, model.name) if data is None else data)
    except (DecodeError, OSError, ValueError, RuntimeError) as e:
        raise PipelineError(f"{model.name} is not an ONNX model onnx can parse: {type(e).__name__}: {e}") from e


def _check_location(model: Path, place: str, location: str, allowed: set[Path]) -> Path:
    pure = PurePosixPath(location) if location else None
    if pure is None or "\0" in location or pure.is_absolute() or ".." in pure.parts:
        raise UnsafeArtifact(f"{model.name}: {place}: external data location {short_repr(location)} is not a plain "
                             "relative path inside the export folder")
    try:
        target = (model.parent / location).resolve()
    except (OSError, RuntimeError, ValueError):
        target = None  # a loop: not one of the files, which resolved
    if target not in allowed:
        raise UnsafeArtifact(f"{model.name}: {place}: external data location {short_repr(location)} is not one of the "
                             "node's files in pipeline.yaml (files: the external data leapp exported, each "
                             "with its sha256); ONNX Runtime before 1.24 would read it wherever it points")
    return target


_PROTOBUF_LIMIT = (2 << 30) - (64 << 20)  # a serialized ModelProto must stay under 2 GiB; some margin


def self_contained_onnx(model: str | Path, data: bytes, files: dict[Path, bytes]) -> bytes | None:
    """The model ``data`` with each external tensor's bytes copied in from ``files`` (resolved path -> the
    bytes read and hashed): what ONNX Runtime then opens from memory, so no file is read twice. ``data``
    itself when nothing is external; None when the result would pass protobuf's 2 GiB limit (the session
    then opens the model file, whose external data ONNX Runtime reads from the checked files' paths).
    Every location is checked as ``check_onnx_external_data`` checks it, in the same walk; a range outside
    its file is a PipelineError."""
    model = Path(model)
    proto = _parse_onnx(model, data)
    allowed = set(files)
    external = []  # (place, tensor, its file) in walk order, each location checked as it is found
    for place, tensor in _tensors(proto):
        targets = [_check_location(model, where, location, allowed) for where, location in _tensor_locations(tensor, place)]
        if targets:
            external.append((place, tensor, targets[-1]))  # protobuf: the last "location" entry is the one read
    if not external:
        return data
    total = len(data)
    for place, tensor, target in external:
        entries = {e.key: e.value for e in tensor.external_data}
        blob = files[target]
        try:
            offset = int(entries.get("offset", "0"))
            length = int(entries["length"]) if "length" in entries else len(blob) - offset
        except ValueError as e:
            raise PipelineError(f"{model.name}: {place}: external data offset/length are not integers") from e
        if offset < 0 or length < 0 or offset + length > len(blob):
            raise PipelineError(f"{model.name}: {place}: external data [{offset}, {offset + length}) lies outside "
                                f"{target.name} ({len(blob)} bytes)")
        total += length
        if total > _PROTOBUF_LIMIT:
            return None
        tensor.raw_data = blob[offset : offset + length]
        del tensor.external_data[:]
        tensor.data_location = 0  # TensorProto.DEFAULT
    return proto.SerializeToString()


def external_locations(model) -> Iterator[tuple[str, str]]:
    """(where in the model, location) for every ``location`` entry of every tensor, and ``""`` for a tensor
    marked EXTERNAL without one: the graph, then functions (their nodes, then their attributes' default
    values), then training graphs, in document order."""
    for place, tensor in _tensors(model):
        yield from _tensor_locations(tensor, place)


def _tensors(model) -> Iterator[tuple[str, object]]:
    """(where, TensorProto) for every tensor a model holds: wherever the ONNX spec allows a TensorProto
    (initializers, sparse initializers' values and indices, node attributes and their subgraphs, a local
    function's nodes and attribute defaults, training graphs)."""
    yield from _graph_tensors(model.graph, "graph")
    for function in model.functions:
        where = f"function {short_repr(function.name)}"
        yield from _graph_tensors(function, where)
        for attr in function.attribute_proto:
            yield from _attribute_tensors(attr, f"{where} attribute default {short_repr(attr.name)}")
    for i, info in enumerate(model.training_info):
        yield from _graph_tensors(info.initialization, f"training_info[{i}].initialization")
        yield from _graph_tensors(info.algorithm, f"training_info[{i}].algorithm")


def _tensor_locations(tensor, place: str) -> Iterator[tuple[str, str]]:
    locations = [e.value for e in tensor.external_data if e.key == "location"]
    if tensor.data_location == 1 and not locations:  # TensorProto.EXTERNAL
        locations = [""]
    for location in locations:
        yield place, location


def _sparse_tensors(sparse, place: str) -> Iterator[tuple[str, object]]:
    yield place, sparse.values
    yield f"{place} indices", sparse.indices


def _attribute_tensors(attr, place: str) -> Iterator[tuple[str, object]]:
    if attr.HasField("t"):
        yield place, attr.t
    for tensor in attr.tensors:
        yield place, tensor
    if attr.HasField("sparse_tensor"):
        yield from _sparse_tensors(attr.sparse_tensor, place)
    for sparse in attr.sparse_tensors:
        yield from _sparse_tensors(sparse, place)
    if attr.HasField("g"):
        yield from _graph_tensors(attr.g, place)
    for sub in attr.graphs:
        yield from _graph_tensors(sub, place)


def _graph_tensors(graph, where: str) -> Iterator[tuple[str, object]]:
    """A graph's (or a function's: nodes only) initializers, sparse initializers, then its nodes' attributes:
    tensors, sparse tensors, then subgraphs."""
    for tensor in getattr(graph, "initializer", ()):
        yield f"{where}.initializer {short_repr(tensor.name)}", tensor
    for sparse in getattr(graph, "sparse_initializer", ()):
        yield from _sparse_tensors(sparse, f"{where}.sparse_initializer {short_repr(sparse.values.name)}")
    for node in graph.node:
        for attr in node.attribute:
            yield from _attribute_tensors(attr, f"{where}.node {short_repr(node.name or node.op_type)} attribute {short_repr(attr.name)}")

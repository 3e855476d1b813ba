"""leapp/cli/inspect_archive.py: ``leapp inspect`` of PT2 and TorchScript archives (zip files).

Read without torch: the graph JSON entries for ``leapp::warp_segment`` calls, and every
stored entry for bundles (by their magic). A truncated or damaged archive is a problem,
not an exception: zipfile alone can open a truncated PT2 as the archive stored inside it.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from leapp.bundle import Bundle, BundleError, parse_signature, read_bundle
from leapp.bundle.describe import describe_bundle, format_bytes
from leapp.bundle.format import HEADER, MAGIC
from leapp.cli.inspect_bundle import check_signature, describe_choice
from leapp.cli.report import Report

__all__ = ["PT2_OP_TARGET", "inspect_pt2", "inspect_torchscript", "inspect_zip"]

PT2_OP_TARGET = "torch.ops.leapp.warp_segment"


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


def inspect_zip(path: Path, report: Report, indent: int, kind: str) -> None:
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


def _describe_archive(path: Path, archive: zipfile.ZipFile, report: Report, indent: int, kind: str) -> None:
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
            describe_choice(report, f"{path.name}: {label}", data[offset:offset + size], indent + 2)
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
        check_signature(report, where, call["signature"], bundle, indent + 2)


def inspect_pt2(path: Path, report: Report, indent: int) -> None:
    inspect_zip(path, report, indent, "PT2")


def inspect_torchscript(path: Path, report: Report, indent: int) -> None:
    inspect_zip(path, report, indent, "TorchScript")

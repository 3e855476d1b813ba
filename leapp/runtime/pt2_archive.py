"""leapp/runtime/pt2_archive.py: what a node's .pt2 archive may hold before ``torch.export.load`` opens it.

An export folder may come from anywhere, and ``torch.export.load`` trusts its archive: it unpickles
payloads marked ``use_pickle`` with Python's full unpickler (``torch.load(weights_only=False)``),
opaque objects with ``pickle.loads``, sample inputs and pre-2.8 files with a fallback to the full
unpickler when the weights-only one refuses them, and it loads (``dlopen``) any AOTInductor model
under ``data/aotinductor/``. A pickle can call any function it names, and a shared library runs its
initialisers, so loading a crafted folder would run its code before leapp checked a thing. leapp's
exporter writes none of these: its tensors are raw bytes, its sample inputs empty, its AOTInductor
packages separate files (``leapp aoti``, docs/aoti.md).

``check_pt2_archive`` lets an archive through only when every member is one torch.export.save writes
for a plain program (an allowlist of folders), stored uncompressed (no zip bomb), and every pickle in
it (declared in the weights or constants config, or a ``.pt`` file) loads with torch's weights-only
unpickler, which is then what torch's own load does with those bytes. Custom and opaque objects are
refused. The cost is a read of the archive's directory and of its two small configs: leapp's own
exports hold no pickle to check.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch

from leapp.pipeline_format import PipelineError

__all__ = ["MAX_MEMBERS", "UnsafeArchive", "check_pt2_archive"]

class UnsafeArchive(PipelineError):
    """A .pt2 that loading would run code from (or expand without bound): refused, never handed to torch."""


MAX_MEMBERS = 100_000  # torch writes one per weight and constant, plus a dozen
# What torch.export.save writes for a program without AOTInductor code (relative to the archive's root folder).
_ALLOWED = ("archive_format", "archive_version", "byteorder", ".data/", "models/", "data/weights/",
            "data/constants/", "data/sample_inputs/", "extra/")
_CONFIGS = ("data/weights/", "_weights_config.json"), ("data/constants/", "_constants_config.json")
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # torch's CUSTOM_OBJ_ and OPAQUE_OBJ_FILENAME_PREFIX
_TRUST = ("leapp's exporter writes no such data; re-export the node, or, if you trust where the file comes "
          "from, load it with torch.export.load yourself")


def check_pt2_archive(path: str | Path) -> None:
    """Refuses an archive ``torch.export.load`` would run code from: UnsafeArchive naming the file and the
    member. A file that is not a PT2 archive at all gets a plain PipelineError (corrupt, not hostile)."""
    path = Path(path)

    def refuse(member: str, why: str) -> UnsafeArchive:
        return UnsafeArchive(f"{path.name}: {member}: {why}")

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise PipelineError(f"{path.name} is not a PT2 archive (a zip file): {e}") from e
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UnsafeArchive(f"{path.name}: {len(members)} members, more than {MAX_MEMBERS}")
        roots = {m.filename.split("/", 1)[0] for m in members}
        if len(roots) != 1 or any("/" not in m.filename for m in members):
            raise PipelineError(f"{path.name}: not one root folder as torch.export.save writes "
                                f"(top level: {sorted(roots)[:5]})")
        root = roots.pop() + "/"
        by_name = {}
        for m in members:
            name = m.filename[len(root):]
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
                if file.startswith(_OBJECT_PREFIXES):
                    kind = "a custom" if file.startswith("custom") else "an opaque"
                    raise refuse(folder + file, f"{kind} object ({fqn!r}), which torch unpickles with a pickler "
                                                f"that can run code; {_TRUST}")
                if payload.get("use_pickle") is True:
                    pickles.append(folder + file)
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

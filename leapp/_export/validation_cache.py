"""leapp/_export/validation_cache.py: what a fresh validation process returned, kept for the same question.

Validation runs a node's artifact in a fresh process on the recorded sample inputs (``validate_process``);
most of its time is that process's start (importing torch and torch.export's deserializer, a CUDA
context). Its answer, the node's outputs, depends only on what the process is given and on the software
that runs it. A later ``compile()`` that asks the same question reads the outputs from here and compares
them with its own eager outputs and tolerances, as it would compare a fresh run's; the report says
``passed (cached)``. ``go test`` caches test results the same way.

- **Key.** Everything the fresh process would see: the node's pipeline.yaml entry and the sha256 of its
  artifact and extra files (hashed now, from the files on disk), the bytes, dtypes and shapes of the
  sample inputs, the layout of the eager outputs, the device (name, UUID, driver), the interpreter and
  its environment as the worker gets it, leapp's build (size and mtime of every module and native
  library of the package), and torch's, ONNX's and ONNX Runtime's versions and native libraries. A
  change in any of them is a miss, and the node is validated in a fresh process.
- **What is kept.** The outputs of a run that loaded and ran every sample, only when each output has the
  eager output's dtype and shape and all of them are at most 64 MiB; nothing of a node that errored.
- **Where.** The binary cache's root (``LEAPP_CACHE_DIR``, docs/export-cuda.md), folder
  ``validation-v1``, with that cache's entry layout and checks when read (owner, mode, size, sha256, the
  key stored in the entry); ``LEAPP_NO_CACHE=1`` turns it off. Someone who may write the user's cache
  folder can forge a pass, as they can forge a binary; exports that must be validated afresh run with
  ``LEAPP_NO_CACHE=1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import torch

from leapp._export import binary_cache

__all__ = ["SUBDIR", "ValidationKey", "ValidationCache", "default_cache"]

CACHE_VERSION = 1
SUBDIR = f"validation-v{CACHE_VERSION}"
# Variables that differ between shells or test runs without changing what the worker computes (beyond those
# validate_process already ignores when it keeps a worker).
_ENV_IGNORES = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "LEAPP_VALIDATION_PRESTART"})

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ValidationKey(binary_cache.JsonKey):
    """The question a validation run answers (module docstring); ``layout`` is the eager outputs'
    ``[[dtype, shape], ...]`` per sample, which also gives the payload's layout."""

    node: str
    entry: str  # canonical JSON of the pipeline.yaml entry, with the files' sha256 as hashed now
    inputs: str  # sha256 of the sample inputs (dtype, shape, bytes)
    layout: str  # JSON
    software: str  # sha256 of the runtime's identity (_software)

    cache_version = CACHE_VERSION

    def describe(self) -> str:
        return f"validation outputs of node '{self.node}'"

    def outputs_bytes(self) -> int:
        return sum(_nbytes(dtype, shape) for sample in json.loads(self.layout) for dtype, shape in sample)

    def check_payload(self, payload: bytes) -> None:
        if len(payload) != self.outputs_bytes():
            raise binary_cache.CacheEntryError(f"{len(payload)} bytes of outputs, the layout needs "
                                               f"{self.outputs_bytes()}")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise binary_cache.CacheEntryError(f"unknown dtype {name!r}")
    return dtype


def _nbytes(dtype: str, shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= int(d)
    return count * _dtype(dtype).itemsize


def _layout(tensors) -> list[list]:
    return [[str(t.dtype).removeprefix("torch."), [int(d) for d in t.shape]] for t in tensors]


def _raw(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stat_files(paths) -> list[list]:
    out = []
    for p in sorted(paths):
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _package_files(name: str, patterns: tuple[str, ...]) -> list[list]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return [[name, "absent"]]
    found = []
    for location in spec.submodule_search_locations:
        for pattern in patterns:
            found += Path(location).glob(pattern)
    return _stat_files(found)


def _software(device: str) -> str:
    """sha256 of what runs the artifact: interpreter, worker environment, leapp's build, torch, ONNX (Runtime),
    and the CUDA device and driver for a CUDA node."""
    import leapp
    from leapp._export.validate_process import WORKER_KEY_IGNORES, worker_env
    from leapp.runtime import libraries

    env = {k: v for k, v in worker_env().items() if k not in WORKER_KEY_IGNORES and k not in _ENV_IGNORES}
    package = Path(leapp.__file__).resolve().parent
    parts = {
        "python": [sys.executable, sys.version],
        "env": sorted(env.items()),
        "leapp": _stat_files(list(package.rglob("*.py")) + list(libraries.native_dir().glob("*.so"))),
        "torch": [torch.__version__, torch.__file__],
        "onnx": _package_files("onnx", ("*.so",)),
        "onnxruntime": _package_files("onnxruntime", ("capi/*.so*",)),
    }
    if device.startswith("cuda"):
        from leapp import _native

        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        parts["device"] = [props.name, str(getattr(props, "uuid", "")), _native.driver_status().get("version")]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _inputs_digest(samples) -> str:
    h = hashlib.sha256()
    for sample in samples:
        h.update(b"sample")
        for t in sample.inputs:
            h.update(json.dumps(_layout([t])).encode())
            h.update(_raw(t))
    return h.hexdigest()


class ValidationCache:
    """Validation outputs in the cache folder ``validation-v1`` (module docstring)."""

    def __init__(self, store: binary_cache.BinaryCache) -> None:
        self.store = store
        self._software: dict[str, str] = {}  # device -> _software(device), once per compile (stats every module)

    def key(self, job, entry: dict, folder: Path | None) -> ValidationKey | None:
        """The key of ``job`` (a ``validate.NodeArtifactJob``) whose pipeline.yaml entry is ``entry``; None
        when the files on disk are not the ones the entry names (the fresh process reports that)."""
        record = job.record
        entry = dict(entry)
        base = Path(folder) if folder is not None else Path("/")
        try:
            digest = _file_digest(base / entry["artifact"])
            if "sha256" in entry and entry["sha256"] != digest:
                return None
            entry["sha256"] = digest
            files = []
            for extra in entry.get("files") or []:
                d = _file_digest(base / extra["path"])
                if extra.get("sha256") != d:
                    return None
                files.append(dict(extra, sha256=d))
            entry["files"] = files
        except (OSError, KeyError, TypeError):
            return None
        layout = [_layout(sample.outputs) for sample in record.samples]
        return ValidationKey(record.name, json.dumps(entry, sort_keys=True, default=str),
                             _inputs_digest(record.samples), json.dumps(layout),
                             self._software_of(str(entry.get("device", "cpu"))))

    def _software_of(self, device: str) -> str:
        if device not in self._software:
            self._software[device] = _software(device)
        return self._software[device]

    def get(self, key: ValidationKey) -> list[list[torch.Tensor]] | None:
        entry = self.store.get(key)
        if entry is None:
            return None
        view, at, outputs = memoryview(entry.payload), 0, []
        for sample in json.loads(key.layout):
            outs = []
            for dtype, shape in sample:
                n = _nbytes(dtype, shape)
                if n:
                    flat = torch.frombuffer(bytearray(view[at : at + n]), dtype=torch.uint8)
                    outs.append(flat.view(_dtype(dtype)).reshape(shape))
                else:
                    outs.append(torch.empty(shape, dtype=_dtype(dtype)))
                at += n
            outputs.append(outs)
        return outputs

    def put(self, key: ValidationKey, outputs: list[list[torch.Tensor]]) -> bool:
        """Keeps ``outputs`` when their layout is the key's and they fit an entry; True when written."""
        if [_layout(outs) for outs in outputs] != json.loads(key.layout):
            return False
        if key.outputs_bytes() > binary_cache.MAX_ENTRY_BYTES - (1 << 20):
            log.debug("validation cache: %s not kept (%d bytes of outputs)", key.describe(), key.outputs_bytes())
            return False
        self.store.put(key, binary_cache.Entry(b"".join(_raw(t) for outs in outputs for t in outs), {}))
        self.store.trim()
        return True


def default_cache() -> ValidationCache | None:
    """The validation cache of this environment; None when ``LEAPP_NO_CACHE`` is set."""
    store = binary_cache.default_cache(SUBDIR)
    return ValidationCache(store) if store is not None else None

"""leapp/_export/binary_cache.py: compiled CUDA binaries kept across processes, in the user's cache directory.

NVRTC takes 0.3-1 s per target and a bundle has eight (PTX sm_75, cubins
sm_75..sm_120), so a later process that exports the same Warp module variant
reads them from here instead (docs/export-cuda.md, "The binary cache").

- **Where.** ``$LEAPP_CACHE_DIR``, else ``$XDG_CACHE_HOME/leapp``, else
  ``~/.cache/leapp``; entries in its ``cuda-v1/`` folder, one file per binary.
  Never Warp's kernel cache (``wp.config.kernel_cache_dir``): nothing of
  Warp's is read or written. ``LEAPP_NO_CACHE=1`` turns it off (nothing is read
  or written).
- **Key.** Everything that changes the bytes: this cache's version, leapp's
  bundle format version, the Warp version and the identity of its native
  library (size and mtime of warp.so, which holds NVRTC), the NVRTC toolkit
  version, the module's name and Warp's hash of the variant (the kernels'
  source and every resolved module option, block_dim included), the options
  leapp overrides in its own copy of them (``enable_backward=False``, which
  Warp's hash does not see), the kernels compiled (a segment's launched
  kernels, or the whole module: a subset never serves another), the kind
  (PTX/cubin) and the arch. The file name is the sha256 of the key; the
  entry also stores the key itself, compared byte for byte when read.
- **Hostile input.** An entry is read only when the cache folder and the
  file belong to this user and are not writable by others; it must be a
  well-formed entry (magic, version, lengths that add up to the file size,
  at most 64 MiB), its trailing sha256 must match, its key must be the one
  asked for, its meta must be a JSON object of integers, and its binary must
  look like what it claims: a cubin is an ELF64 CUDA executable for exactly
  that arch, PTX is NUL-free text whose ``.target`` is that arch. Anything
  else is logged as a warning (``leapp`` logger) and the binary is compiled
  again, which replaces the entry. The digest catches corruption,
  truncation and mix-ups; it cannot stop someone who may write the user's
  cache folder (they can recompute it): such a person can already change
  the user's code. Exports that must come from the compiler alone run with
  ``LEAPP_NO_CACHE=1``.
- **Writes** go to a temporary file in the same folder, then ``os.replace``:
  readers see a whole entry or none, and concurrent writers of one key
  write the same bytes. The folder is kept under ``LEAPP_CACHE_MAX_MB``
  (default 256) by removing the least recently used entries after a write
  (a hit refreshes an entry's mtime); deleting the folder is always safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

from leapp.errors import LeappError

__all__ = [
    "CACHE_DIR_ENV",
    "DISABLE_ENV",
    "MAX_MB_ENV",
    "CACHE_VERSION",
    "BinaryCache",
    "CacheKey",
    "Entry",
    "EntryKey",
    "JsonKey",
    "default_cache",
    "cache_root",
]

CACHE_DIR_ENV = "LEAPP_CACHE_DIR"
DISABLE_ENV = "LEAPP_NO_CACHE"
MAX_MB_ENV = "LEAPP_CACHE_MAX_MB"
DEFAULT_MAX_MB = 256
CACHE_VERSION = 1  # of this entry layout and key; a new version uses a new folder
SUBDIR = f"cuda-v{CACHE_VERSION}"
MAX_ENTRY_BYTES = 64 << 20  # a cubin of a large module is a few MB
STALE_TEMP_S = 3600  # temporary files older than this are a crashed writer's leftovers

_MAGIC = b"LEAPPCC\0"
_HEADER = struct.Struct("<8sIIQQQ")  # magic, version, flags, key, meta and payload lengths
_DIGEST = 32
_EM_CUDA = 190
_ET_EXEC = 2
_NAME = re.compile(r"[0-9a-f]{64}\.bin")

log = logging.getLogger(__name__)


def _truthy(value: str | None) -> bool:
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off", "")


def cache_root() -> Path:
    """The cache folder leapp uses: ``$LEAPP_CACHE_DIR``, else ``$XDG_CACHE_HOME/leapp``, else ``~/.cache/leapp``."""
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):  # the XDG spec: relative values are invalid and ignored
        return Path(xdg) / "leapp"
    return Path.home() / ".cache" / "leapp"


class JsonKey:
    """A frozen dataclass key stored as canonical JSON of its fields plus ``cache_version``; its entry's file
    name is the sha256 of those bytes."""

    cache_version = CACHE_VERSION

    def encoded(self) -> bytes:
        fields = dataclasses.asdict(self) | {"cache": self.cache_version}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def filename(self) -> str:
        return hashlib.sha256(self.encoded()).hexdigest() + ".bin"


@dataclasses.dataclass(frozen=True)
class CacheKey(JsonKey):
    """What a binary depends on (see the module docstring); ``kind`` is "ptx" or "cubin"."""

    warp: str
    warp_native: str  # "<size>:<mtime_ns>" of Warp's native library
    nvrtc: str
    module: str
    module_hash: str
    block_dim: int
    kind: str
    arch: int
    bundle_format: int
    overrides: str = ""  # JSON of the options leapp's copy overrides (not part of Warp's module hash)
    kernels: str = ""  # the compiled kernels' mangled names, sorted, comma-separated; "" the whole module

    def describe(self) -> str:
        return f"{self.kind} sm_{self.arch} of module '{self.module}'"

    def check_payload(self, payload: bytes) -> None:
        _check_binary(self, payload)


class EntryKey(Protocol):
    """What a cache folder needs of a key: its bytes (stored in the entry and compared when read), the
    entry's file name, a description for log lines, and a check of the payload it stands for."""

    def encoded(self) -> bytes: ...

    def filename(self) -> str: ...

    def describe(self) -> str: ...

    def check_payload(self, payload: bytes) -> None: ...


@dataclasses.dataclass(frozen=True)
class Entry:
    payload: bytes  # the .ptx or .cubin file Warp wrote
    meta: dict[str, int]  # Warp's .meta file of that compile


class CacheEntryError(LeappError, ValueError):
    """A cache entry that is not what its key says (the reason names the check)."""


def encode_entry(key: EntryKey, entry: Entry) -> bytes:
    key_bytes = key.encoded()
    meta = json.dumps(entry.meta, sort_keys=True, separators=(",", ":")).encode()
    body = _HEADER.pack(_MAGIC, CACHE_VERSION, 0, len(key_bytes), len(meta), len(entry.payload))
    body += key_bytes + meta + entry.payload
    return body + hashlib.sha256(body).digest()


def decode_entry(key: EntryKey, data: bytes) -> Entry:
    """The entry in ``data`` if it is a sound entry for ``key``; else ``CacheEntryError`` naming the check."""
    if len(data) < _HEADER.size + _DIGEST:
        raise CacheEntryError(f"{len(data)} bytes, shorter than a header")
    magic, version, flags, nkey, nmeta, npayload = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise CacheEntryError("bad magic")
    if version != CACHE_VERSION or flags != 0:
        raise CacheEntryError(f"version {version} flags {flags}, expected {CACHE_VERSION} and 0")
    if _HEADER.size + nkey + nmeta + npayload + _DIGEST != len(data):
        raise CacheEntryError(f"lengths {nkey} + {nmeta} + {npayload} do not add up to the file size {len(data)}")
    body = memoryview(data)[: len(data) - _DIGEST]
    if hashlib.sha256(body).digest() != data[-_DIGEST:]:
        raise CacheEntryError("sha256 mismatch (corrupt or truncated)")
    at = _HEADER.size
    stored_key, at = bytes(data[at : at + nkey]), at + nkey
    if stored_key != key.encoded():
        raise CacheEntryError("the entry holds another key")
    try:
        meta = json.loads(data[at : at + nmeta].decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise CacheEntryError(f"meta is not JSON: {e}") from None
    if not isinstance(meta, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in meta.items()):
        raise CacheEntryError("meta is not an object of non-negative integers")
    payload = bytes(data[at + nmeta : at + nmeta + npayload])
    key.check_payload(payload)
    return Entry(payload, meta)


def _check_binary(key: CacheKey, payload: bytes) -> None:
    if key.kind == "cubin":
        if len(payload) < 64 or payload[:4] != b"\x7fELF" or payload[4] != 2 or payload[5] != 1:
            raise CacheEntryError("the cubin is not a little-endian ELF64 file")
        e_type, e_machine = struct.unpack_from("<HH", payload, 16)
        (e_shoff,) = struct.unpack_from("<Q", payload, 40)
        (e_flags,) = struct.unpack_from("<I", payload, 48)
        e_shentsize, e_shnum = struct.unpack_from("<HH", payload, 58)
        if e_machine != _EM_CUDA or e_type != _ET_EXEC:
            raise CacheEntryError(f"the cubin is ELF machine {e_machine} type {e_type}, not a CUDA executable")
        # the SM is bits 8-15 of e_flags in the ELF layout of CUDA 12.8+ toolkits, bits 0-7 before
        if key.arch not in ((e_flags >> 8) & 0xFF, e_flags & 0xFF):
            raise CacheEntryError(f"the cubin's e_flags {e_flags:#x} name no sm_{key.arch}")
        if e_shoff + e_shentsize * e_shnum > len(payload):
            raise CacheEntryError("the cubin's section headers lie past its end")
    elif key.kind == "ptx":
        text = payload.rstrip(b"\0")
        if b"\0" in text or not re.search(rb"^\s*\.target\s+sm_%d\b" % key.arch, text, re.MULTILINE):
            raise CacheEntryError(f"the PTX is not text targeting sm_{key.arch}")
    else:
        raise CacheEntryError(f"unknown kind {key.kind!r}")


class BinaryCache:
    """Entries under ``root/<subdir>`` (``cuda-v1``: compiled binaries); ``get`` returns None on a miss or
    on an entry it refuses (logged). Other caches of leapp (``validation_cache``) use their own subdir with
    the same entry layout and the same checks."""

    def __init__(self, root: Path, max_bytes: int, subdir: str = SUBDIR) -> None:
        self.root = Path(root)
        self.folder = self.root / subdir
        self.max_bytes = max_bytes
        self._usable: bool | None = None
        self._lock = threading.Lock()

    def usable(self) -> bool:
        """Creates the folder (mode 0700) on first use; False (warned once) when it is not safely ours."""
        with self._lock:
            if self._usable is None:
                self._usable = self._check_folder()
            return self._usable

    def _check_folder(self) -> bool:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(self.folder)
        except OSError as e:
            log.warning("cache %s unusable (%s): going on without it", self.folder, e)
            return False
        problem = _foreign(st)
        if problem:
            log.warning("cache %s %s: going on without it (set %s to a folder of your own, or %s=1)",
                        self.folder, problem, CACHE_DIR_ENV, DISABLE_ENV)
            return False
        log.debug("cache %s in use (limit %d MB)", self.folder, self.max_bytes >> 20)
        return True

    def get(self, key: EntryKey) -> Entry | None:
        if not self.usable():
            return None
        path = self.folder / key.filename()
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            log.debug("cache %s: %s not cached", self.folder.name, key.describe())
            return None
        except OSError as e:
            log.warning("cache entry %s unreadable (%s): making it again", path, e)
            return None
        try:
            st = os.fstat(fd)
            problem = _foreign(st) or ("not a regular file" if not stat.S_ISREG(st.st_mode) else "")
            problem = problem or (f"{st.st_size} bytes, over {MAX_ENTRY_BYTES}" if st.st_size > MAX_ENTRY_BYTES else "")
            if problem:
                log.warning("cache entry %s refused: %s; making it again", path, problem)
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(MAX_ENTRY_BYTES + 1)
        finally:
            os.close(fd)
        try:
            entry = decode_entry(key, data)
        except CacheEntryError as e:
            log.warning("cache entry %s (%s) refused: %s; making it again", path, key.describe(), e)
            return None
        try:
            os.utime(path)  # least recently used goes first when the folder is trimmed
        except OSError:
            pass
        log.debug("cache %s: %s read from %s", self.folder.name, key.describe(), path.name)
        return entry

    def put(self, key: EntryKey, entry: Entry) -> None:
        """Writes the entry atomically; a failure is logged and otherwise ignored (the export goes on)."""
        if not self.usable():
            return
        data = encode_entry(key, entry)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".bin")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.folder / key.filename())
            tmp = None
            log.debug("cache %s: %s written to %s", self.folder.name, key.describe(), key.filename())
        except OSError as e:
            log.warning("cache %s: could not write an entry (%s)", self.folder, e)
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def trim(self) -> None:
        """Removes least recently used entries until the folder holds at most ``max_bytes``; old temp files too."""
        if not self.usable():
            return
        entries, total, now = [], 0, time.time()
        try:
            with os.scandir(self.folder) as it:
                for item in it:
                    try:
                        st = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if item.name.startswith(".tmp-"):
                        if now - st.st_mtime > STALE_TEMP_S:
                            _unlink(item.path)
                    elif _NAME.fullmatch(item.name) and stat.S_ISREG(st.st_mode):
                        entries.append((st.st_mtime, st.st_size, item.path))
                        total += st.st_size
        except OSError as e:
            log.warning("cache %s: could not list it (%s)", self.folder, e)
            return
        if total <= self.max_bytes:
            return
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if _unlink(path):
                total -= size
                removed += 1
        log.info("cache %s: removed %d least recently used entries (limit %d MB)", self.folder, removed,
                 self.max_bytes >> 20)

    def clear(self) -> None:
        """Removes every entry (and leftover temporary file) of this cache version."""
        try:
            with os.scandir(self.folder) as it:
                for item in it:
                    if _NAME.fullmatch(item.name) or item.name.startswith(".tmp-"):
                        _unlink(item.path)
        except FileNotFoundError:
            pass


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _foreign(st: os.stat_result) -> str:
    """Why a file or folder is not safely this user's ("" when it is)."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def default_cache(subdir: str = SUBDIR) -> BinaryCache | None:
    """The cache folder ``subdir`` the exporter uses, from the environment now; None when ``LEAPP_NO_CACHE``
    is set."""
    if _truthy(os.environ.get(DISABLE_ENV)):
        log.debug("binary cache off (%s=%s): compiling every binary", DISABLE_ENV, os.environ.get(DISABLE_ENV))
        return None
    raw = os.environ.get(MAX_MB_ENV, "").strip()
    try:
        max_mb = int(raw) if raw else DEFAULT_MAX_MB
        if max_mb < 0:
            raise ValueError
    except ValueError:
        log.warning("%s=%r is not a number of megabytes; using %d", MAX_MB_ENV, raw, DEFAULT_MAX_MB)
        max_mb = DEFAULT_MAX_MB
    root = cache_root()
    with _caches_lock:
        cache = _caches.get((root, max_mb, subdir))
        if cache is None:
            cache = _caches[(root, max_mb, subdir)] = BinaryCache(root, max_mb << 20, subdir)
    return cache


_caches: dict[tuple[Path, int, str], BinaryCache] = {}
_caches_lock = threading.Lock()

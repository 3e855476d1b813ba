"""The loader rules under random damage (issue 46 item 3, docs/export-cpu.md section 4): a real leapp-built object
cut at any point, or with ELF header, program header, dynamic entry, symbol, hash, version or relocation fields
set to hostile values. Both readers give the same verdict with the same words, nothing dies by a signal, and an
object they accept then loads (dlopen from a sealed-style memfd and dlsym of each entry and layout table) in a
worker process without dying by a signal; one that also binds its code exactly as the original does runs the
segment through the native runtime (leapp._native.run_segment_cpu) too.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpu_observation import BATCH, bundle_of, trace, warp_cpu
from elf_fields import Fields, object_of, put, verdicts, with_object
from leapp.bundle import elf

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                 reason="needs a C++ compiler: the export compiles Warp's CPU source"),
              warp_cpu]

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# A worker: per job (kind, bundle or object, entries) it loads the object as the runtime would and answers one
# line; a job that kills it by a signal ends the stream, and the test names that job.
WORKER = r"""
import ctypes, json, os, struct, sys
from leapp import _native
n = %d
quat = (ctypes.c_char * (16 * n)).from_buffer_copy(struct.pack("<4f", 0.0, 0.0, 0.0, 1.0) * n)
norm, grav = (ctypes.c_char * (4 * n))(), (ctypes.c_char * (12 * n))()
while True:
    head = sys.stdin.buffer.read(16)
    if len(head) < 16:
        break
    kind, size = struct.unpack("<QQ", head)
    job = json.loads(sys.stdin.buffer.read(size))
    payload = bytes.fromhex(job["data"])
    try:
        if kind == 0:  # dlopen from a memfd, as the runtime does, and dlsym of each entry and its layout table
            fd = os.memfd_create("leapp-elf-test")
            os.write(fd, payload)
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
            for entry in job["entries"]:
                getattr(lib, entry), getattr(lib, entry + "_leapp_args")
        else:  # the whole native path: parse, load, bind, run
            bundle = _native.Bundle(payload)
            _native.run_segment_cpu(bundle, [ctypes.addressof(quat)], [ctypes.addressof(norm), ctypes.addressof(grav)],
                                    [16 * n], [4 * n, 12 * n])
        print("done", flush=True)
    except Exception as e:
        print("refused " + str(e).replace("\n", " ")[:300], flush=True)
""" % BATCH


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def ask(self, kind: int, payload: bytes, entries: list[str], what: str) -> str:
        import json

        job = json.dumps({"data": payload.hex(), "entries": entries}).encode()
        self.proc.stdin.write(struct.pack("<QQ", kind, len(job)) + job)
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().decode()
        if not line:
            self.proc.wait(timeout=60)
            pytest.fail(f"{what}: the worker died with status {self.proc.returncode} "
                        f"({'a signal' if self.proc.returncode < 0 else 'an exit'}); stderr: "
                        f"{self.proc.stderr.read().decode()[-2000:]}")
        return line.strip()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    _, folder = trace(tmp_path_factory.mktemp("elfh"), "pt2", validate=False)
    data = bundle_of(folder)
    machine, image, entries = object_of(data)
    return data, machine, image, entries, Fields(image, machine, entries)


def binding(image: bytes, machine: str, entries: list[str]):
    """What decides where an accepted object's code goes: its PT_LOADs, the entries' and tables' symbols, and each
    relocation (where, type, addend, symbol name and value). Equal to the original's: running it is running
    leapp's code."""
    check = elf._Check(image, machine, entries)
    check.run()
    loads = [(x.flags, x.offset, x.vaddr, x.filesz, x.memsz) for x in check.loads]
    symbols = [check.syms[s][4:] for e in entries for s in check.defined(e.encode()) +
               check.defined(f"{e}_leapp_args".encode())]
    relocs = []
    for where, size in ((7, 8), (23, 2)):
        if where in check.tags:
            base = check.file_part(check.tags[where], check.tags[size], "relocations")
            for r in range(check.tags[size] // 24):
                offset, info, addend = struct.unpack_from("<QQQ", image, base + 24 * r)
                sym = info >> 32
                relocs.append((offset, info & 0xFFFFFFFF, addend, check.names[sym], check.syms[sym][3:]))
    return loads, symbols, sorted(relocs), image[check.loads[1].offset:check.loads[1].offset + check.loads[1].filesz]


def _judge(real, worker, image: bytes, what: str, original) -> str:
    data, machine, _, entries, _ = real
    py, native = verdicts(with_object(data, image))
    assert py == native, f"{what}: the readers differ:\n  Python: {py}\n  C++:    {native}"
    if py:
        return "refused"
    answer = worker.ask(0, image, entries, what)
    if binding(image, machine, entries) == original:
        worker.ask(1, with_object(data, image), entries, what)
    return answer


BOUNDARY = [0, 1, 2, 3, 4, 6, 7, 8, 16, 24, 56, 64, 4096, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 2**31, 2**32 - 1, 2**32,
            2**48, 2**63, 2**64 - 1]


def test_every_cut_gets_the_same_verdict_from_both_and_no_signal(real):
    data, machine, image, entries, _ = real
    worker, original, seen = Worker(), binding(image, machine, entries), []

    @settings(max_examples=120, **SETTINGS)
    @given(cut=st.one_of(st.integers(0, len(image)), st.integers(len(image) - 600, len(image))))
    def cut_at(cut):
        seen.append(_judge(real, worker, image[:cut], f"cut at {cut} of {len(image)}", original))

    try:
        cut_at()
        assert _judge(real, worker, image, "the whole object", original) == "done"  # the control
    finally:
        worker.close()
    assert "refused" in seen


def test_hostile_field_values_get_the_same_verdict_from_both_and_no_signal(real):
    data, machine, image, entries, fields = real
    names = sorted(fields.fields)
    worker, original, seen = Worker(), binding(image, machine, entries), []
    value = st.one_of(st.tuples(st.just("set"), st.sampled_from(BOUNDARY)),
                      st.tuples(st.just("set"), st.integers(0, 2**64 - 1)),
                      st.tuples(st.just("add"), st.integers(-64, 64)))

    @settings(max_examples=250, **SETTINGS)
    @given(edits=st.lists(st.tuples(st.sampled_from(names), value), min_size=1, max_size=3))
    def edited(edits):
        out = image
        for name, (how, v) in edits:
            field = fields.fields[name]
            old = int.from_bytes(out[field[0]:field[0] + field[1]], "little")
            out = put(out, field, v if how == "set" else old + v)
        seen.append(_judge(real, worker, out, f"edits {edits}", original))

    try:
        edited()
    finally:
        worker.close()
    assert "refused" in seen and "done" in seen, seen  # both verdicts were reached

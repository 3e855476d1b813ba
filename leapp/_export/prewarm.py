"""leapp/_export/prewarm.py: the exporter's imports, made in a background thread while a session traces.

In a fresh process most of a warm ``session.compile()`` is imports, not export: ``torch.export``'s tracer
pulls in AOTAutograd, its partitioner and networkx, then its serializer, and pipeline.yaml's schema needs
jsonschema (0.55 of 0.71 s on the 2-CPU machine with the binary cache warm, measured with cProfile). On a
GPU machine a trace spends much of its time in Warp's NVRTC and in CUDA calls, which release the GIL, so
the imports could run meanwhile. ``session.compile()`` waits for this thread before it exports (``finish``): the
exporter never imports concurrently with it, and an import that failed here is simply made again there,
with its error, where the user sees it.

Opt-in: ``LEAPP_EXPORT_PREWARM=1``. On the 2-CPU machine (no GPU), where the trace is CPU-bound and
holds the GIL, it gains nothing (the imports finish after the trace: compile 0.44 s against 0.46 s). On
the H200 (``benchmarks/first_export.py --runs 3``, 2026-12-01) a cold compile took 2.93 s (2.80-3.24) with
it and 3.94 s (3.12-4.05) without, but a warm one 3.43 s (3.13-4.13) with it and 3.33 s (3.11-3.46)
without, and five later runs without it gave 3.45 s (2.89-4.19) cold: the spread between runs is as
large as the gain. Imports made from two threads at once are safe in Python unless two modules import
each other across the threads, in which case one thread may see a partly initialised module; with no
clear gain, that risk keeps it off by default.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time

__all__ = ["ENV", "MODULES", "finish", "start"]

ENV = "LEAPP_EXPORT_PREWARM"
# What every export imports, heaviest first. The ONNX exporter is left out: only ONNX nodes need it.
MODULES = (
    "torch.export._trace",
    "torch._export.serde.serialize",
    "torch.export.pt2_archive._package",
    "leapp._export.compile",
    "jsonschema",
)

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_THREAD: threading.Thread | None = None


def start() -> bool:
    """Starts the imports in a daemon thread, once per process, when ``LEAPP_EXPORT_PREWARM=1``; True when
    this call started them."""
    global _THREAD
    if os.environ.get(ENV, "").strip() != "1":
        return False
    with _LOCK:
        if _THREAD is not None:
            return False
        _THREAD = threading.Thread(target=_import_all, name="leapp-export-prewarm", daemon=True)
        _THREAD.start()
    return True


def finish() -> None:
    """Waits for the imports a session started (no-op when none did): called before an export begins."""
    with _LOCK:
        thread = _THREAD
    if thread is not None and thread.is_alive():
        thread.join()


def _import_all() -> None:
    begin = time.perf_counter()
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - best effort: compile() imports it again and reports there
            log.debug("prewarm: importing %s failed (%s: %s); the export will import it", name, type(e).__name__, e)
    try:
        from leapp.pipeline_format import reader

        reader.prepare()  # the compiled pipeline.yaml schema (cached)
    except Exception as e:  # noqa: BLE001
        log.debug("prewarm: the pipeline.yaml schema did not compile here (%s)", e)
    log.debug("prewarm: the exporter's imports took %.2f s in the background", time.perf_counter() - begin)

"""The per-call latency harness every benchmark here shares: CUDA events and a host clock, one call at a time.

A call is bracketed by two CUDA events on torch's current stream and synchronised before the next one, and a
host clock (``time.perf_counter``) runs around the same interval: what a control loop waits for one call, host
enqueue cost included. ``measure_interleaved`` times several routes in interleaved rounds, so that a shared
machine's drift spreads over all of them.

It needs torch alone (no Warp, no leapp): ``existing_tool_step.py`` times the existing export tool, whose package
is also named ``leapp``, with this same harness in an interpreter where this project's package is not importable.
"""

from __future__ import annotations

import statistics
import time

import torch

from replay_report import percentile

__all__ = ["AllocationProbe", "measure_interleaved", "time_calls"]


def _leapp_native():
    """This project's ``leapp._native`` (its allocation counter), or None where another ``leapp`` is imported."""
    try:
        from leapp import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "allocation_count") else None


def time_calls(fn, calls: int, warmup: int, keep_samples: bool = False) -> dict:
    """Per-call latency in µs: CUDA events on torch's current stream and a host clock, synchronised each call
    (``keep_samples``: also every call's event time, ``samples_us``)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    wall = []
    alloc = AllocationProbe()
    for i in range(calls):
        t0 = time.perf_counter()
        starts[i].record(stream)
        fn()
        ends[i].record(stream)
        ends[i].synchronize()
        wall.append((time.perf_counter() - t0) * 1e6)
    events = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    extra = {"samples_us": events, "wall_samples_us": wall} if keep_samples else {}
    return {
        **extra,
        "calls": calls,
        "median_us": statistics.median(events),
        "p90_us": percentile(events, 0.9),
        "wall_median_us": statistics.median(wall),
        "allocations": alloc.per_call(calls),
    }


def measure_interleaved(calls: dict, n_calls: int, warmup: int, repeats: int) -> dict:
    """``time_calls`` of every entry of ``calls``, ``repeats`` rounds with the entries interleaved (a shared
    machine drifts: interleaving spreads the drift over all entries). Per entry: the median of the round
    medians, the pooled p90, the spread (min, max) of the round medians, for CUDA events and the host clock,
    and ``rounds``: each round's (event, host) median, so that callers can form paired ratios."""
    runs: dict[str, list[dict]] = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(repeats):
            for name, fn in calls.items():
                runs[name].append(time_calls(fn, n_calls, warmup, keep_samples=True))
    out = {}
    for name, results in runs.items():
        medians = [r["median_us"] for r in results]
        walls = [r["wall_median_us"] for r in results]
        out[name] = {
            "median_us": statistics.median(medians),
            "p90_us": percentile([s for r in results for s in r["samples_us"]], 0.9),
            "spread_us": [min(medians), max(medians)],
            "wall_median_us": statistics.median(walls),
            "wall_p90_us": percentile([s for r in results for s in r["wall_samples_us"]], 0.9),
            "wall_spread_us": [min(walls), max(walls)],
            "rounds": list(zip(medians, walls)),
            "runs": len(results),
        }
    return out


class AllocationProbe:
    """Allocation counters before a loop; ``per_call`` gives the deltas after it.

    NOTE: leapp._native's counter sees only replays made through leapp._native (the
    `native` method, and the op when its Python kernels serve it): libleapp_warp_torch.so
    links its own copy of the runtime. Free device memory and torch's cudaMalloc count
    are seen from outside, whichever library allocates.
    """

    def __init__(self):
        self._native = _leapp_native()
        torch.cuda.synchronize()
        self.native = self._native.allocation_count() if self._native else 0
        stats = torch.cuda.memory_stats()
        self.requests = stats.get("allocation.all.allocated", 0)
        self.device_allocs = stats.get("num_device_alloc", 0)
        self.free = torch.cuda.mem_get_info()[0]

    def per_call(self, calls: int) -> dict:
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        return {
            "leapp_native_per_call": (self._native.allocation_count() - self.native) / calls if self._native else None,
            "torch_allocator_requests_per_call": (stats.get("allocation.all.allocated", 0) - self.requests) / calls,
            "torch_cudamalloc_total": stats.get("num_device_alloc", 0) - self.device_allocs,
            "free_device_bytes_delta": torch.cuda.mem_get_info()[0] - self.free,
        }

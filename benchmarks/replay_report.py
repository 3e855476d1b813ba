"""Reporting for benchmarks/replay.py: percentiles, the issue's targets, the Markdown table.

Kept apart from the measuring so it can be checked without a GPU (tests/e2e/test_benchmark_smoke.py).
"""

from __future__ import annotations

TARGETS = {  # the targets; reported as measured, never adjusted
    "pt2_vs_floor_at_262144": 1.2,
    "pt2_vs_eager_at_1": 0.5,
    "cold_first_call_ms": 50.0,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def targets(results: dict) -> list[dict]:
    """The issue's targets against what was measured (None when not measured)."""

    def median(n: int, method: str):
        m = results["sizes"].get(str(n), {}).get("methods", {}).get(method)
        return m["median_us"] if m else None

    rows = []
    for method, label in (("pt2", "PT2 call"), ("pt2-cuda-graphs", "PT2 call, cuda_graphs=True,")):
        pt2, floor = median(262144, method), median(262144, "floor")
        rows.append(_target(f"{label} ≤ 1.2× floor at N=262144", pt2 / floor if pt2 and floor else None,
                            TARGETS["pt2_vs_floor_at_262144"], "×"))
        pt2, eager = median(1, method), median(1, "eager")
        rows.append(_target(f"{label} ≤ 0.5× eager at N=1", pt2 / eager if pt2 and eager else None,
                            TARGETS["pt2_vs_eager_at_1"], "×"))
    cold = results.get("cold_start", {}).get("first_call_ms")
    rows.append(_target("cold first call of the PT2 op ≤ 50 ms (fresh process, after load)", cold,
                        TARGETS["cold_first_call_ms"], " ms"))
    return rows


def _target(what: str, value, limit: float, unit: str) -> dict:
    return {"target": what, "measured": value, "limit": limit, "unit": unit.strip(),
            "met": None if value is None else value <= limit}


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [f"leapp replay benchmark ({results['mode']}): " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    lines += ["| N | method | median µs | p90 µs | host wall median µs | × floor | torch allocs/call | "
              "leapp._native allocs/call | free device bytes Δ |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, entry in results["sizes"].items():
        ms = entry.get("methods")
        if not ms:
            lines.append(f"| {n} | (dry run: {', '.join(entry['dry_run_checked'])}) | not measured | | | | | | |")
            continue
        floor = ms["floor"]["median_us"]
        for name, m in ms.items():
            a = m["allocations"]
            lines.append(f"| {n} | {name} | {m['median_us']:.1f} | {m['p90_us']:.1f} | {m['wall_median_us']:.1f} | "
                         f"{m['median_us'] / floor:.2f} | {a['torch_allocator_requests_per_call']:.2f} | "
                         f"{a['leapp_native_per_call']:.2f} | {a['free_device_bytes_delta']} |")
    lines += ["", "| N | export s (compile, validate=False) | max abs error pt2 vs eager |", "|---:|---:|---:|"]
    for n, entry in results["sizes"].items():
        err = entry.get("max_abs_error_pt2")
        lines.append(f"| {n} | {entry['export_s']:.2f} | {'not measured' if err is None else f'{err:.3g}'} |")
    cold = results["cold_start"]
    lines += ["", f"Cold start (fresh process, median of {cold['runs']}): load {cold['load_ms']:.1f} ms "
              f"(a second load in that process: {cold['load_again_ms']:.1f} ms), first call "
              + ("not measured (no GPU)" if cold["first_call_ms"] is None else
                 f"{cold['first_call_ms']:.1f} ms, load + first call {cold['load_plus_first_call_ms']:.1f} ms")
              + f"; Warp imported in that process: {'yes' if cold['warp_imported'] else 'no'}", ""]
    lines += ["| target | measured | met |", "|---|---:|---|"]
    for t in results["targets"]:
        value = "not measured" if t["measured"] is None else f"{t['measured']:.2f}{t['unit']}"
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        lines.append(f"| {t['target']} | {value} | {met} |")
    return "\n".join(lines)

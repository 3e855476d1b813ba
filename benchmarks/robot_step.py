"""What the robot-step benchmarks share: the step's floor and their command line.

``pipeline_step.py`` (this project's exports) and ``existing_tool_step.py`` (the existing tool's) time the same
step against the same floor: its kernels captured once as one CUDA graph and replayed, nothing else. Needs torch
and Warp only: ``module`` is anything with the example's kernels (``projected_gravity``, ``joint_offsets``,
``scale``, ``clamp_scale``), ``NUM_JOINTS`` and ``POLICY_NET``; ``robot`` has its ``device`` and ``default_pose``.
"""

from __future__ import annotations

import argparse

import torch
import warp as wp

__all__ = ["add_step_arguments", "floor_route", "table_head", "route_rows"]


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both robot-step scripts take: robots, calls, warm-up, interleaved rounds, output folder, JSON."""
    parser.add_argument("--envs", type=lambda s: [int(v) for v in s.split(",")], default=[256, 4096],
                        help="comma-separated numbers of robots (default 256,4096)")
    parser.add_argument("--calls", type=int, default=500, help="timed calls per route and run")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up calls per route and run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per route, interleaved (the spread)")
    parser.add_argument("--out", help="export folder (default: a new temporary folder)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")


def table_head(title: str, environment: dict) -> list[str]:
    """The first lines of both scripts' Markdown table: the title with the environment, the columns."""
    return [f"{title}: " + ", ".join(f"{k} {v}" for k, v in environment.items()), "",
            "| robots | route | median µs | p90 µs | spread of run medians µs | × floor | host µs | host × floor "
            "| max abs error |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]


def route_rows(envs, routes: dict, errors: dict) -> list[str]:
    """One table row per timed route (timing.measure_interleaved's results), × the ``floor`` route of the same run
    by CUDA events and by the host clock (perf_counter around the call and its synchronisation, the issue's)."""
    floor = routes.get("floor", {}).get("median_us", float("nan"))
    host_floor = routes.get("floor", {}).get("wall_median_us", float("nan"))
    rows = []
    for name, m in routes.items():
        error = errors.get(name)
        host = m.get("wall_median_us", float("nan"))
        rows.append(f"| {envs} | {name} | {m['median_us']:.1f} | {m['p90_us']:.1f} | "
                    f"{m['spread_us'][0]:.1f}-{m['spread_us'][1]:.1f} | {m['median_us'] / floor:.2f} | "
                    f"{host:.1f} | {host / host_floor:.2f} | {'-' if error is None else f'{error:.3g}'} |")
    return rows


def floor_route(module, robot, quat: torch.Tensor, joints: torch.Tensor):
    """The step's kernels captured once as one CUDA graph and replayed: the Warp launches of
    ``Go2.observe``/``act`` and torch's MLP, with the Warp scratch preallocated (a ``wp.empty`` inside
    torch's capture breaks it) and Warp on the capture stream, entered before the capture begins
    (``wp.ScopedStream`` without its event hand-off, which a capture refuses)."""
    n, joints_n, dev = quat.shape[0], module.NUM_JOINTS, robot.device
    static_quat, static_joints = quat.clone(), joints.clone()
    offsets = wp.empty((n, joints_n), dtype=float, device=dev)
    grav = torch.empty(n, 3, device=quat.device)
    joint_obs = torch.empty(n, joints_n, device=quat.device)
    net = module.POLICY_NET[-1]

    def step():
        wp.launch(module.projected_gravity, dim=n,
                  inputs=[wp.from_torch(static_quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                  outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=dev)
        wp.launch(module.joint_offsets, dim=(n, joints_n), inputs=[wp.from_torch(static_joints), robot.default_pose],
                  outputs=[offsets], device=dev)
        wp.launch(module.scale, dim=(n, joints_n), inputs=[offsets, 0.5], outputs=[wp.from_torch(joint_obs)],
                  device=dev)
        raw = net(torch.cat([grav, joint_obs], dim=-1))
        action = torch.empty_like(raw)
        wp.launch(module.clamp_scale, dim=raw.shape, inputs=[wp.from_torch(raw), -1.0, 1.0, 0.25],
                  outputs=[wp.from_torch(action)], device=dev)
        return action

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with wp.ScopedStream(wp.stream_from_torch(side), sync_enter=False, sync_exit=False), torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on the capture stream: modules loaded, cuBLAS and allocator pools primed
                step()
        side.synchronize()
        with torch.cuda.graph(graph, stream=side):
            out = step()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, out

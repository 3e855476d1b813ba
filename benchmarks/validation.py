"""What validating an export in a fresh process costs, next to exporting and to running it in-process.

Traces a small pipeline (a Warp segment node as PT2 when CUDA is usable, a
pure-torch PT2 node, an ONNX policy), exports it without validation, then
times, on the same export:

  export       session.compile(validate=False): artifacts and pipeline.yaml
  fresh        leapp._export.validate.validate_nodes with no kept worker: one
               worker process started, that loads every node as leapp.load does
               and runs the samples (the first compile(validate=True) of a process)
  reused       the same, right after: the worker kept by the previous
               validation runs it (the 2nd..Nth compile of a process)
  in-process   every node opened with make_runner in this process and run on
               the samples (what validation did before; kept here only to
               measure the difference)

    python benchmarks/validation.py [--repeat 3] [--device cuda:0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def build(device: str, save_path: str):
    import warp as wp

    import leapp
    from leapp import annotate

    @wp.kernel
    def scale_shift(x: wp.array(dtype=float), s: float, y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = x[i] * s + 1.0

    use_warp = device.startswith("cuda")
    policy = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(device).eval()

    def pre(x):
        with leapp.node("pre", export_with="pt2"):
            x = annotate.input_tensors("pre", {"x": x})
            y = torch.empty_like(x)
            if use_warp:
                with annotate.warp_op():
                    wp.launch(scale_shift, dim=x.numel(), inputs=[wp.from_torch(x.reshape(-1)), 2.0],
                              outputs=[wp.from_torch(y.reshape(-1))], device=device)
            else:
                y = x * 2.0 + 1.0
            annotate.output_tensors("pre", {"z": torch.relu(y) + x})
        return y

    @leapp.node("norm", export_with="pt2")
    def norm(z):
        return torch.nn.functional.layer_norm(z, (16,))

    @leapp.node("policy", export_with="onnx")
    def act(h):
        with torch.no_grad():
            return policy(h)

    x = torch.randn(32, 16, device=device)
    with leapp.trace("bench", save_path=save_path) as session:
        for _ in range(4):
            act(norm(pre(x)))
    return session


def in_process(record, folder) -> None:
    from leapp._export.validate import compare
    from leapp.runtime.io import IOSpec
    from leapp.runtime.open_artifact import make_runner

    for node in record.nodes.values():
        device = str(node.samples[0].inputs[0].device)
        suffix = "onnx" if node.export_with == "onnx" else "pt2"
        runner = make_runner(node.export_with, folder / f"{node.name}.{suffix}",
                             [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in node.inputs],
                             [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in node.outputs], device,
                             has_segments=bool(node.segments))
        for sample in node.samples:
            for spec, got, want in zip(node.outputs, runner(list(sample.inputs)), sample.outputs):
                assert compare(spec.name, got, want, 1e-3, 1e-5).ok, node.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    from leapp._export.compile import compile_session
    from leapp._export.validate import NodeArtifactJob, validate_nodes
    from leapp._export.validate_process import stop_kept_worker

    with tempfile.TemporaryDirectory() as tmp:
        session = build(args.device, tmp)
        record = session.record
        times: dict[str, list[float]] = {"export": [], "fresh": [], "reused": [], "in-process": []}
        for _ in range(args.repeat):
            t = time.perf_counter()
            report = compile_session(record, validate=False)
            times["export"].append(time.perf_counter() - t)
            folder = report.path
            jobs = [NodeArtifactJob(n, n.export_with, folder / row.artifact)
                    for n, row in zip(record.nodes.values(), report)]
            stop_kept_worker()
            for kind in ("fresh", "reused"):
                t = time.perf_counter()
                results = validate_nodes(jobs, 1e-3, 1e-5, folder=folder)
                times[kind].append(time.perf_counter() - t)
                assert all(r.status == "passed" for r in results), [(r.node, r.reason) for r in results]
            t = time.perf_counter()
            in_process(record, folder)
            times["in-process"].append(time.perf_counter() - t)
    print(f"device {args.device}, {len(record.nodes)} nodes, {sum(len(n.samples) for n in record.nodes.values())} "
          f"samples, median of {args.repeat} (min-max) in seconds:")
    for name, values in times.items():
        print(f"  {name:<11} {statistics.median(values):7.2f}  ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()

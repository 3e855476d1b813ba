"""What reading pipeline.yaml costs at leapp.pipeline_format's limits (time and peak memory, one process each).

    python benchmarks/pipeline_yaml_limits.py            # prints one row per case

Cases: a leapp-written description of 1, 100 and 1000 nodes; the largest accepted files (MAX_VALUES
strings in ``constants``, one MAX_FILE_BYTES string); and hostile files refused before composing
(an alias bomb, 100000 levels of nesting, MAX_VALUES + 1 values). Each case runs in a fresh
interpreter so that ru_maxrss is its own peak. The numbers in docs/pipeline-format.md come from here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_CASE = textwrap.dedent(
    """
    import json, resource, sys, time
    from leapp import pipeline_format as pf
    from leapp.pipeline_format import PipelineError

    def leapp_written(nodes):
        spec = lambda n: {"name": n, "dtype": "float32", "shape": [64, 3]}
        desc = {"format": "leapp.pipeline", "version": 1, "name": "bench", "producer": {"leapp": "0.1.0"},
                "nodes": [], "edges": [], "inputs": [], "outputs": [], "constants": []}
        for i in range(nodes):
            desc["nodes"].append({"name": f"n{i}", "backend": "pt2", "artifact": f"n{i}.pt2", "sha256": "a" * 64,
                                  "files": [], "source": "robot.py:10", "device": "cuda:0",
                                  "inputs": [spec("x")], "outputs": [spec("y")],
                                  "segments": [{"id": f"n{i}/warp_segment_0", "source": "robot.py:12",
                                                "device": "cuda:0", "digest": "b" * 64, "kernels": ["k"],
                                                "producer": {"warp": "1.19.0"}}]})
            if i:
                desc["edges"].append({"from_node": f"n{i-1}", "from_output": "y", "to_node": f"n{i}", "to_input": "x"})
        desc["inputs"].append(spec("x") | {"consumers": [{"node": "n0", "input": "x"}]})
        desc["outputs"].append({"name": "y", "node": f"n{nodes-1}", "output": "y", "dtype": "float32", "shape": [64, 3]})
        from leapp._export.pipeline_yaml import dump_pipeline_yaml
        return dump_pipeline_yaml(desc)

    def head():
        return leapp_written(1).replace("constants: []", "")

    case = sys.argv[1]
    if case.startswith("nodes="):
        text = leapp_written(int(case.split("=")[1]))
    elif case == "max_values":
        text = head() + "constants: [" + ", ".join(["c"] * (pf.MAX_VALUES - 120)) + "]\\n"
    elif case == "max_bytes":
        text = head() + "constants: [" + "c" * (pf.MAX_FILE_BYTES - 4000) + "]\\n"
    elif case == "alias_bomb":
        lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
        lines += [f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]" for p, n in zip("abcdefgh", "bcdefghi")]
        text = head() + "\\n".join(lines) + "\\nconstants: []\\n"
    elif case == "deep":
        text = head() + "constants: " + "[\\n" * 100_000 + "]" * 100_000 + "\\n"
    elif case == "too_many_values":
        text = head() + "constants: [" + ", ".join(["c"] * (pf.MAX_VALUES + 1)) + "]\\n"
    data = text.encode()
    start = time.perf_counter()
    try:
        pf.parse_description(data)
        outcome = "read"
    except PipelineError as e:
        outcome = "refused: " + str(e).split(": ", 2)[-1][:60]
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"case": case, "bytes": len(data), "seconds": seconds, "peak_rss_mib": rss, "outcome": outcome}))
    """
)

CASES = ["nodes=1", "nodes=100", "nodes=1000", "max_values", "max_bytes", "alias_bomb", "deep", "too_many_values"]


def main() -> None:
    print(f"{'case':<16} {'size':>10} {'seconds':>8} {'peak RSS':>10}  outcome")
    for case in CASES:
        out = subprocess.run([sys.executable, "-c", _CASE, case], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{row['case']:<16} {row['bytes'] / 2**20:>8.2f} MiB {row['seconds']:>8.2f} "
              f"{row['peak_rss_mib']:>6.0f} MiB  {row['outcome']}")


if __name__ == "__main__":
    main()

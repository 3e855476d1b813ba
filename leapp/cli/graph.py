"""leapp/cli/graph.py: ``leapp inspect EXPORT --graph out.svg``: a picture of an export's pipeline.

Drawn from the checked pipeline.yaml alone (``leapp.pipeline_format``), so it needs no
torch, Warp or GPU: pipeline inputs on top, the nodes in rows by data flow (a node sits one
row below the lowest node feeding it), pipeline outputs at the bottom; inputs and outputs
show the user's metadata (docs/pipeline-format.md). A node's box names its backend, device
and artifact and lists its Warp segments with their kernels; an edge is labelled with the
tensors it carries (``from -> to``, dtype and shape) and goes around the boxes of rows it
skips; feedback edges (state the caller carries between runs) are dashed.

Rendered with matplotlib (the optional extra ``leapp[graph]``), without pyplot and its
global state; text stays text in SVG files so they can be searched.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from leapp.errors import LeappError
from leapp.pipeline_format import PIPELINE_FILE, PipelineError, read_pipeline

__all__ = ["FORMATS", "GraphError", "draw_graph", "graph_command", "layout"]

FORMATS = (".svg", ".png", ".pdf")

FONT_SIZE = 9.0  # points; monospace, so a label's width follows from its length
CHAR_W = 0.6 * FONT_SIZE
LINE_H = 1.35 * FONT_SIZE
PAD = 8.0  # inside a box, points
H_GAP = 36.0  # between boxes of one row
V_GAP = 70.0  # between rows: room for the edge labels
MARGIN = 20.0
WRAP = 56  # characters per line of a kernel list
ARROW = {"arrowstyle": "-|>", "mutation_scale": 10, "color": "#333333", "linewidth": 1}
COLORS = {"onnx": "#dbe9f6", "pt2": "#fde3c8", "torchscript": "#dcefd6", "input": "#eeeeee", "output": "#eeeeee"}


class GraphError(LeappError):
    """``--graph`` cannot draw: matplotlib is missing or the output's format is not one it writes here."""


@dataclass
class Box:
    """One drawn box: a pipeline input, a node or a pipeline output; ``x``, ``y`` its top-left corner (points)."""

    key: str
    kind: str  # "input", "output", or the node's backend
    lines: list[str]
    row: int
    x: float = 0.0
    y: float = 0.0
    width: float = field(init=False)
    height: float = field(init=False)

    def __post_init__(self):
        self.width = max(len(line) for line in self.lines) * CHAR_W + 2 * PAD
        self.height = len(self.lines) * LINE_H + 2 * PAD


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    label: str
    feedback: bool = False


def _spec(entry: dict) -> str:
    return f"{entry['dtype']}{list(entry['shape'])}"


def _renamed(source: str, target: str) -> str:
    """An edge's tensor name, or both names where the consumer calls it otherwise."""
    return source if source == target else f"{source} -> {target}"


def _end_lines(kind: str, entry: dict) -> list[str]:
    """A pipeline input's or output's box: name, dtype and shape, and the user's metadata (wrapped JSON)."""
    lines = [f"{kind} {entry['name']}", _spec(entry)]
    if entry.get("metadata"):
        lines += textwrap.wrap(json.dumps(entry["metadata"], ensure_ascii=False), WRAP // 2)
    return lines


def _node_lines(node: dict) -> list[str]:
    lines = [node["name"], f"{node['backend']} on {node['device']}: {node['artifact']}"]
    prefix = node["name"] + "/"
    for seg in node["segments"]:
        head = f"segment {seg['id'].removeprefix(prefix)}: "
        kernels = textwrap.wrap(", ".join(seg["kernels"]) or "no kernels", WRAP - len(head)) or [""]
        lines.append(head + kernels[0])
        lines.extend(" " * len(head) + more for more in kernels[1:])
    if not node["segments"]:
        lines.append("no Warp segments")
    return lines


def layout(pipeline: dict) -> tuple[list[Box], list[Arrow], float, float]:
    """(boxes placed in points, arrows, width, height) for a checked pipeline.yaml description."""
    nodes = {n["name"]: n for n in pipeline["nodes"]}
    specs = {(n["name"], e["name"]): _spec(e) for n in pipeline["nodes"] for e in n["outputs"]}
    arrows: list[Arrow] = []
    row = {}
    for entry in pipeline["inputs"]:
        for consumer in entry["consumers"]:
            arrows.append(Arrow(f"in:{entry['name']}", consumer["node"], _renamed(entry["name"], consumer["input"])))
    for edge in pipeline["edges"]:
        tensor = specs[(edge["from_node"], edge["from_output"])]
        arrows.append(Arrow(edge["from_node"], edge["to_node"], f"{_renamed(edge['from_output'], edge['to_input'])}\n{tensor}",
                            bool(edge.get("feedback", False))))
    for name in nodes:  # execution order: every forward edge comes from a node already placed
        above = [row[a.source] for a in arrows if a.target == name and not a.feedback and a.source in row]
        row[name] = 1 + max(above, default=0)
    last = 1 + max(row.values(), default=0)
    for entry in pipeline["outputs"]:
        arrows.append(Arrow(entry["node"], f"out:{entry['name']}", entry["output"]))
    boxes = [Box(f"in:{e['name']}", "input", _end_lines("input", e), 0) for e in pipeline["inputs"]]
    boxes += [Box(name, node["backend"], _node_lines(node), row[name]) for name, node in nodes.items()]
    boxes += [Box(f"out:{e['name']}", "output", _end_lines("output", e), last) for e in pipeline["outputs"]]
    return _placed(boxes, arrows)


def _placed(boxes: list[Box], arrows: list[Arrow]) -> tuple[list[Box], list[Arrow], float, float]:
    """Rows top to bottom, each centred; a row's boxes ordered by where the boxes feeding them sit."""
    rows: dict[int, list[Box]] = {}
    for box in boxes:
        rows.setdefault(box.row, []).append(box)
    centre: dict[str, float] = {}
    width = max(sum(b.width for b in r) + H_GAP * (len(r) - 1) for r in rows.values())
    y = MARGIN
    for index in sorted(rows):
        row = rows[index]
        first = {box.key: i for i, box in enumerate(row)}

        def pull(box: Box) -> float:
            feeds = [centre[a.source] for a in arrows if a.target == box.key and a.source in centre]
            return sum(feeds) / len(feeds) if feeds else first[box.key] * 1e-3

        row.sort(key=pull)
        x = MARGIN + (width - sum(b.width for b in row) - H_GAP * (len(row) - 1)) / 2
        for box in row:
            box.x, box.y = x, y
            centre[box.key] = x + box.width / 2
            x += box.width + H_GAP
        y += max(b.height for b in row) + V_GAP
    return boxes, arrows, width + 2 * MARGIN, y - V_GAP + MARGIN


def _ports(boxes: dict[str, Box], arrows: list[Arrow]) -> dict[int, tuple[float, float]]:
    """Where each arrow leaves its source and enters its target: spread along the box's bottom and top edges."""
    out_x: dict[int, float] = {}
    in_x: dict[int, float] = {}
    for side, ends in (("source", out_x), ("target", in_x)):
        for key, box in boxes.items():
            mine = [i for i, a in enumerate(arrows) if getattr(a, side) == key]
            other = "target" if side == "source" else "source"
            mine.sort(key=lambda i: boxes[getattr(arrows[i], other)].x)
            for rank, i in enumerate(mine):
                ends[i] = box.x + box.width * (rank + 1) / (len(mine) + 1)
    return {i: (out_x[i], in_x[i]) for i in range(len(arrows))}


def _detour(points: list[tuple[float, float]], between: list[Box]) -> list[tuple[float, float]]:
    """``points`` (a straight arrow over rows it skips), led beside the boxes of those rows where it would cross one."""
    (x0, y0), (x1, y1) = points

    def crosses(box: Box) -> bool:
        top, bottom = (x0 + (x1 - x0) * (y - y0) / (y1 - y0) for y in (box.y - 4, box.y + box.height + 4))
        return min(top, bottom) <= box.x + box.width + 4 and max(top, bottom) >= box.x - 4

    if not any(crosses(b) for b in between):
        return points
    right = max(b.x + b.width for b in between) + H_GAP / 2
    left = min(b.x for b in between) - H_GAP / 2
    middle = (x0 + x1) / 2
    x = right if left < MARGIN or abs(right - middle) <= abs(left - middle) else left
    top = min(b.y for b in between) - V_GAP / 3
    bottom = max(b.y + b.height for b in between) + V_GAP / 3
    return [(x0, y0), (x, top), (x, bottom), (x1, y1)]


def _routes(boxes: list[Box], arrows: list[Arrow]) -> list[list[tuple[float, float]]]:
    """Each arrow's points: bottom edge to top edge (around boxes in rows it skips); feedback: right side to right side."""
    by_key = {b.key: b for b in boxes}
    ports = _ports(by_key, arrows)
    routes = []
    for i, arrow in enumerate(arrows):
        source, target = by_key[arrow.source], by_key[arrow.target]
        if arrow.feedback:
            routes.append([(source.x + source.width, source.y + source.height / 2),
                           (target.x + target.width, target.y + target.height / 2)])
            continue
        (x0, x1), between = ports[i], [b for b in boxes if source.row < b.row < target.row]
        routes.append(_detour([(x0, source.y + source.height), (x1, target.y)], between))
    return routes


def draw_graph(export: str | Path, out: str | Path) -> Path:
    """Draws the export folder's pipeline into ``out`` (.svg, .png or .pdf, by its suffix); returns ``out``.

    Raises GraphError (no matplotlib, unknown suffix) or PipelineError (pipeline.yaml unreadable).
    """
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise GraphError(f"--graph {out}: the picture's format follows its suffix, one of {', '.join(FORMATS)}")
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
        from matplotlib.path import Path as MplPath
    except ImportError as e:
        raise GraphError(f"--graph needs matplotlib, which is not installed ({e}): pip install 'leapp[graph]'") from e
    _, pipeline = read_pipeline(export)
    boxes, arrows, width, height = layout(pipeline)
    routes = _routes(boxes, arrows)
    width = max([width, *(x + MARGIN for points in routes for x, _ in points)])
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "monospace", "font.size": FONT_SIZE}):
        fig = Figure(figsize=(width / 72, height / 72), dpi=144)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)  # y grows downwards, as the layout's
        ax.set_axis_off()
        for box in boxes:
            ax.add_patch(FancyBboxPatch((box.x, box.y), box.width, box.height, boxstyle="round,pad=0,rounding_size=6",
                                        facecolor=COLORS.get(box.kind, "#ffffff"), edgecolor="#555555", linewidth=1))
            for i, line in enumerate(box.lines):
                bold = i == 0 and box.kind not in ("input", "output")
                ax.text(box.x + PAD, box.y + PAD + (i + 0.5) * LINE_H, line, va="center", ha="left",
                        fontweight="bold" if bold else "normal", gid=f"{box.key}:{i}")
        for arrow, points in zip(arrows, routes):
            if arrow.feedback:  # upwards, curved beside the boxes
                patch = FancyArrowPatch(*points, connectionstyle="arc3,rad=-0.4", linestyle="--", **ARROW)
            else:
                codes = [MplPath.MOVETO] + [MplPath.LINETO] * (len(points) - 1)
                patch = FancyArrowPatch(path=MplPath(points, codes), **ARROW)
            ax.add_patch(patch)
            (xa, ya), (xb, yb) = points[len(points) // 2 - 1], points[len(points) // 2]  # the middle segment
            ax.text((xa + xb) / 2, (ya + yb) / 2, arrow.label, ha="center", va="center", fontsize=FONT_SIZE - 1,
                    linespacing=1.1, bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none"})
        fig.savefig(out, format=out.suffix.lower().lstrip("."))
    return out


def graph_command(export: str | Path, out: str | Path, err: TextIO | None = None) -> int:
    """``leapp inspect EXPORT --graph OUT``: draws, prints where; returns 0, or 1 after printing why not."""
    err = err if err is not None else sys.stderr
    export = Path(export)
    if not (export / PIPELINE_FILE).is_file() and export.name != PIPELINE_FILE:
        print(f"leapp inspect: error: --graph draws an export folder's {PIPELINE_FILE}; {export} has none", file=err)
        return 1
    try:
        path = draw_graph(export, out)
    except (GraphError, PipelineError, OSError) as e:
        print(f"leapp inspect: error: {e}", file=err)
        return 1
    print(f"graph: {path}")
    return 0

"""leapp/testing/localise.py: which node of an export diverges from the eager code on one input.

The eager function runs once more in observation mode (``leapp._recorder.observe``):
each ``leapp.node`` keeps a copy of what it received and returned, nothing is
traced and nothing process-wide changes. Each node of the export then runs alone
(``Pipeline.run_node``, through the route that failed) on the eager node inputs,
and its outputs are compared with the eager node outputs. Because every node is
fed eager values, an earlier node's error cannot leak into a later node's
verdict: the first node in pipeline order that differs is where the export and
the eager code part.

With state, the sequence is observed step by step from the eager code's reset
(``localise_sequence``): each node's inputs include the state the eager code
carried into that step, and a node is run alone with it (``run_node`` takes
state inputs explicitly). The first step at which a node differs is reported,
which may come before the failing step: a state update that differs shows in
the node's ``<name>_out`` output there, while the outputs may only part later.

NOTE: observation stops at node boundaries. Inside a node, leapp cannot tell a
Warp segment's error from the torch work around it without a trace, so a
diverging node's segments are named as suspects, not convicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from leapp._recorder.observe import NodeObservation, observing

from .outputs import OutputDiff, compare_output
from .routes import OpenRoute

__all__ = ["NodeVerdict", "Localisation", "localise", "localise_sequence"]


@dataclass
class NodeVerdict:
    """One node run alone on its eager inputs: matches, differs, or could not be compared (and why)."""

    node: str
    status: str  # "matches" | "differs" | "not compared"
    why: str = ""
    diffs: list[OutputDiff] = field(default_factory=list)


@dataclass
class Localisation:
    verdicts: list[NodeVerdict]
    first: NodeVerdict | None
    wiring: list[str]  # eager values that change between nodes (work outside any node is not exported)
    notes: list[str]

    def lines(self, pipeline, route: str) -> list[str]:
        out = [f"localisation (eager code observed at node boundaries; each node run alone on its eager inputs "
               f"through route '{route}'):"]
        for v in self.verdicts:
            node = pipeline.nodes[v.node]
            label = f"{v.node} ({node.backend}, {node.artifact.name})"
            if v.status == "matches":
                out.append(f"  {label}: matches")
            elif v.status == "differs":
                mark = "FIRST DIVERGING NODE" if v is self.first else "differs too"
                out.append(f"  {label}: {mark}" + (f": {v.why}" if v.why else ""))
                out.extend(f"    {d.describe()}" for d in v.diffs if not d.ok)
            else:
                out.append(f"  {label}: not compared: {v.why}")
        if self.first is not None:
            node = pipeline.nodes[self.first.node]
            source = pipeline.description["nodes"][list(pipeline.nodes).index(node.name)]["source"]
            out.append(f"  => node '{node.name}' (traced at {source}) is where the export and the eager code part.")
            if node.segments:
                segs = "; ".join(f"{s['id']} ({s['source']}; kernels {', '.join(s['kernels'])})" for s in node.segments)
                out.append(f"  Warp segments of '{node.name}', the suspects: {segs}. leapp observes node boundaries "
                           "only, so it cannot tell which segment (or the torch work around them) diverged.")
        elif not self.wiring:
            out.append("  every node matches alone on its eager inputs, and the eager values between nodes are the "
                       "ones the export passes: the difference comes from running the nodes together here (state "
                       "kept between calls, feedback inputs, CUDA graph reuse) or from non-deterministic code.")
        if self.wiring:
            out.append("  eager work outside leapp.node (not exported) changes values between nodes:")
            out.extend(f"    {w}" for w in self.wiring)
        out.extend(f"  note: {n}" for n in self.notes)
        return out


def _node_verdict(node, seen: NodeObservation | None, route: OpenRoute, rtol: float, atol: float) -> NodeVerdict:
    if seen is None:
        return NodeVerdict(node.name, "not compared", f"the eager code ran no leapp.node('{node.name}')")
    expected = [s.name for s in node.inputs]
    if sorted(seen.inputs) != sorted(expected):
        return NodeVerdict(node.name, "differs", f"the eager node declares inputs {list(seen.inputs)}, the export's "
                                                 f"has {expected}")
    try:
        got = route.run_node(node.name, {n: seen.inputs[n] for n in expected})
    except Exception as e:  # noqa: BLE001 - reported as the node's verdict
        return NodeVerdict(node.name, "differs", f"running it alone on the eager inputs raised {type(e).__name__}: {e}")
    diffs = []
    for spec in node.outputs:
        if spec.name not in seen.outputs:
            diffs.append(OutputDiff(spec.name, False, detail=f"got no eager output '{spec.name}' (eager declared "
                                                             f"{list(seen.outputs)})"))
        else:
            diffs.append(compare_output(spec.name, got[spec.name], seen.outputs[spec.name], rtol, atol))
    status = "matches" if all(d.ok for d in diffs) else "differs"
    return NodeVerdict(node.name, status, "", diffs)


def _spec(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _wiring(desc: Mapping, seen: Mapping[str, NodeObservation], inputs: Mapping[str, torch.Tensor],
            eager: Mapping[str, torch.Tensor], rtol: float, atol: float) -> list[str]:
    """Places where the eager code hands a node something other than what the export would."""
    found = []

    def check(what: str, export_value: torch.Tensor | None, eager_value: torch.Tensor | None) -> None:
        if export_value is None or eager_value is None:
            return
        diff = compare_output("", eager_value, export_value, rtol, atol, labels=("eager", "export"))
        if diff.ok:
            return
        if diff.detail.startswith("got "):  # shape or dtype
            found.append(f"{what}: eager {_spec(eager_value)}, export {_spec(export_value)}")
        else:
            found.append(f"{what}: {diff.detail} (max abs {diff.max_abs:.3g})")

    for entry in desc["inputs"]:
        for c in entry["consumers"]:
            node = seen.get(c["node"])
            check(f"pipeline input '{entry['name']}' -> node '{c['node']}' input '{c['input']}'",
                  inputs.get(entry["name"]), node.inputs.get(c["input"]) if node else None)
    for e in desc["edges"]:
        if e.get("feedback", False):
            continue
        src, dst = seen.get(e["from_node"]), seen.get(e["to_node"])
        check(f"node '{e['from_node']}' output '{e['from_output']}' -> node '{e['to_node']}' input '{e['to_input']}'",
              src.outputs.get(e["from_output"]) if src else None, dst.inputs.get(e["to_input"]) if dst else None)
    for o in desc["outputs"]:
        node = seen.get(o["node"])
        check(f"node '{o['node']}' output '{o['output']}' -> pipeline output '{o['name']}' (what fn returned)",
              node.outputs.get(o["output"]) if node else None, eager.get(o["name"]))
    return found


def localise(fn: Callable, inputs: Mapping[str, torch.Tensor], eager: Mapping[str, torch.Tensor], route: OpenRoute,
             rtol: float, atol: float) -> Localisation:
    """Runs ``fn`` in observation mode on ``inputs`` and each node of ``route``'s pipeline alone."""
    with observing() as observer:
        fn(**{k: v.clone() for k, v in inputs.items()})
    pipeline = route.pipeline
    seen = {n: observer.first(n) for n in pipeline.nodes}
    notes = []
    for name in pipeline.nodes:
        count = sum(r.name == name for r in observer.runs)
        if count > 1:
            notes.append(f"the eager code ran node '{name}' {count} times; its first execution is compared")
        if seen[name] is not None:
            notes.extend(f"node '{name}': {n}" for n in seen[name].notes)
    extra = sorted({r.name for r in observer.runs} - set(pipeline.nodes))
    if extra:
        notes.append(f"the eager code ran node(s) {extra} that the export does not have")
    verdicts = [_node_verdict(node, seen[node.name], route, rtol, atol) for node in pipeline.nodes.values()]
    first = next((v for v in verdicts if v.status == "differs"), None)
    wiring = _wiring(pipeline.description, {k: v for k, v in seen.items() if v is not None}, inputs, eager, rtol, atol)
    return Localisation(verdicts, first, wiring, notes)


def localise_sequence(fn: Callable, steps: Sequence[Mapping[str, torch.Tensor]],
                      eager: Sequence[Mapping[str, torch.Tensor]], route: OpenRoute, rtol: float, atol: float,
                      reset: Callable[[], object] | None) -> Localisation:
    """``localise`` at each step of a sequence from the eager code's ``reset``, up to the first step at which a
    node differs (else the last, failing step); the notes say which step that is."""
    if reset is not None:
        reset()
    last = len(steps)
    for step, (inputs, outputs) in enumerate(zip(steps, eager), 1):
        found = localise(fn, inputs, outputs, route, rtol, atol)
        if found.first is None and step < last:
            continue
        where = f"observed at step {step} of {last}, from reset: node inputs include the state the eager code carried"
        if step < last:
            where += (f"; node '{found.first.node}' already differs at step {step}, where the pipeline's outputs "
                      f"still matched: what it hands the next step (its state) parts first")
        found.notes.insert(0, where)
        return found
    raise AssertionError("unreachable: the loop returns at the last step")

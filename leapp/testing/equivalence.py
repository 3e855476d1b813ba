"""leapp/testing/equivalence.py: ``assert_equivalent`` and ``replay_counterexample``.

One property: for every input hypothesis draws, the user's eager function and the export,
run through every route that can run here, return the same outputs. A failure is shrunk
by hypothesis, written to a counterexample file, localised to a node, and raised as one
``AssertionError`` whose text is the same when the file is replayed.

An export with state is checked on sequences: each example is ``steps`` input dicts, run
from the export's ``reset()`` and the user's ``reset`` callable; every step's outputs must
match, and a mismatch names its step.
"""

from __future__ import annotations

import os
import sys
import unittest
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import hypothesis
import torch
from hypothesis.strategies import SearchStrategy

from leapp.pipeline_format import read_pipeline

from . import counterexample as cx
from .inputs import input_strategy
from .localise import localise, localise_sequence
from .outputs import OutputDiff, compare_output, describe_tensor, eager_outputs
from .routes import ROUTES, OpenRoute, open_route, plan_routes, state_keys

__all__ = ["DEFAULT_RTOL", "DEFAULT_ATOL", "EquivalenceResult", "NoRunnableRoute", "RouteSkippedWarning",
           "assert_equivalent", "replay_counterexample"]

DEFAULT_RTOL = 1e-3  # session.compile(validate=True)'s tolerances
DEFAULT_ATOL = 1e-5
DEFAULT_STATE_STEPS = 4  # steps per example for an export with state (1 without)


class NoRunnableRoute(unittest.SkipTest):
    """No selected route can run the export here. A ``unittest.SkipTest``: pytest and unittest report the
    test as skipped, with this message (every route and why it cannot run)."""


class RouteSkippedWarning(UserWarning):
    """A route named in ``routes=`` was skipped (why is in the message)."""


@dataclass(frozen=True)
class EquivalenceResult:
    """What ``assert_equivalent`` checked: the routes that ran, those skipped and why, the examples run
    (each a sequence of ``steps`` calls)."""

    export: str
    ran: tuple[str, ...]
    skipped: Mapping[str, str]
    examples: int
    steps: int = 1


Steps = list[dict[str, torch.Tensor]]  # one input dict (or eager output dict) per step


class _Mismatch(AssertionError):
    """One example on which a route differs from eager (or raised); shrunk by hypothesis, then reported.

    ``steps`` / ``eager`` run up to the failing step, the last one (one step without a sequence)."""

    def __init__(self, route: str, steps: Steps, eager: Steps, diffs: list[OutputDiff], error: str = "",
                 sequence: bool = False) -> None:
        where = f" at step {len(steps)}" if sequence else ""
        super().__init__(f"route '{route}'{where}: " + (error or "; ".join(d.describe() for d in diffs if not d.ok)))
        self.route, self.steps, self.eager, self.diffs, self.error = route, steps, eager, diffs, error

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        return self.steps[-1]


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _select(routes: Sequence[str] | None) -> list[str]:
    if routes is None:
        return list(ROUTES)
    if isinstance(routes, str):
        routes = [routes]
    unknown = [r for r in routes if r not in ROUTES]
    if unknown or not routes:
        raise ValueError(f"routes={list(routes)!r}: unknown route(s) {unknown}; the routes are {list(ROUTES)}"
                         if unknown else f"routes=[] selects nothing; the routes are {list(ROUTES)}")
    return list(dict.fromkeys(routes))


def _not_in_a_trace() -> None:
    session_module = sys.modules.get("leapp._recorder.session")
    if session_module is not None and session_module.current_session() is not None:
        raise RuntimeError("leapp.testing.assert_equivalent was called inside leapp.trace(...): the eager code "
                           "would be recorded, not run; call it outside the session")


def _steps(steps: int | None, state: list[str]) -> int:
    if steps is None:
        return DEFAULT_STATE_STEPS if state else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: expected a whole number of steps per example, at least 1")
    return steps


def _reset(reset: Callable[[], Any] | None, state: list[str], export: str, steps: int) -> Callable[[], Any] | None:
    if reset is not None and not callable(reset):
        raise TypeError(f"reset={reset!r}: expected a callable with no arguments that resets the eager code's state")
    if reset is None and state:
        raise TypeError(f"export '{export}' carries state ({', '.join(state)}), so each example is a sequence of "
                        f"{steps} step(s) from its initial state: pass reset=, a callable with no arguments that "
                        "restores your eager code's state to its value at the first traced call (leapp.testing "
                        "resets the export with Pipeline.reset())")
    return reset


class _Checker:
    """The export's runnable routes next to the eager function: one example checked, one failure reported.

    An example is a list of input dicts: one call without state, a sequence of calls from the reset state
    with (``self.sequence``)."""

    def __init__(self, fn: Callable, export_dir: str | os.PathLike, routes: Sequence[str] | None, rtol: float,
                 atol: float, explicit: bool, steps: int | None = None, reset: Callable[[], Any] | None = None,
                 sequence: bool | None = None) -> None:
        _not_in_a_trace()
        self.fn, self.rtol, self.atol = fn, rtol, atol
        self.explicit = explicit  # the caller named the routes: say when one is skipped
        self.folder, self.desc = read_pipeline(export_dir)
        self.export = self.desc["name"]
        self.state = state_keys(self.desc)
        self.steps = _steps(steps, self.state)
        self.reset = _reset(reset, self.state, self.export, self.steps)
        self.sequence = bool(self.state) or self.steps > 1 if sequence is None else sequence
        self.output_names = [o["name"] for o in self.desc["outputs"]]
        self.selected = _select(routes)
        runnable, self.skipped = plan_routes(self.desc, self.selected)
        self.open: list[OpenRoute] = []
        for route in runnable:
            opened, reason = open_route(route, self.folder)
            if opened is None:
                self.skipped[route.name] = reason
            else:
                self.open.append(opened)
        if not self.open:
            reasons = "\n".join(f"  {name}: {why}" for name, why in self.skipped.items())
            raise NoRunnableRoute(f"leapp.testing: no route can run export '{self.export}' ({self.folder}) here:\n"
                                  f"{reasons}")
        self.examples = 0

    @property
    def ran(self) -> tuple[str, ...]:
        return tuple(r.route.name for r in self.open)

    def eager(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        result = self.fn(**{k: v.clone() for k, v in inputs.items()})
        outputs = eager_outputs(result, self.output_names, _fn_name(self.fn))
        # a sequence keeps every step's outputs: a copy, in case fn returns its own state and updates it in place
        return {k: v.clone() for k, v in outputs.items()} if self.sequence else outputs

    def eager_steps(self, steps: Steps) -> Steps:
        """``fn`` on each step in order, after ``reset()`` (a sequence); its outputs per step."""
        if self.reset is not None:
            self.reset()
        return [self.eager(inputs) for inputs in steps]

    def run_route(self, route: OpenRoute, steps: Steps, eager: Steps) -> _Mismatch | None:
        """The steps through ``route`` from its reset state; the first step that differs from ``eager``."""
        done = 0
        try:
            route.reset()
            for got in route.run_steps([{k: v.clone() for k, v in inputs.items()} for inputs in steps]):
                want = eager[done]
                done += 1
                diffs = [compare_output(n, got[n], want[n], self.rtol, self.atol) for n in self.output_names]
                if not all(d.ok for d in diffs):
                    return _Mismatch(route.route.name, steps[:done], eager[:done], diffs, sequence=self.sequence)
        except Exception as e:  # noqa: BLE001 - the export failing where eager works is a counterexample too
            n = len(steps) if route.whole_sequence else done + 1  # one leapp-run process runs the whole sequence
            return _Mismatch(route.route.name, steps[:n], eager[:n], [], f"the export raised {type(e).__name__}: {e}",
                             self.sequence)
        return None

    def check(self, steps: Steps) -> None:
        """Raises ``_Mismatch`` for the first route (in order) that differs from eager on ``steps``."""
        self.examples += 1
        eager = self.eager_steps(steps)
        for route in self.open:
            mismatch = self.run_route(route, steps, eager)
            if mismatch is not None:
                raise mismatch

    def report(self, mismatch: _Mismatch, path: Path) -> str:
        """The failure's text: route, outputs, counterexample, the other routes, the diverging node."""
        route = next(r for r in self.open if r.route.name == mismatch.route)
        at = ""
        if self.sequence:
            at = (f" at step {len(mismatch.steps)} (of a sequence run from reset(): the export's initial state and "
                  "the eager code's reset callable)")
        lines = [f"leapp.testing: export '{self.export}' ({self.folder}) differs from eager {_fn_name(self.fn)} "
                 f"on route '{route.route.name}'{at}: {route.route.description}"]
        if mismatch.error:
            lines.append(f"  {mismatch.error}")
        lines.extend(f"  {d.describe()}" for d in mismatch.diffs if not d.ok)
        replay = "replay_counterexample(path, fn, export_dir, reset=reset)" if self.reset is not None else \
            "replay_counterexample(path, fn, export_dir)"
        lines.append(f"counterexample (shrunk by hypothesis), saved to {path}; leapp.testing.{replay} reproduces "
                     "this failure:")
        if self.sequence:
            for i, inputs in enumerate(mismatch.steps, 1):
                lines.append(f"  step {i}:" + (" (the failing step)" if i == len(mismatch.steps) else ""))
                lines.extend(f"    {describe_tensor(k, v)}" for k, v in inputs.items())
        else:
            lines.extend(f"  {describe_tensor(k, v)}" for k, v in mismatch.inputs.items())
        others = []
        for other in self.open:
            if other is route:
                continue
            result = self.run_route(other, mismatch.steps, mismatch.eager)
            others.append(f"  {other.route.name}: " + ("matches" if result is None else f"differs too ({result.args[0]})"))
        others.extend(f"  {name}: skipped: {why}" for name, why in self.skipped.items())
        if others:
            lines.append("other routes on this counterexample:")
            lines.extend(others)
        if mismatch.error:
            lines.append("localisation: not attempted (the export raised instead of returning outputs).")
        else:
            try:
                if self.sequence:
                    found = localise_sequence(self.fn, mismatch.steps, mismatch.eager, route, self.rtol, self.atol,
                                              self.reset)
                else:
                    found = localise(self.fn, mismatch.inputs, mismatch.eager[-1], route, self.rtol, self.atol)
            except Exception as e:  # noqa: BLE001 - the mismatch above must still be reported
                lines.append(f"localisation failed: {type(e).__name__}: {e}")
            else:
                lines.extend(found.lines(route.pipeline, route.route.name))
        return "\n".join(lines)

    def result(self) -> EquivalenceResult:
        return EquivalenceResult(self.export, self.ran, dict(self.skipped), self.examples, self.steps)

    def warn_skipped(self) -> None:
        if self.explicit and self.skipped:
            text = "; ".join(f"'{name}': {why}" for name, why in self.skipped.items())
            warnings.warn(f"leapp.testing: export '{self.export}': route(s) skipped: {text}", RouteSkippedWarning,
                          stacklevel=3)


def _first_mismatch(error: BaseException) -> _Mismatch | None:
    if isinstance(error, _Mismatch):
        return error
    for inner in getattr(error, "exceptions", ()):  # an exception group: several bugs, or a flaky failure
        found = _first_mismatch(inner)
        if found is not None:
            return found
    return None


_HYPOTHESIS_DEFAULT_DEADLINE = timedelta(milliseconds=200)


def _settings(given: hypothesis.settings | None, max_examples: int | None) -> hypothesis.settings:
    """The active profile (or ``given``), with ``max_examples`` when given, and no deadline unless one was set.

    One example runs the eager code and every route, and a route's first call loads kernels or captures
    CUDA graphs, so hypothesis's default 200 ms deadline would fail healthy exports; a deadline the
    active profile (or ``given``) sets to anything else is kept.
    """
    base = given if given is not None else hypothesis.settings.default
    changes: dict[str, Any] = {}
    if max_examples is not None:
        changes["max_examples"] = max_examples
    if base.deadline == _HYPOTHESIS_DEFAULT_DEADLINE:
        changes["deadline"] = None
    return hypothesis.settings(base, **changes)


def assert_equivalent(
    fn: Callable[..., Any],
    export_dir: str | os.PathLike,
    inputs: SearchStrategy[dict[str, torch.Tensor]] | None = None,
    *,
    steps: int | None = None,
    reset: Callable[[], Any] | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    max_examples: int | None = None,
    routes: Sequence[str] | None = None,
    settings: hypothesis.settings | None = None,
    counterexample_dir: str | os.PathLike | None = None,
) -> EquivalenceResult:
    """Property: ``fn(**inputs)`` equals the export on every route that can run here, for drawn inputs.

    Args:
        fn: the eager code, called with the pipeline's inputs as keyword arguments; it returns the
            pipeline's outputs as a dict by name, a tuple in pipeline order, or one tensor.
        export_dir: the export folder (``pipeline.yaml`` and artifacts).
        inputs: a strategy of input dicts (one step's); default ``input_strategy(export_dir)``.
        steps: calls per example, each drawing its own inputs: default 4 (``DEFAULT_STATE_STEPS``) for an
            export with state, 1 without. Over 1, every example is a sequence run from reset state.
        reset: a callable with no arguments that restores the eager code's state to its first-call value;
            required for an export with state (the export itself is reset with ``Pipeline.reset()``).
        rtol, atol: ``torch.isclose`` tolerances (NaN must be at the same places; integers exact).
        max_examples: overrides the active hypothesis profile's ``max_examples``.
        routes: the routes to compare (default all, ``leapp.testing.ROUTES``); those that cannot run here
            are skipped (``RouteSkippedWarning`` when named here).
        settings: hypothesis settings to use instead of the active profile.
        counterexample_dir: where failing inputs are saved (default ``$LEAPP_COUNTEREXAMPLE_DIR`` or
            ``./.leapp-counterexamples``).

    Raises:
        AssertionError: a route differs: the route (and step), each differing output with max abs and max
            rel error, the shrunk counterexample and its file, the other routes, the first diverging node.
        NoRunnableRoute: no selected route can run here (a ``unittest.SkipTest``, so pytest skips).
        ValueError: an unknown route, or ``steps`` below 1.
        TypeError: an export with state and no ``reset``.
    """
    checker = _Checker(fn, export_dir, routes, rtol, atol, explicit=routes is not None, steps=steps, reset=reset)
    strategy = inputs if inputs is not None else input_strategy(checker.folder)
    if not isinstance(strategy, SearchStrategy):
        raise TypeError(f"inputs must be a hypothesis strategy of input dicts (leapp.testing.input_strategy(...)), "
                        f"got {type(strategy).__name__}")
    if checker.sequence:
        strategy = hypothesis.strategies.lists(strategy, min_size=checker.steps, max_size=checker.steps)
    else:
        strategy = strategy.map(lambda one: [one])
    key = f"{checker.export}|{checker.folder.resolve()}|{_fn_name(fn)}|{','.join(checker.ran)}"
    if checker.sequence:
        key += f"|{checker.steps} steps"

    def leapp_equivalence(example):
        checker.check(example)

    # hypothesis keys its example database by the test's source, identical for every call here; this
    # attribute (what its pytest plugin sets for parametrized tests) adds the export, fn and routes. Were it
    # ignored, exports would only share database entries, which hypothesis drops when they do not fit.
    leapp_equivalence._hypothesis_internal_add_digest = key.encode()

    test = hypothesis.settings(_settings(settings, max_examples))(hypothesis.given(example=strategy)(leapp_equivalence))
    try:
        test()
    except BaseException as error:  # anything but a mismatch is re-raised unchanged
        mismatch = _first_mismatch(error)
        if mismatch is None:
            raise
        found = cx.Counterexample(checker.export, mismatch.route, checker.selected, rtol, atol, mismatch.steps,
                                  sequence=checker.sequence)
        path = cx.save(found, cx.counterexample_dir(counterexample_dir))
        text = checker.report(mismatch, path)
        if error is not mismatch:  # a group: hypothesis saw several failures, or one that did not always reproduce
            text += (f"\nhypothesis raised {type(error).__name__} ({str(error).splitlines()[0] if str(error) else ''}); "
                     "the first mismatch is reported above")
        raise AssertionError(text) from None
    checker.warn_skipped()
    return checker.result()


def replay_counterexample(
    path: str | os.PathLike,
    fn: Callable[..., Any],
    export_dir: str | os.PathLike,
    *,
    reset: Callable[[], Any] | None = None,
    routes: Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    device: str | torch.device | None = None,
) -> EquivalenceResult:
    """Runs one saved counterexample again: raises the same ``AssertionError`` while it still fails.

    Defaults come from the file: the routes selected when it was found and the tolerances. ``device``
    moves the inputs (they are restored on the devices they were drawn on). A sequence (an export with
    state) is run again from reset state, so ``reset`` is required as for ``assert_equivalent``. Returns
    normally once the export and ``fn`` agree on it.
    """
    found = cx.load(path, device)
    checker = _Checker(fn, export_dir, routes if routes is not None else found.routes,
                       found.rtol if rtol is None else rtol, found.atol if atol is None else atol,
                       explicit=routes is not None, steps=len(found.steps), reset=reset, sequence=found.sequence)
    try:
        checker.check(found.steps)
    except _Mismatch as mismatch:
        raise AssertionError(checker.report(mismatch, Path(path))) from None
    checker.warn_skipped()
    return checker.result()

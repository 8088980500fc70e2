"""The reward weights of a dump that logs the trainer's total but not how it was summed (verl,
OpenRLHF).

The weights are recovered where the total IS a weighted sum of the logged components (least
squares with a constant term, zero residual within TOLERANCE on every row); what they do not
explain is the component `unexplained`, so weight x component always sums to the trainer's total
and an unchanged ablation reproduces its advantages. `note` says which case it was. The rules:
docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .base import (
    GroupingJsonlReader,
    Item,
    Progress,
    RecordError,
    jsonl_lines,
    parse_json_object,
)

UNEXPLAINED = "unexplained"
TOLERANCE = 1e-6  # per row, relative to max(1, |total|): JSON round trips and float32 totals
SAMPLE_ROWS = 20_000  # rows the weights are fitted on (read before the import starts)


def _fits(residual: np.ndarray, totals: np.ndarray) -> np.ndarray:
    return np.abs(residual) <= TOLERANCE * np.maximum(1.0, np.abs(totals))


@dataclass
class WeightPlan:
    """How each row's components are completed so that they sum to the trainer's total."""

    weights: dict[str, float]  # every logged component's weight, UNEXPLAINED: 1.0 when used
    residual: bool  # every row carries UNEXPLAINED (total minus the weighted components)
    note: str  # stored on the run: recovered / exact up to a constant / not a weighted sum / given

    def survey(self, objs: list[dict[str, Any]]) -> None:
        """A look at the sampled records before any is parsed (a reader decides what its total
        is from them)."""

    def complete(self, rewards: dict[str, float | None], total: float | None) -> None:
        """Add UNEXPLAINED to `rewards` (in place) where the plan needs it or the row is not
        explained by the weights: the weighted components then sum to `total`."""
        if total is None:
            if self.residual:
                rewards[UNEXPLAINED] = None
            return
        part = sum(v * self.weights.get(k, 0.0) for k, v in rewards.items() if v is not None)
        rest = total - part
        if self.residual:
            rewards[UNEXPLAINED] = rest
        elif abs(rest) > TOLERANCE * max(1.0, abs(total)):
            rewards[UNEXPLAINED] = rest  # beyond the sampled fit: the reader counts it


def plan_weights(
    rows: Iterable[tuple[dict[str, float | None], float | None]],
    given: dict[str, float] | None = None,
    *,
    total: str = "the total",
) -> WeightPlan | None:
    """The plan for a dump from a sample of its rows: (components, trainer's total) pairs. None
    when no row has both a total and a component (nothing to relate)."""
    sample = [(r, t) for r, t in rows if t is not None and math.isfinite(t) and r]
    names = list(dict.fromkeys(k for r, _ in sample for k in r if k != UNEXPLAINED))
    if not sample or not names:
        return None
    x = np.array([[_num(r.get(k)) for k in names] for r, _ in sample], dtype=np.float64)
    y = np.array([t for _, t in sample], dtype=np.float64)
    if given is not None:
        return _given(names, x, y, given, total)
    design = np.hstack([x, np.ones((len(y), 1))])
    if len(y) < design.shape[1] + 2:  # any weights fit so few rows: nothing can be told
        return WeightPlan(
            {**dict.fromkeys(names, 0.0), UNEXPLAINED: 1.0},
            True,
            f"unknown: {len(y)} rows are too few to tell how {total} relates to {len(names)} "
            f"components; the whole {total} is the component {UNEXPLAINED!r}",
        )
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    beta = np.array([_tidy(b) for b in beta])
    w, offset = beta[:-1], float(beta[-1])
    weights = dict(zip(names, w.tolist(), strict=True))
    parts = " + ".join(f"{v:g} x {k}" for k, v in weights.items())
    unique = np.linalg.matrix_rank(design) == design.shape[1]
    caveat = "" if unique else " (the components are not independent: other weights fit too)"
    if _fits(y - x @ w, y).all():
        return WeightPlan(
            weights,
            False,
            f"recovered: {total} = {parts} on all {len(y)} sampled rows{caveat}",
        )
    if _fits(y - design @ beta, y).all():
        return WeightPlan(
            {**weights, UNEXPLAINED: 1.0},
            True,
            f"recovered: {total} = {parts} + {offset:g} on all {len(y)} sampled rows{caveat}; "
            f"the constant {offset:g} is the component {UNEXPLAINED!r} (it changes no advantage)",
        )
    worst = float(np.abs(y - x @ w).max())
    return WeightPlan(
        {**weights, UNEXPLAINED: 1.0},
        True,
        f"unknown: {total} is not a weighted sum of the logged components (least squares "
        f"{parts}, off by up to {worst:.4g}); the rest of each row's {total} is the component "
        f"{UNEXPLAINED!r} (weight 1), so the components still sum to what the trainer used",
    )


def _given(
    names: list[str], x: np.ndarray, y: np.ndarray, given: dict[str, float], total: str
) -> WeightPlan:
    w = np.array([given.get(k, 0.0) for k in names])
    weights = {k: given.get(k, 0.0) for k in names}
    misfit = int((~_fits(y - x @ w, y)).sum())
    if not misfit:
        return WeightPlan(weights, False, f"given; {total} matches on all {len(y)} sampled rows")
    return WeightPlan(
        {**weights, UNEXPLAINED: 1.0},
        True,
        f"given, but {total} differs from their weighted sum on {misfit} of {len(y)} sampled "
        f"rows: the difference is the component {UNEXPLAINED!r} (weight 1)",
    )


def _num(v: Any) -> float:
    return 0.0 if v is None else float(v)  # TRL's nansum: a component that did not score adds 0


def _tidy(v: float) -> float:
    """0.19999999999999998 -> 0.2: a fitted weight as its author wrote it, when that is within
    rounding of the fit (checked again by the caller's residual test)."""
    r = round(float(v), 9)
    return 0.0 if r == 0 else r


@dataclass
class PlannedJsonlReader(GroupingJsonlReader):
    """A one-rollout-per-line reader whose rows carry the trainer's total (`total`) beside its
    components: the weights are planned from the first SAMPLE_ROWS rows before the import, become
    the run's (settings), the plan's note goes on the run (notes), and `parse_row` calls
    `complete` so that every row's components sum to its total."""

    total: ClassVar[str] = "the total"
    no_components: ClassVar[str] = "none: no numeric components beside the total"

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        self.weight_plan()  # before the first row: every row is completed the same way
        yield from super().read(progress)

    def settings(self) -> dict[str, Any] | None:
        plan = self.weight_plan()
        out = super().settings() or {}
        if plan is not None:
            out["weights"] = dict(plan.weights)
        return out or None

    def notes(self) -> dict[str, str]:
        self.weight_plan()
        return super().notes()

    def weight_plan(self) -> WeightPlan | None:
        """How the total relates to the components, from the first SAMPLE_ROWS rows (once)."""
        if not hasattr(self, "_plan"):
            self._plan: WeightPlan | None = None  # `complete` does nothing while sampling
            objs: list[dict[str, Any]] = []
            for path in self.files():
                for _, _, raw in jsonl_lines(path):
                    with contextlib.suppress(RecordError):  # reported when the import reads it
                        objs.append(parse_json_object(raw))
                    if len(objs) >= SAMPLE_ROWS:
                        break
                if len(objs) >= SAMPLE_ROWS:
                    break
            self.survey(objs)
            rows: list[tuple[dict[str, float | None], float | None]] = []
            for obj in objs:
                with contextlib.suppress(RecordError):
                    r = self.parse_row(obj).rollout
                    rows.append((r["rewards"], r["reward"]))
            self._plan = plan_weights(rows, self.weights, total=self.total)
            self.weights_note = self._plan.note if self._plan is not None else self.no_components
        return self._plan

    def survey(self, objs: list[dict[str, Any]]) -> None:
        """A look at the sampled records before any is parsed (a reader decides what its total
        is from them)."""

    def complete(self, rewards: dict[str, float | None], total: float | None) -> None:
        plan = getattr(self, "_plan", None)
        if plan is not None:
            plan.complete(rewards, total)

    def count_beyond(self, rollouts: list[dict[str, Any]]) -> None:
        """Rows the sampled plan did not explain (they carry UNEXPLAINED alone): counted."""
        if self._plan is not None and not self._plan.residual:
            self.flag("rows_beyond_weight_fit", sum(UNEXPLAINED in r["rewards"] for r in rollouts))

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        self.count_beyond(rollouts)
        super()._fill(rollouts)

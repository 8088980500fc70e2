"""A behaviour over a run, per step: its rate, its onset and whether the reward pays for it.

Plain numpy, no Django. A behaviour is a set of rollouts (webapp/behaviours matches a saved
explorer query); from each step's rollout count, the behaviour's count and both sides' advantage
sums this finds the onset (the diagnostics' hold rule), whether the reward teaches it (since the
onset its rollouts get a higher mean advantage than the rest) and whether it is fading. The
rules in full: docs/behaviours.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .diagnostics import Finding, Thresholds


@dataclass(frozen=True)
class BehaviourThresholds:
    min_rise: float = 0.05  # rate change (absolute: 5 points) that counts as a rise or a fall
    min_rollouts: int = 20  # each side of an onset holds at least this many rollouts
    min_gap: float = 0.05  # mean advantage gap (behaviour minus rest) that counts as "paid for"
    gap_z: float = 2.0  # ... and at least this many standard errors
    min_matches: int = 5  # a teaching verdict needs at least this many matches since the onset
    hold: Thresholds = field(default_factory=Thresholds)  # min_hold_steps / min_hold_frac


@dataclass
class BehaviourSeries:
    """Per step sums (arrays of one length, steps ascending). Advantage sums cover the rollouts
    with an advantage (n_adv_*); a rollout without one counts in n and k only."""

    steps: np.ndarray
    n: np.ndarray  # rollouts
    k: np.ndarray  # of them, showing the behaviour
    adv_in: np.ndarray  # sum of the advantages of the matches
    sq_in: np.ndarray  # sum of their squares
    n_in: np.ndarray  # matches with an advantage
    adv_out: np.ndarray  # the same for the rest
    sq_out: np.ndarray
    n_out: np.ndarray

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> BehaviourSeries:
        """rows: (step, n, k, adv_in, sq_in, n_in, adv_out, sq_out, n_out), any order."""
        rows = sorted(rows)
        cols = list(zip(*rows, strict=True)) if rows else [()] * 9
        ints = {0, 1, 2, 5, 8}
        arrays = [
            np.array(c, dtype=np.int64 if i in ints else np.float64) for i, c in enumerate(cols)
        ]
        return cls(*arrays)

    @property
    def rate(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, self.k / np.maximum(self.n, 1), np.nan)

    def mean_advantages(self) -> tuple[np.ndarray, np.ndarray]:
        """Per step: mean advantage of the matches and of the rest (NaN where a side is empty)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.where(self.n_in > 0, self.adv_in / np.maximum(self.n_in, 1), np.nan)
            b = np.where(self.n_out > 0, self.adv_out / np.maximum(self.n_out, 1), np.nan)
        return a, b

    def gap_since(self, i: int) -> tuple[float, float, int]:
        """(mean advantage gap, its standard error, matches) pooled over steps i.. (NaN: a side
        has fewer than two rollouts with an advantage)."""
        n1, n2 = int(self.n_in[i:].sum()), int(self.n_out[i:].sum())
        if n1 < 2 or n2 < 2:
            return math.nan, math.nan, n1
        m1, m2 = self.adv_in[i:].sum() / n1, self.adv_out[i:].sum() / n2
        v1 = max(self.sq_in[i:].sum() / n1 - m1 * m1, 0.0) * n1 / (n1 - 1)
        v2 = max(self.sq_out[i:].sum() / n2 - m2 * m2, 0.0) * n2 / (n2 - 1)
        return float(m1 - m2), math.sqrt(v1 / n1 + v2 / n2), n1


def hold_length(n_steps: int, t: Thresholds) -> int:
    """The diagnostics' hold length (training/diagnostics.py _hold) for a window of n_steps."""
    return max(1, min(n_steps, max(t.min_hold_steps, math.ceil(t.min_hold_frac * n_steps))))


def onset(series: BehaviourSeries, direction: int, t: BehaviourThresholds) -> int | None:
    """The index of the first step from which the rate stays above (direction +1) or below (-1) its
    early level by t.min_rise, or None. O(steps): suffix rates from prefix sums."""
    s = series.steps.size
    if s < 2:
        return None
    last = s - hold_length(s, t.hold)
    if last < 1:
        return None
    cn = np.concatenate([[0], np.cumsum(series.n)]).astype(np.float64)
    ck = np.concatenate([[0], np.cumsum(series.k)]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        after = (ck[-1] - ck[:-1]) / (cn[-1] - cn[:-1])  # rate of steps i..end, i = 0..s-1
        before = ck[1:] / cn[1:]  # rate of steps 0..i, i = 0..s-1
    worst = direction * after[: last + 1]
    worst = np.minimum.accumulate(np.nan_to_num(worst, nan=-np.inf)[::-1])[::-1]  # min over j >= i
    for i in range(1, last + 1):
        early = before[i - 1]
        enough = cn[i] >= t.min_rollouts and cn[-1] - cn[i] >= t.min_rollouts
        if enough and worst[i] - direction * early >= t.min_rise:
            return _refine(series, direction, t, i, last, early)
    return None


def _refine(
    series: BehaviourSeries, direction: int, t: BehaviourThresholds, i: int, last: int, early: float
) -> int:
    """Move the onset forward while its own step is not past the early level by half the rise and
    the steps after it still are past it (the suffix pooled)."""
    rate = series.rate
    k_tail, n_tail = series.k[::-1].cumsum()[::-1], series.n[::-1].cumsum()[::-1]
    while i < last:
        own = rate[i]
        if not math.isnan(own) and direction * (own - early) >= t.min_rise / 2:
            break
        nxt = k_tail[i + 1] / max(n_tail[i + 1], 1)
        if direction * (nxt - early) < t.min_rise:
            break
        i += 1
    return i


@dataclass
class BehaviourInfo:
    name: str
    critical: bool = False
    max_rate: float | None = None  # critical: a recent rate at or past this fails the gate


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def findings(
    b: BehaviourInfo, series: BehaviourSeries, t: BehaviourThresholds = BehaviourThresholds()
) -> list[Finding]:
    """The behaviour's findings over the series: taught (or merely rising), fading, and over its
    critical rate."""
    out: list[Finding] = []
    if series.steps.size == 0:
        return out
    up = onset(series, +1, t)
    if up is not None:
        out.append(_rising(b, series, up, t))
    down = onset(series, -1, t)
    if down is not None and (up is None or down > up):
        out.append(_fading(b, series, down))
    if b.critical and b.max_rate is not None:
        hold = hold_length(series.steps.size, t.hold)
        n, k = int(series.n[-hold:].sum()), int(series.k[-hold:].sum())
        recent = k / n if n else 0.0
        if n and recent >= b.max_rate:
            out.append(_critical(b, series, recent, hold, up))
    return out


def _evidence(series: BehaviourSeries, i: int) -> dict[str, Any]:
    cn, ck = series.n, series.k
    before = ck[:i].sum() / max(cn[:i].sum(), 1)
    after = ck[i:].sum() / max(cn[i:].sum(), 1)
    gap, se, matches = series.gap_since(i)
    return {
        "rate_before": float(before),
        "rate_since": float(after),
        "advantage_gap": gap,
        "advantage_gap_se": se,
        "matches_since": matches,
    }


def _rising(b: BehaviourInfo, s: BehaviourSeries, i: int, t: BehaviourThresholds) -> Finding:
    ev, step = _evidence(s, i), int(s.steps[i])
    gap, se = ev["advantage_gap"], ev["advantage_gap_se"]
    taught = (
        not math.isnan(gap)
        and gap >= t.min_gap
        and gap >= t.gap_z * se
        and ev["matches_since"] >= t.min_matches
    )
    rates = f"its rate rose from {_pct(ev['rate_before'])} to {_pct(ev['rate_since'])}"
    gap_text = "n/a" if math.isnan(gap) else f"{gap:+.2f} (± {se:.2f})"
    detail = (
        f"Since step {step}, {ev['matches_since']} rollouts show it; their mean advantage minus "
        f"the rest's: {gap_text}."
    )
    if taught:
        return Finding(
            code="behaviour_taught",
            severity="warning",
            title=f"The reward teaches '{b.name}' since step {step}: {rates}, and its rollouts "
            f"get a higher advantage than the rest ({gap:+.2f}).",
            detail=detail,
            fix="Read its rollouts: if it is a hack, change the component that pays for it (a "
            "reward replay shows the change on these transcripts before any retraining).",
            sort="advantage",
            evidence=ev,
            onset_step=step,
        )
    return Finding(
        code="behaviour_rising",
        severity="info",
        title=f"'{b.name}' is rising since step {step} ({rates}); the reward does not pay for it "
        "more than for the rest.",
        detail=detail,
        fix="Nothing to do unless it is unwanted: then penalise it, since no component does.",
        sort="advantage",
        evidence=ev,
        onset_step=step,
    )


def _fading(b: BehaviourInfo, s: BehaviourSeries, i: int) -> Finding:
    ev, step = _evidence(s, i), int(s.steps[i])
    return Finding(
        code="behaviour_fading",
        severity="info",
        title=f"'{b.name}' fading since step {step}: its rate fell from "
        f"{_pct(ev['rate_before'])} to {_pct(ev['rate_since'])}.",
        detail=f"{ev['matches_since']} rollouts show it since step {step}.",
        fix="If it is a hack the reward was changed to stop, this is the change working.",
        sort="advantage",
        evidence=ev,
        onset_step=step,
    )


def _critical(
    b: BehaviourInfo, s: BehaviourSeries, recent: float, hold: int, up: int | None
) -> Finding:
    first, last = int(s.steps[-hold]), int(s.steps[-1])
    return Finding(
        code="behaviour_critical",
        severity="critical",
        title=f"'{b.name}' (marked critical) is in {_pct(recent)} of the rollouts of steps "
        f"{first}-{last}, past its limit of {_pct(b.max_rate or 0)}.",
        detail=f"The last {hold} steps hold {int(s.n[-hold:].sum())} rollouts, "
        f"{int(s.k[-hold:].sum())} of which show it.",
        fix="Stop the run, or change the reward so that it stops paying for this behaviour.",
        sort="advantage",
        evidence={"recent_rate": recent, "max_rate": b.max_rate, "steps": hold},
        onset_step=int(s.steps[up]) if up is not None else first,
    )

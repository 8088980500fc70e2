"""Per-step aggregates for the run pages, read from StepStat: sufficient statistics per (run, step,
component) that the ingestion service increments with every batch, so a dashboard reads one row per
step and component whatever the number of rollouts (measured: the old GROUP BY over 125k groups and
500k component stats took ~350 ms at 1M rollouts).

Standard deviations are Bessel-corrected, as TRL's `nanstd` and our stored group stats are:

    N = n_values    S1 = sum_values    S2 = sum_squares
    mean = S1 / N   batch std = sqrt((S2 - S1^2 / N) / (N - 1))

The mean within-group std is sum_group_std / n_group_std; the zero-std fraction
n_zero_std / n_groups.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from webapp.rollouts.models import RewardComponent, StepStat
from webapp.runs.models import Run, StepMetric
from webapp.tokens import store as token_store

SPARK_POINTS = 60  # a sparkline wider than this carries no more information at 120 px


@dataclass
class Series:
    """Parallel lists, one entry per step (None where the step has no value)."""

    steps: list[int] = field(default_factory=list)
    mean: list[float | None] = field(default_factory=list)
    std: list[float | None] = field(default_factory=list)


@dataclass
class ComponentSeries:
    name: str
    steps: list[int] = field(default_factory=list)
    mean: list[float | None] = field(default_factory=list)
    batch_std: list[float | None] = field(
        default_factory=list
    )  # std over the step's rollouts (TRL's)
    within_std: list[float | None] = field(default_factory=list)  # mean of per-group stds (GRPO's)
    zero_std_frac: list[float | None] = field(default_factory=list)
    batch_std_source: str = "sql"  # "trainer" when StepMetric rewards/<name>/std replaced it


@dataclass
class DashboardData:
    reward: Series
    zero_std_steps: list[int]
    zero_std_frac: list[float | None]
    components: list[ComponentSeries]
    metrics: dict[str, tuple[list[int], list[float | None]]]  # other trainer metrics, by name
    n_groups: int
    n_rollouts: int
    # Per-step token statistics (webapp/tokens/store.py: "steps" and one list per statistic), None
    # when the run recorded no tokens
    tokens: dict[str, list] | None = None


def _pooled(
    n: float | None, s1: float | None, s2: float | None
) -> tuple[float | None, float | None]:
    """(mean, Bessel std) from the count, sum and sum of squares."""
    if not n or s1 is None or s2 is None or not (math.isfinite(s1) and math.isfinite(s2)):
        return None, None
    mean = s1 / n
    if n < 2:
        return mean, None
    var = (s2 - s1 * s1 / n) / (n - 1)
    return mean, math.sqrt(max(var, 0.0))  # cancellation can leave a tiny negative


def _step_rows(run: Run, since: int | None = None) -> dict[int, list[dict]]:
    """StepStat rows of the run (one per step and column, kept at ingest), by component id (0:
    reward); from step `since` on when given."""
    out: dict[int, list[dict]] = defaultdict(list)
    rows = StepStat.objects.filter(run=run)
    if since is not None:
        rows = rows.filter(step__gte=since)
    for r in rows.order_by("component_id", "step").values():
        out[r["component_id"]].append(r)
    return out


def _batch(r: dict) -> tuple[float | None, float | None]:
    return _pooled(r["n_values"], r["sum_values"], r["sum_squares"])


def reward_series(
    run: Run, rows: dict[int, list[dict]] | None = None
) -> tuple[Series, list[float | None], int, int]:
    """Aggregate reward mean/std per step, the fraction of zero-std groups, and totals."""
    rows = _step_rows(run) if rows is None else rows
    series, zero = Series(), []
    n_groups = n_rollouts = 0
    for r in rows.get(0, []):
        mean, std = _batch(r)
        series.steps.append(r["step"])
        series.mean.append(mean)
        series.std.append(std)
        zero.append(r["n_zero_std"] / r["n_groups"] if r["n_groups"] else None)
        n_groups += r["n_groups"]
        n_rollouts += r["n_rollouts"]
    return series, zero, n_groups, n_rollouts


def component_series(
    run: Run, components: list[RewardComponent], rows: dict[int, list[dict]] | None = None
) -> list[ComponentSeries]:
    """Per component and step: mean, batch std, mean within-group std, zero-std fraction."""
    rows = _step_rows(run) if rows is None else rows
    out = []
    for c in components:
        cs = ComponentSeries(name=c.name)
        for r in rows.get(c.id, []):
            if not r["n_groups"]:
                continue  # the component scored nothing at this step
            mean, std = _batch(r)
            cs.steps.append(r["step"])
            cs.mean.append(mean)
            cs.batch_std.append(std)
            within = r["sum_group_std"]
            cs.within_std.append(
                within / r["n_group_std"] if r["n_group_std"] and within is not None else None
            )
            cs.zero_std_frac.append(r["n_zero_std"] / r["n_groups"])
        out.append(cs)
    return out


def step_metrics(
    run: Run, since: int | None = None
) -> dict[str, tuple[list[int], list[float | None]]]:
    out: dict[str, tuple[list[int], list[float | None]]] = {}
    rows = StepMetric.objects.filter(run=run)
    if since is not None:
        rows = rows.filter(step__gte=since)
    for name, step, value in rows.order_by("name", "step").values_list("name", "step", "value"):
        steps, values = out.setdefault(name, ([], []))
        steps.append(step)
        values.append(value)
    return out


def dashboard_data(run: Run, since: int | None = None) -> DashboardData:
    """Every series of the dashboard; with `since`, only their points from that step on (a live page
    extending its charts; the totals then count those steps only)."""
    components = run.components()
    rows = _step_rows(run, since)
    reward, zero, n_groups, n_rollouts = reward_series(run, rows)
    comps = component_series(run, components, rows)
    metrics = step_metrics(run, since)
    for cs in comps:
        # TRL's own batch std wins when the trainer logged it: it is what the training curves show.
        logged = metrics.pop(f"rewards/{cs.name}/std", None)
        if logged:
            at = dict(zip(*logged, strict=True))
            cs.batch_std = [at.get(s, b) for s, b in zip(cs.steps, cs.batch_std, strict=True)]
            cs.batch_std_source = "trainer"
        metrics.pop(
            f"rewards/{cs.name}/mean", None
        )  # same number as our mean: charting it twice adds noise
    return DashboardData(
        reward=reward,
        zero_std_steps=reward.steps,
        zero_std_frac=zero,
        components=comps,
        metrics=metrics,
        n_groups=n_groups,
        n_rollouts=n_rollouts,
        tokens=token_store.token_series(run, since),
    )


@dataclass
class RunSummary:
    steps: int = 0
    rollouts: int = 0
    last_reward: float | None = None
    curve: list[float] = field(default_factory=list)  # reward mean per step, downsampled


def run_summaries(run_ids: list[int]) -> dict[int, RunSummary]:
    """Steps, rollouts, last reward mean and the reward curve of many runs in
    ONE query (StepStat)."""
    rows = (
        StepStat.objects.filter(run_id__in=run_ids, component_id=0)
        .values_list("run_id", "n_rollouts", "n_values", "sum_values")
        .order_by("run_id", "step")
    )
    curves: dict[int, list[float | None]] = defaultdict(list)
    out: dict[int, RunSummary] = {rid: RunSummary() for rid in run_ids}
    for run_id, n_rollouts, n_values, sum_values in rows:
        s = out[run_id]
        s.steps += 1
        s.rollouts += n_rollouts
        mean = sum_values / n_values if n_values and sum_values is not None else None
        curves[run_id].append(mean)
        if mean is not None:
            s.last_reward = mean
    for rid, curve in curves.items():
        points = [v for v in curve if v is not None]
        if len(points) > SPARK_POINTS:  # bucket means keep the shape of a long run
            size = len(points) / SPARK_POINTS
            points = [
                sum(chunk) / len(chunk)
                for i in range(SPARK_POINTS)
                if (chunk := points[int(i * size) : int((i + 1) * size)])
            ]
        out[rid].curve = points
    return out

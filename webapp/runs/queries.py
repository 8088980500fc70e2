"""Per-step aggregates for the run pages, computed in SQL (GROUP BY step), never by loading rollouts.

Standard deviations are Bessel-corrected, as TRL's `nanstd` and our stored group stats are. SQLite has
no STDDEV, and a single pass over raw values would be the slowest query on the page anyway, so batch
statistics are assembled from the per-group rows stored at ingest (law of total variance):

    N  = sum n_g                   S1 = sum n_g * m_g
    S2 = sum (n_g - 1) * s_g^2 + n_g * m_g^2       (= sum of x^2 over the step's values)
    mean = S1 / N                  batch std = sqrt((S2 - S1^2 / N) / (N - 1))

which equals the std over the step's individual values exactly, while reading G times fewer rows.
For a component the n_g are GroupComponentStat.count (non-null values only). For the aggregate reward
the n_g are Group.size: exact whenever each rollout has a reward (the rule: the aggregate is NULL only
when every component is unscorable); a group with some but not all rewards NULL is weighted by its
size, a small, documented approximation on a rare case.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Avg, Case, Count, F, FloatField, IntegerField, Q, Sum, Value, When
from django.db.models.functions import Coalesce

from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent
from webapp.runs.models import Run, StepMetric

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
    batch_std: list[float | None] = field(default_factory=list)  # std over the step's rollouts (TRL's)
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


def _pooled(n: float | None, s1: float | None, s2: float | None) -> tuple[float | None, float | None]:
    """(mean, Bessel std) from the count, sum and sum of squares."""
    if not n:
        return None, None
    mean = s1 / n
    if n < 2:
        return mean, None
    var = (s2 - s1 * s1 / n) / (n - 1)
    return mean, math.sqrt(max(var, 0.0))  # cancellation can leave a tiny negative


def _f(expr) -> Coalesce:
    return Coalesce(expr, Value(0.0), output_field=FloatField())


def reward_series(run: Run) -> tuple[Series, list[float | None], int, int]:
    """Aggregate reward mean/std per step, the fraction of zero-std groups, and totals."""
    scored = ~Q(all_unscorable=True) & Q(reward_mean__isnull=False)
    rows = (
        Group.objects.filter(run=run)
        .values("step")
        .annotate(
            n=Sum(Case(When(scored, then=F("size")), default=Value(0), output_field=IntegerField())),
            s1=Sum(Case(When(scored, then=F("size") * F("reward_mean")), default=Value(0.0),
                        output_field=FloatField())),
            s2=Sum(Case(When(scored, then=(F("size") - 1) * _f(F("reward_std")) * _f(F("reward_std"))
                             + F("size") * F("reward_mean") * F("reward_mean")),
                        default=Value(0.0), output_field=FloatField())),
            zero=Avg(Case(When(zero_std=True, then=Value(1.0)), default=Value(0.0), output_field=FloatField())),
            groups=Count("id"),
            rollouts=Sum("size"),
        )
        .order_by("step")
    )
    series, zero = Series(), []
    n_groups = n_rollouts = 0
    for r in rows:
        mean, std = _pooled(r["n"], r["s1"], r["s2"])
        series.steps.append(r["step"])
        series.mean.append(mean)
        series.std.append(std)
        zero.append(r["zero"])
        n_groups += r["groups"]
        n_rollouts += r["rollouts"] or 0
    return series, zero, n_groups, n_rollouts


def component_series(run: Run, components: list[RewardComponent]) -> list[ComponentSeries]:
    """Per component and step: mean, batch std, mean within-group std, zero-std fraction."""
    rows = (
        GroupComponentStat.objects.filter(run=run)
        .values("component_id", "step")
        .annotate(
            n=Sum("count"),
            s1=Sum(F("count") * _f(F("mean")), output_field=FloatField()),
            s2=Sum((F("count") - 1) * _f(F("std")) * _f(F("std")) + F("count") * _f(F("mean")) * _f(F("mean")),
                   output_field=FloatField()),
            within=Avg("std"),
            zero=Avg(Case(When(zero_std=True, then=Value(1.0)), default=Value(0.0), output_field=FloatField())),
        )
        .order_by("component_id", "step")
    )
    by_id = {c.id: ComponentSeries(name=c.name) for c in components}
    for r in rows:
        cs = by_id.get(r["component_id"])
        if cs is None:
            continue
        mean, std = _pooled(r["n"], r["s1"], r["s2"])
        cs.steps.append(r["step"])
        cs.mean.append(mean)
        cs.batch_std.append(std)
        cs.within_std.append(r["within"])
        cs.zero_std_frac.append(r["zero"])
    return [by_id[c.id] for c in components]


def step_metrics(run: Run) -> dict[str, tuple[list[int], list[float | None]]]:
    out: dict[str, tuple[list[int], list[float | None]]] = {}
    for name, step, value in StepMetric.objects.filter(run=run).order_by("name", "step").values_list(
        "name", "step", "value"
    ):
        steps, values = out.setdefault(name, ([], []))
        steps.append(step)
        values.append(value)
    return out


def dashboard_data(run: Run) -> DashboardData:
    components = list(RewardComponent.objects.filter(environment_id=run.environment_id).order_by("position", "id"))
    reward, zero, n_groups, n_rollouts = reward_series(run)
    comps = component_series(run, components)
    metrics = step_metrics(run)
    for cs in comps:
        # TRL's own batch std wins when the trainer logged it: it is what the training curves show.
        logged = metrics.pop(f"rewards/{cs.name}/std", None)
        if logged:
            at = dict(zip(*logged))
            cs.batch_std = [at.get(s, b) for s, b in zip(cs.steps, cs.batch_std)]
            cs.batch_std_source = "trainer"
        metrics.pop(f"rewards/{cs.name}/mean", None)  # same number as our mean: charting it twice adds noise
    return DashboardData(reward=reward, zero_std_steps=reward.steps, zero_std_frac=zero, components=comps,
                         metrics=metrics, n_groups=n_groups, n_rollouts=n_rollouts)


@dataclass
class RunSummary:
    steps: int = 0
    rollouts: int = 0
    last_reward: float | None = None
    curve: list[float] = field(default_factory=list)  # reward mean per step, downsampled


def run_summaries(run_ids: list[int]) -> dict[int, RunSummary]:
    """Steps, rollouts, last reward mean and the reward curve of many runs in ONE query."""
    rows = (
        Group.objects.filter(run_id__in=run_ids)
        .values("run_id", "step")
        .annotate(
            n=Sum(Case(When(reward_mean__isnull=False, then=F("size")), default=Value(0),
                       output_field=IntegerField())),
            s1=Sum(Case(When(reward_mean__isnull=False, then=F("size") * F("reward_mean")), default=Value(0.0),
                        output_field=FloatField())),
            rollouts=Sum("size"),
        )
        .order_by("run_id", "step")
    )
    curves: dict[int, list[float | None]] = defaultdict(list)
    out: dict[int, RunSummary] = {rid: RunSummary() for rid in run_ids}
    for r in rows:
        s = out[r["run_id"]]
        s.steps += 1
        s.rollouts += r["rollouts"] or 0
        mean = r["s1"] / r["n"] if r["n"] else None
        curves[r["run_id"]].append(mean)
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


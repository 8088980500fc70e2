"""The diagnostics and ablations of a run, over its arrays (read by webapp/rollouts/arrays.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.core.cache import cache
from django.db.models import Count, Max, Q, Sum

from training import ablation as abl
from training import diagnostics as dg
from training import stats
from webapp.annotations import services as annotations
from webapp.errors import FieldError
from webapp.rollouts.arrays import load_run_arrays
from webapp.rollouts.models import Group, RewardComponent, StepStat
from webapp.runs import launch, queries
from webapp.runs.models import Run, StepMetric
from webapp.tokens.findings import token_findings, with_token_findings

log = logging.getLogger(__name__)

# One window for the dashboard's slot, the diagnostics page, the API and the CLI: the last
# DEFAULT_WINDOW steps, shortened to at most MAX_WINDOW_ROLLOUTS rollouts. (The slot once read the
# last 20 steps and the page the last 50: the same finding said "since step 10" on one and "step 0"
# on the other.) Detectors speak about "now", and the window bounds the cost at any run size.
DEFAULT_WINDOW = 50  # steps
MAX_WINDOW_ROLLOUTS = 100_000  # a window never reads more than this many rollouts
# A finding that holds at the window's first step is dated from the steps before it: up to this many
# rollouts (window included) are read for that, and only then.
LOOKBACK_MAX_ROLLOUTS = 2 * MAX_WINDOW_ROLLOUTS
CACHE_SECONDS = (
    120  # annotations (the quality detector) may change without the rollout count changing
)
SLOT_SECONDS = 60  # the slot may lag a live run by this much instead of recomputing on every poll
SCALES, AGGREGATIONS = (
    stats.SCALES,
    stats.AGGREGATIONS,
)  # the ablation form offers the trainer's choices

# ------------------------------------------------------------------------------------------ reader


def component_infos(run: Run, comps: list[RewardComponent]) -> list[dg.ComponentInfo]:
    weights = run.reward_weights(comps)
    return [
        dg.ComponentInfo(c.name, weights[c.name], c.kind, c.min_value, c.max_value) for c in comps
    ]


def window_start(run: Run, window: int | None, max_rollouts: int | None = None) -> int | None:
    """The first step of the last `window` steps that have groups (None: from the start), shortened
    so that the window holds at most `max_rollouts` rollouts (never fewer than one step)."""
    if window is None and max_rollouts is None:
        return None
    per_step = (
        StepStat.objects.filter(run=run, component_id=0)  # the aggregate's row: every rollout
        .order_by("-step")
        .values_list("step", "n_rollouts")
    )
    if window is not None:
        per_step = per_step[:window]
    first, total, rows = None, 0, list(per_step)
    for step, n in rows:
        if first is not None and max_rollouts is not None and total + (n or 0) > max_rollouts:
            return first
        first, total = step, total + (n or 0)
    return first if window is not None and len(rows) == window else None


# -------------------------------------------------------------------------------------- diagnostics


def run_settings(run: Run) -> abl.Baseline:
    settings = run.advantage_settings()  # the trainer's own, recorded on the run
    return abl.Baseline(
        scale_rewards=settings["scale_rewards"],
        aggregation=settings["aggregation"],
        eps=settings["advantage_epsilon"],
    )


def _fingerprint(run: Run, *parts: Any) -> str:
    """Changes whenever the run gains groups or its weights/settings change: the cache key. Read
    per request, so bounded by the run's steps, not its groups (a count of a 10M-rollout run's
    groups cost ~0.1-0.3 s): the per-step statistics ingestion adds every batch to, and the last
    group by (run, step, id) (one index descent; catches groups written without statistics)."""
    g = StepStat.objects.filter(run=run, component_id=0).aggregate(
        n=Count("id"), groups=Sum("n_groups"), rollouts=Sum("n_rollouts")
    )
    g["last"] = list(
        Group.objects.filter(run=run).order_by("-step", "-id").values_list("step", "id")[:1]
    )
    m = StepMetric.objects.filter(run=run).aggregate(n=Count("id"), last=Max("step"))
    # created_at: the cache is shared and outlives a database (a reset, a test session):
    # run ids repeat.
    raw = json.dumps(
        [run.id, run.created_at, g, m, run.config or {}, run.reward_settings or {}, *parts],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha1(raw.encode()).hexdigest()


def _metrics(run: Run) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    keys = Q()
    for key in dg.UNSTABLE_KEYS:
        keys |= (
            Q(name=key)
            | Q(name__startswith=f"{key}/")
            | Q(name=f"train/{key}")
            | Q(name__startswith=f"train/{key}/")
        )
    rows = (
        StepMetric.objects.filter(run=run)
        .filter(keys)
        .order_by("name", "step")
        .values_list("name", "step", "value")
    )
    out: dict[str, tuple[list[int], list[float]]] = {}
    for name, step, value in rows:
        s, v = out.setdefault(name, ([], []))
        s.append(step)
        v.append(math.nan if value is None else value)
    return {k: (np.array(s), np.array(v, dtype=np.float64)) for k, (s, v) in out.items()}


def diagnose_run(
    run: Run, window: int | None = DEFAULT_WINDOW, max_rollouts: int | None = MAX_WINDOW_ROLLOUTS
) -> dict[str, Any]:
    """The diagnosis of the run's last `window` steps (None: all) as JSON, cached until
    the run changes."""
    key = f"diag:{_fingerprint(run, window, max_rollouts)}"
    hit = cache.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    start = window_start(run, window, max_rollouts)
    data = load_run_arrays(run, step_min=start)
    t1 = time.perf_counter()
    args = {
        "aggregation": run_settings(run).aggregation,
        "metrics": _metrics(run),
        "bad_case_ids": lambda: annotations.bad_case_rollout_ids(run),
        "annotated_ids": lambda: annotations.annotated_rollout_ids(run),
    }
    d = dg.diagnose(data, **args)
    read_from = d.health.step_min
    if start is not None and any(f.onset_step == d.health.step_min for f in d.findings):
        # Something already holds at the window's first step: read the steps before it to date it.
        earlier = window_start(run, None, LOOKBACK_MAX_ROLLOUTS)
        longer = load_run_arrays(run, step_min=earlier)
        d = dg.diagnose(longer, window_from=start, history_complete=earlier is None, **args)
        read_from = int(longer.steps.min()) if longer.n else read_from
    out = with_token_findings(d.as_dict(), token_findings(run, start))
    out["window"] = window
    out["read_from"] = read_from  # the first step read (before the window when dating an onset)
    out["timing"] = {"read_s": round(t1 - t0, 4), "compute_s": round(time.perf_counter() - t1, 4)}
    cache.set(key, out, CACHE_SECONDS)
    return out


def slot_summary(run: Run) -> dict[str, Any]:
    """What the run dashboard shows: a health verdict, each component's share of the advantage and
    its zero-std fraction, and the top findings. Cached per run for SLOT_SECONDS (a live run's
    dashboard polls; the slot may lag instead of recomputing each time)."""
    from webapp.diagnostics.links import with_links

    key = f"diag-slot:{run.id}"
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        d = diagnose_run(run)  # the diagnostics page's window: the two pages agree
    except (
        Exception
    ):  # the dashboard must render even if a diagnosis fails; the full page shows the error
        log.exception("diagnostics summary failed for run %s", run.id)
        return {"error": "The diagnosis failed; open the diagnostics page for details."}
    h = d["health"]
    findings = with_links(run.id, d["findings"])
    severities = {f["severity"] for f in findings}
    worst = "critical" if "critical" in severities else "warning" if severities else "healthy"
    out = {
        "status": d.get("status")
        or worst,  # "not_enough_data": too few groups to judge (first steps, bad input)
        "note": d.get("note"),
        "n_rollouts": h["n_rollouts"],
        "n_groups": h["n_groups"],
        "window": d.get("window"),
        "step_min": h["step_min"],
        "step_max": h["step_max"],
        "components": [
            {
                k: c[k]
                for k in ("name", "kind", "weight", "share", "zero_std_frac", "at_max", "at_min")
            }
            for c in h["components"]
        ],
        "reward_zero_std_frac": h["reward_zero_std_frac"],
        "findings": findings[:3],
        "n_findings": len(findings),
    }
    cache.set(key, out, SLOT_SECONDS)
    return out


def step_aggregates(run: Run) -> dict[str, Any]:
    """The run dashboard's per-step series (webapp/runs/queries.py, read from StepStat) on one step
    axis: each component's mean, mean within-group std and zero-std fraction, and the aggregate
    reward's mean and zero-std fraction. None where a component scored nothing at a step."""
    reward, reward_zero, _, _ = queries.reward_series(run)
    steps = reward.steps
    at = {step: i for i, step in enumerate(steps)}
    series = {}
    for cs in queries.component_series(run, run.components()):
        out = {key: [None] * len(steps) for key in ("mean", "std", "zero_std_frac")}
        for k, step in enumerate(cs.steps):
            i = at[step]
            out["mean"][i], out["std"][i] = cs.mean[k], cs.within_std[k]
            out["zero_std_frac"][i] = cs.zero_std_frac[k]
        series[cs.name] = out
    return {
        "steps": steps,
        "components": series,
        "reward_mean": reward.mean,
        "reward_zero_std_frac": reward_zero,
    }


# ---------------------------------------------------------------------------------------- ablations


def parse_spec(raw: Any, run: Run, comps: list[RewardComponent] | None = None) -> abl.AblationSpec:
    """Validate an ablation spec (API JSON or the page's form, turned into the same dict). Raises
    FieldError naming the field."""
    comps = run.components() if comps is None else comps
    names = [c.name for c in comps]
    base = run_settings(run)
    if not isinstance(raw, dict):
        raise FieldError("spec", "must be an object with drop, weights, scale_rewards, aggregation")
    extra = set(raw) - {"drop", "weights", "scale_rewards", "aggregation"}
    if extra:
        raise FieldError(
            f"spec.{sorted(extra)[0]}",
            "unknown key; expected drop, weights, scale_rewards, aggregation",
        )
    # Absent or null means "as the run"; any other value must have the right type ({} is
    # not a default).
    drop = _parse_drop(raw, names)
    clean = _parse_weights(raw, names)
    scale = base.scale_rewards if raw.get("scale_rewards") is None else raw["scale_rewards"]
    if not isinstance(scale, str) or scale not in SCALES:
        raise FieldError("spec.scale_rewards", f"must be one of {', '.join(SCALES)}")
    agg = base.aggregation if raw.get("aggregation") is None else raw["aggregation"]
    if not isinstance(agg, str) or agg not in AGGREGATIONS:
        raise FieldError("spec.aggregation", f"must be one of {', '.join(AGGREGATIONS)}")
    return abl.AblationSpec(
        drop=tuple(dict.fromkeys(drop)), weights=clean, scale_rewards=scale, aggregation=agg
    )


def _parse_drop(raw: dict[str, Any], names: list[str]) -> list[str]:
    drop = [] if raw.get("drop") is None else raw["drop"]
    if not isinstance(drop, list) or not all(isinstance(d, str) for d in drop):
        raise FieldError("spec.drop", "must be a list of component names")
    for d in drop:
        if d not in names:
            raise FieldError(
                "spec.drop", f"unknown component {d[:80]!r} (this run has: {', '.join(names)})"
            )
    if names and len(set(drop)) == len(names):
        raise FieldError(
            "spec.drop", "cannot drop every component: nothing would be left to reward"
        )
    return drop


def _parse_weights(raw: dict[str, Any], names: list[str]) -> dict[str, float]:
    weights = {} if raw.get("weights") is None else raw["weights"]
    if not isinstance(weights, dict):
        raise FieldError("spec.weights", "must be an object of component name -> number")
    clean: dict[str, float] = {}
    for name, w in weights.items():
        if name not in names:
            raise FieldError(
                f"spec.weights.{str(name)[:80]}",
                f"unknown component (this run has: {', '.join(names)})",
            )
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise FieldError(f"spec.weights.{name}", "must be a finite number")
        clean[name] = float(w)
    return clean


def run_ablation(
    run: Run, spec: abl.AblationSpec, data: dg.RunArrays | None = None
) -> dict[str, Any]:
    """Recompute every group's advantages under `spec` over the stored rollouts, end to end
    (read + math)."""
    t0 = time.perf_counter()
    data = load_run_arrays(run) if data is None else data
    t1 = time.perf_counter()
    out = abl.ablate(data, spec, run_settings(run))
    out["spec"] = spec.as_dict()
    out["baseline"] = {
        "weights": {c.name: c.weight for c in data.components},
        **vars(run_settings(run)),
    }
    out["timing"] = {"read_s": round(t1 - t0, 4), "compute_s": round(time.perf_counter() - t1, 4)}
    return out


def default_name(spec: abl.AblationSpec, run: Run) -> str:
    base = run_settings(run)
    parts = [f"drop {', '.join(spec.drop)}"] if spec.drop else []
    parts += [f"{k}={v:g}" for k, v in spec.weights.items()]
    if spec.scale_rewards != base.scale_rewards:
        parts.append(f"scale={spec.scale_rewards}")
    if spec.aggregation != base.aggregation:
        parts.append(spec.aggregation)
    return ("; ".join(parts) or "baseline")[:200]


@dataclass
class Launch:
    twin: Run
    enqueued: bool
    message: str


def launch_twin(ablation: Any, user: Any) -> Launch:
    """A twin GRPO run with the ablation's reward, from the same start as the run (same config and
    base model), recorded as the run's child, queued (behind the run while it still trains)."""
    run: Run = ablation.run
    spec = abl.AblationSpec(
        drop=tuple(ablation.spec.get("drop", [])),
        weights=ablation.spec.get("weights", {}),
        scale_rewards=ablation.spec["scale_rewards"],
        aggregation=ablation.spec["aggregation"],
    )
    weights = {
        name: 0.0 if name in spec.drop else float(spec.weights.get(name, w))
        for name, w in run.reward_weights().items()
    }
    twin = launch.twin_of(
        run,
        name=f"{run.name} / ablation: {ablation.name}",
        owner=user,
        reward_weights=weights,
        ablation_of=run.id,
        ablation_id=ablation.id,
        dropped_components=list(spec.drop),
        scale_rewards=spec.scale_rewards,
        multi_objective_aggregation=spec.aggregation,
    )
    type(ablation).objects.filter(id=ablation.id).update(twin=twin)
    if twin.config.get("start_after_parent"):
        return Launch(twin, False, "The twin run starts when the original run finishes.")
    return Launch(twin, True, "The twin run is queued for a GPU worker.")


def overlay_series(runs: list[Run]) -> list[dict[str, Any]]:
    """Reward mean per step and per-component means per step for each run
    (from stored aggregates)."""
    out = []
    for run in runs:
        agg = step_aggregates(run)
        metric = dict(
            StepMetric.objects.filter(run=run, name="reward").values_list("step", "value")
        )
        out.append(
            {
                "run": run,
                "steps": agg["steps"],
                "reward_mean": agg["reward_mean"],
                "components": {n: s["mean"] for n, s in agg["components"].items()},
                "logged_reward": sorted(metric.items()),
            }
        )
    return out

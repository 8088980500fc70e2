"""Behaviours over runs: defining one (a checked explorer query), computing its per-step sums on a
run (only the steps that are new or grew since), and its findings for the diagnostics.

The rollouts a behaviour matches are the explorer's own (webapp/explorer/query.py
matching_rollouts: the per-run word index on Postgres, trigram or plain text elsewhere), filtered
by the optional pattern (patterns.py). A step is computed whole, in two aggregate queries (the
step's rollouts, its matches) or, with a pattern, by reading the candidates' text; a run is brought
up to date step by step, so a live run pays for its new steps only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from django.db import transaction
from django.db.models import Count, F, QuerySet, Sum
from django.urls import reverse

from training import behaviours as tb
from webapp.behaviours.models import PAGE_PARAMS, Behaviour, BehaviourStep
from webapp.behaviours.patterns import Checker, PatternTimeout, compile_pattern
from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import matching_rollouts
from webapp.rollouts.models import Environment, RewardComponent, Rollout, StepStat
from webapp.runs.models import Run

log = logging.getLogger(__name__)

QUERY_KEYS_MAX = 40
ANNOTATION_PARAMS = {"label", "annotated"}  # filters whose matches change after ingestion
PATTERN_BATCH = 500  # candidates whose text is read at once for the pattern check


class BehaviourError(Exception):
    """A behaviour cannot be computed (its pattern times out): shown on its pages, never a 500."""


# ----------------------------------------------------------------------------------- definition


def clean_query(params: Any, components: list[RewardComponent]) -> dict[str, str]:
    """The explorer parameters that describe which rollouts (not the page: PAGE_PARAMS dropped),
    checked by the explorer's own parser: a FieldError naming the parameter (query.<name>)."""
    if not isinstance(params, dict) or len(params) > QUERY_KEYS_MAX:
        raise FieldError("query", "must be an object of explorer parameters (q, min_<component>…)")
    out = {
        str(k): str(v)
        for k, v in params.items()
        if k not in PAGE_PARAMS and v not in (None, "") and isinstance(v, (str, int, float))
    }
    try:
        q = ExplorerQuery.from_params(out, [c.name for c in components])
    except FieldError as e:
        raise FieldError(f"query.{e.field}", e.message) from None
    known = set(q.params())
    unknown = sorted(set(out) - known)
    if unknown:
        raise FieldError(f"query.{unknown[0]}", "is not an explorer filter")
    if not out:
        raise FieldError("query", "is empty: a behaviour needs a search or a filter to describe")
    return out


def define(
    environment: Environment,
    *,
    name: str,
    query: Any,
    pattern: str = "",
    description: str = "",
    critical: bool = False,
    max_rate: float | None = None,
    user: Any = None,
) -> Behaviour:
    """A new behaviour of the environment, checked (FieldError naming the field)."""
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise FieldError("name", "is required (at most 200 characters)")
    if Behaviour.objects.filter(environment=environment, name=name).exists():
        raise FieldError("name", f"the environment already has a behaviour named {name!r}")
    comps = list(RewardComponent.objects.filter(environment=environment))
    query = clean_query(query, comps)
    compile_pattern(pattern or "")
    if max_rate is not None and not 0.0 <= max_rate <= 1.0:
        raise FieldError("max_rate", "must be a fraction from 0 to 1")
    if critical and max_rate is None:
        raise FieldError("max_rate", "is required for a critical behaviour (the gate's limit)")
    return Behaviour.objects.create(
        environment=environment,
        name=name,
        query=query,
        pattern=pattern or "",
        description=description or "",
        critical=critical,
        max_rate=max_rate,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )


def explorer_query(b: Behaviour, components: list[RewardComponent]) -> ExplorerQuery:
    """The behaviour's query for a run with these components; FieldError naming a saved filter the
    explorer would now ignore (a component renamed or removed): never a silently wider query."""
    q = ExplorerQuery.from_params(b.query, [c.name for c in components])
    unknown = sorted(set(b.query) - set(q.params()))
    if unknown:
        raise FieldError(
            unknown[0], "is not a filter of this run (a component renamed or removed?)"
        )
    return q


# ---------------------------------------------------------------------------------- computation


def _sums(qs: QuerySet) -> dict[int, tuple[int, float, float, int]]:
    """{step: (rollouts, sum of advantages, sum of squares, rollouts with an advantage)}."""
    rows = (
        qs.order_by()
        .values("step")
        .annotate(
            n=Count("id"),
            a=Sum("advantage"),
            sq=Sum(F("advantage") * F("advantage")),
            na=Count("advantage"),
        )
    )
    return {r["step"]: (r["n"], r["a"] or 0.0, r["sq"] or 0.0, r["na"]) for r in rows}


def _pattern_sums(
    parts: list[QuerySet], checker: Checker
) -> dict[int, tuple[int, float, float, int]]:
    """The candidates' sums, keeping those whose text the pattern matches."""
    out: dict[int, list[float]] = {}
    for part in parts:
        ids = list(part.order_by().values_list("id", flat=True))
        for i in range(0, len(ids), PATTERN_BATCH):
            rows = Rollout.objects.filter(id__in=ids[i : i + PATTERN_BATCH]).values_list(
                "step", "advantage", "search_text"
            )
            for step, adv, doc in rows:
                if not checker(doc or ""):
                    continue
                acc = out.setdefault(step, [0, 0.0, 0.0, 0])
                acc[0] += 1
                if adv is not None:
                    acc[1], acc[2], acc[3] = acc[1] + adv, acc[2] + adv * adv, acc[3] + 1
    return {s: (int(a[0]), a[1], a[2], int(a[3])) for s, a in out.items()}


def _step_filter(qs: QuerySet, steps: list[int] | None) -> QuerySet:
    if steps is None:
        return qs
    lo, hi = min(steps), max(steps)
    qs = qs.filter(step__gte=lo, step__lte=hi)
    return qs if hi - lo + 1 == len(steps) else qs.filter(step__in=steps)


def compute(b: Behaviour, run: Run, steps: list[int] | None = None) -> int:
    """Compute and store the behaviour's sums on `steps` of the run (None: every step); returns
    the steps written. BehaviourError when its pattern times out on too many rollouts."""
    comps = run.components()
    try:
        q = explorer_query(b, comps)
    except FieldError as e:  # e.g. a component the query filters on was removed since
        raise BehaviourError(f"its query no longer applies: {e.field}: {e.message}") from None
    totals = _sums(_step_filter(Rollout.objects.filter(run=run), steps))
    parts = [_step_filter(p, steps) for p in matching_rollouts(run, q, comps)]
    pattern = compile_pattern(b.pattern)
    checker = Checker(pattern) if pattern is not None else None
    if checker is None:
        matched: dict[int, tuple[int, float, float, int]] = {}
        for part in parts:
            for step, v in _sums(part).items():
                old = matched.get(step, (0, 0.0, 0.0, 0))
                matched[step] = tuple(x + y for x, y in zip(old, v, strict=True))  # type: ignore
    else:
        try:
            matched = _pattern_sums(parts, checker)
        except PatternTimeout as e:
            raise BehaviourError(str(e)) from None
    rows = [
        _step_row(b, run, step, total, matched.get(step, (0, 0.0, 0.0, 0)), checker)
        for step, total in totals.items()
    ]
    with transaction.atomic():
        BehaviourStep.objects.filter(behaviour=b, run=run).filter(
            **({} if steps is None else {"step__in": steps})
        ).delete()
        BehaviourStep.objects.bulk_create(rows, batch_size=1000)
    return len(rows)


def _step_row(
    b: Behaviour,
    run: Run,
    step: int,
    total: tuple[int, float, float, int],
    hit: tuple[int, float, float, int],
    checker: Checker | None,
) -> BehaviourStep:
    return BehaviourStep(
        behaviour=b,
        run=run,
        step=step,
        version=b.version,
        n_rollouts=total[0],
        n_matches=hit[0],
        adv_in=hit[1],
        sq_in=hit[2],
        n_adv_in=hit[3],
        adv_out=total[1] - hit[1],
        sq_out=total[2] - hit[2],
        n_adv_out=total[3] - hit[3],
        regex_timeouts=checker.timeouts if checker else 0,
    )


def stale_steps(b: Behaviour, run: Run) -> list[int]:
    """Steps whose rollouts changed since they were computed (new steps, steps that grew, another
    version of the behaviour), from the per-step counts ingestion keeps (StepStat). A behaviour
    filtered by annotations is stale everywhere: labels change after ingestion."""
    now = dict(StepStat.objects.filter(run=run, component_id=0).values_list("step", "n_rollouts"))
    stored = dict(
        BehaviourStep.objects.filter(behaviour=b, run=run, version=b.version).values_list(
            "step", "n_rollouts"
        )
    )
    if ANNOTATION_PARAMS & set(b.query):  # annotations change without the rollouts changing
        return sorted(now)
    return sorted(s for s, n in now.items() if stored.get(s) != n)


def update(b: Behaviour, run: Run) -> int:
    """Bring the behaviour's steps on the run up to date; returns the steps computed. A run with
    many stale steps is computed in one pass (one query per side), a few new steps step by step's
    range."""
    stale = stale_steps(b, run)
    if not stale:
        return 0
    stored = BehaviourStep.objects.filter(behaviour=b, run=run, version=b.version).exists()
    return compute(b, run, None if not stored else stale)


def update_run(run: Run) -> dict[str, str]:
    """Every behaviour of the run's environment brought up to date on it: {name: outcome}."""
    out = {}
    for b in Behaviour.objects.filter(environment_id=run.environment_id):
        try:
            out[b.name] = f"{update(b, run)} steps"
        except BehaviourError as e:
            log.warning("behaviour %s on run %s: %s", b.id, run.id, e)
            out[b.name] = f"error: {e}"
    return out


UPDATE_TASK = "workers.tasks.update_behaviours"  # sent by name: webapp never imports workers
DEBOUNCE_S = 5  # a live run's batches within this long share one update task


def after_ingest(run: Run) -> None:
    """Queue the behaviours' update on the run's new steps once the batch commits (the default
    queue), at most one per DEBOUNCE_S per run; nothing when the environment has no behaviour.
    A dashboard read brings stale steps up to date itself, so a lost task costs only latency."""
    if not behaviours_of(run).exists():
        return
    from django.core.cache import cache

    from webapp.celery import app

    if cache.add(f"behaviours-queued:{run.id}", 1, DEBOUNCE_S):
        transaction.on_commit(
            # Runs a second after the key expires: a batch it skipped committed before it reads.
            lambda: app.send_task(
                UPDATE_TASK, args=[run.id], queue="default", countdown=DEBOUNCE_S + 1
            )
        )


def series(b: Behaviour, run: Run, refresh: bool = True) -> tb.BehaviourSeries:
    """The behaviour's per-step sums on the run (brought up to date first unless refresh=False)."""
    if refresh:
        update(b, run)
    rows = (
        BehaviourStep.objects.filter(behaviour=b, run=run, version=b.version)
        .order_by("step")
        .values_list(
            "step",
            "n_rollouts",
            "n_matches",
            "adv_in",
            "sq_in",
            "n_adv_in",
            "adv_out",
            "sq_out",
            "n_adv_out",
        )
    )
    return tb.BehaviourSeries.from_rows(list(rows))


def behaviours_of(run: Run) -> QuerySet:
    if run.environment_id is None:
        return Behaviour.objects.none()
    return Behaviour.objects.filter(environment_id=run.environment_id)


def run_findings(run: Run, step_min: int | None = None) -> list[dict[str, Any]]:
    """The findings of every behaviour of the run's environment (from step_min on: the diagnostics'
    window), as the diagnostics report's dicts; a behaviour that cannot be computed says so."""
    out = []
    for b in behaviours_of(run):
        try:
            s = series(b, run)
        except BehaviourError as e:
            out.append(_error_finding(b, str(e)))
            continue
        if step_min is not None:
            s = _window(s, step_min)
        info = tb.BehaviourInfo(b.name, b.critical, b.max_rate)
        for f in tb.findings(info, s):
            d = f.as_dict()
            d["behaviour"] = b.id
            d["link"] = explorer_link(b, run, step_min=f.onset_step)
            out.append(d)
    return out


def _window(s: tb.BehaviourSeries, step_min: int) -> tb.BehaviourSeries:
    keep = s.steps >= step_min
    return tb.BehaviourSeries(*(getattr(s, f)[keep] for f in s.__dataclass_fields__))


def _error_finding(b: Behaviour, message: str) -> dict[str, Any]:
    return {
        "code": "behaviour_error",
        "severity": "info",
        "title": f"Behaviour '{b.name}' cannot be computed: {message}",
        "detail": "Its pattern is checked with a time limit per rollout.",
        "fix": "Edit the behaviour's pattern.",
        "component": None,
        "sort": None,
        "order": "desc",
        "evidence": {},
        "onset_step": None,
        "behaviour": b.id,
        "link": "",
    }


def explorer_link(
    b: Behaviour, run: Run, step_min: int | None = None, step_max: int | None = None
) -> str:
    """The explorer showing the behaviour's query on the run (a pattern is not an explorer filter:
    the view shows its candidates)."""
    params = {**b.query, "sort": "advantage", "order": "desc"}
    if step_min is not None:
        params["step_min"] = str(step_min)
    if step_max is not None:
        params["step_max"] = str(step_max)
    return reverse("rollouts-explorer", kwargs={"run_id": run.id}) + "?" + urlencode(params)


def runs_of(b: Behaviour) -> QuerySet:
    return Run.objects.live().filter(environment_id=b.environment_id).order_by("id")


def overlay(b: Behaviour, runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Per run: its name, steps, rate and onset, for the across-runs chart."""
    out = []
    for run in runs:
        try:
            s = series(b, run)
        except BehaviourError as e:
            out.append({"run": run.id, "name": run.name, "error": str(e)})
            continue
        up = tb.onset(s, +1, tb.BehaviourThresholds())
        out.append(
            {
                "run": run.id,
                "name": run.name,
                "steps": s.steps.tolist(),
                "rate": [None if r != r else float(r) for r in s.rate],
                "onset_step": int(s.steps[up]) if up is not None else None,
                "matches": int(s.k.sum()),
                "rollouts": int(s.n.sum()),
            }
        )
    return out


NO_RUNS = (
    "environment {env} has no runs yet: the behaviour is computed on each run as it stores rollouts"
)


def preview(b: Behaviour, run: Run | None = None) -> dict[str, Any]:
    """How many rollouts the behaviour's query matches on `run` (default: the environment's newest
    run), with a warning when that is none or every one (before the pattern, which is checked when
    the behaviour is computed)."""
    run = run or runs_of(b).last()
    if run is None:
        return {
            "run": None,
            "matches": 0,
            "rollouts": 0,
            "warning": NO_RUNS.format(env=b.environment.name),
        }
    comps = run.components()
    parts = matching_rollouts(run, explorer_query(b, comps), comps)
    matches = sum(p.count() for p in parts)
    size = sum(
        StepStat.objects.filter(run=run, component_id=0).values_list("n_rollouts", flat=True)
    )
    warning = ""
    if size == 0:
        warning = f"run {run.id} has no rollouts yet"
    elif matches == 0:
        warning = f"the query matches no rollout of run {run.id} ({size} rollouts)"
    elif matches >= size:
        warning = (
            f"the query matches every rollout of run {run.id}: it describes nothing in particular"
        )
    return {"run": run.id, "matches": matches, "rollouts": size, "warning": warning}

"""What an eval or a teacher run found, as tables; and chains of runs (teacher -> SFT -> eval ->
GRPO -> eval) so the learning story reads in one place.

An eval's figures come from what ingestion stored (StepStat sums: mean and spread over every
held-out rollout; RewardScore: the share at each component's declared maximum), its environment
checks from the eval job's result (`summary["checks"]`, e.g. the diagram's "answers without
connections"). A chain is the runs linked by `parent`, plus a parentless eval of the chain's
starting model queued while the chain was (the demo's "eval before SFT").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Count, Q
from django.urls import reverse

from webapp.rollouts.models import RewardScore, Rollout, StepStat
from webapp.runs.models import Run
from webapp.runs.queries import _pooled

TRAINED = ("sft", "grpo", "dpo")  # kinds whose output is a model
RUN_PREFIX = "run:"
WORST = 5  # worst held-out rollouts listed on an eval's page
CHAIN_SPAN = timedelta(days=2)  # runs loaded around an eval to find its chain


@dataclass
class Stat:
    mean: float | None
    std: float | None
    n: int


def _totals(run_ids: list[int], last_step: bool = False) -> dict[int, dict[int, Stat]]:
    """run id -> column id (0: the aggregate reward) -> mean and Bessel std over every rollout of
    the run (or of its last step), from StepStat's sums: one query."""
    rows = list(
        StepStat.objects.filter(run_id__in=run_ids).values_list(
            "run_id", "step", "component_id", "n_values", "sum_values", "sum_squares"
        )
    )
    last: dict[int, int] = {}
    if last_step:
        for run_id, step, *_ in rows:
            last[run_id] = max(last.get(run_id, step), step)
    sums: dict[int, dict[int, list[float | None]]] = defaultdict(dict)
    for run_id, step, cid, n, s1, s2 in rows:
        if last_step and step != last[run_id]:
            continue
        acc = sums[run_id].setdefault(cid, [0, 0.0, 0.0])
        acc[0] += n or 0
        acc[1] = None if acc[1] is None or s1 is None else acc[1] + s1
        acc[2] = None if acc[2] is None or s2 is None else acc[2] + s2
    out: dict[int, dict[int, Stat]] = defaultdict(dict)
    for run_id, cols in sums.items():
        for cid, (n, s1, s2) in cols.items():
            mean, std = _pooled(n, s1, s2)
            out[run_id][cid] = Stat(mean, std, int(n))
    return out


def _pass_rates(run: Run, comps: list) -> dict[int, float | None]:
    """component id -> share of scored rollouts at the component's declared maximum (None when it
    declares none: "at the best seen" would pass anything on a flat run)."""
    declared = {c.id: c.max_value for c in comps if c.max_value is not None}
    aggregates = {}
    for cid, top in declared.items():
        tol = 1e-9 * max(1.0, abs(top))
        aggregates[f"n{cid}"] = Count("id", filter=Q(component_id=cid, value__isnull=False))
        aggregates[f"p{cid}"] = Count("id", filter=Q(component_id=cid, value__gte=top - tol))
    got = RewardScore.objects.filter(run=run).aggregate(**aggregates) if aggregates else {}
    return {
        c.id: (got[f"p{c.id}"] / got[f"n{c.id}"] if got.get(f"n{c.id}") else None)
        for c in comps
        if c.id in declared
    }


def evaluated_run_id(run: Run, by_id: dict[int, Run] | None = None) -> int | None:
    """The run whose model an eval measured: `run:<id>` as base model, else a parent that trains
    (looked up in `by_id` when given: no query per run on the runs list)."""
    base = run.base_model or ""
    if base.startswith(RUN_PREFIX) and base[len(RUN_PREFIX) :].isdigit():
        return int(base[len(RUN_PREFIX) :])
    if run.parent_id is None:
        return None
    parent = by_id.get(run.parent_id) if by_id is not None else run.parent
    return run.parent_id if parent is not None and parent.kind in TRAINED else None


# ------------------------------------------------------------------------------------------ chains


@dataclass
class Chain:
    runs: list[Run]  # in the order the story reads (model by model, each eval after its model)
    label: dict[int, str] = field(default_factory=dict)  # eval id -> what it measured

    @property
    def ids(self) -> set[int]:
        return {r.id for r in self.runs}

    def evals(self) -> list[Run]:
        return [r for r in self.runs if r.kind == Run.Kind.EVAL]

    def previous_eval(self, run: Run) -> Run | None:
        evals = self.evals()
        i = next((k for k, r in enumerate(evals) if r.id == run.id), None)
        return evals[i - 1] if i else None


def chains(runs: list[Run]) -> list[Chain]:
    """The runs grouped into chains (every run in exactly one; most chains of one run), each in
    story order. Pure: reads only the runs given (parent ids, kinds, base models, times)."""
    by_id = {r.id: r for r in runs}

    def root(r: Run) -> int:
        seen = set()
        while r.parent_id in by_id and r.id not in seen:
            seen.add(r.id)
            r = by_id[r.parent_id]
        return r.id

    groups: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        groups[root(r)].append(r)
    _attach_start_evals(groups)
    return [_ordered(members) for members in groups.values()]


def _attach_start_evals(groups: dict[int, list[Run]]) -> None:
    """A lone eval of a model that is not a run's output (`tiny:diagram`, a hub id) joins the chain
    whose training starts from that model, when it was queued while that chain was: the "before"
    of the story."""
    lone = [m[0] for m in groups.values() if len(m) == 1 and m[0].kind == Run.Kind.EVAL]
    for ev in lone:
        if not ev.base_model or ev.base_model.startswith(RUN_PREFIX) or ev.parent_id:
            continue
        home = next((m for m in groups.values() if _starts_from(m, ev)), None)
        if home is not None:
            home.append(ev)
            groups.pop(ev.id, None)


def _starts_from(members: list[Run], ev: Run) -> bool:
    """Whether a chain trains from the model `ev` evaluated and was being queued when `ev` was."""
    if len(members) < 2 or ev in members:
        return False
    times = [m.created_at for m in members]
    starts = any(
        m.kind in TRAINED
        and m.base_model == ev.base_model
        and m.environment_id == ev.environment_id
        for m in members
    )
    return starts and min(times) <= ev.created_at <= max(times)


def _ordered(members: list[Run]) -> Chain:
    by_id = {r.id: r for r in members}

    def depth(r: Run) -> int:
        d = 0
        while r.parent_id in by_id and d < 100:
            r, d = by_id[r.parent_id], d + 1
        return d

    position: dict[int, float] = {}
    label: dict[int, str] = {}
    for r in members:
        if r.kind != Run.Kind.EVAL:
            position[r.id] = depth(r)
            continue
        target = evaluated_run_id(r, by_id)
        if target in by_id:
            position[r.id] = depth(by_id[target]) + 0.5
            label[r.id] = f"after {by_id[target].kind.upper()}"
            continue
        first = [m for m in members if m.kind in TRAINED and m.base_model == r.base_model]
        position[r.id] = (min(depth(m) for m in first) - 0.5) if first else depth(r) + 0.5
        label[r.id] = f"before {first[0].kind.upper()}" if first else ""
    ordered = sorted(members, key=lambda r: (position[r.id], r.created_at, r.id))
    return Chain(ordered, label)


def chain_for(run: Run) -> Chain:
    """The chain an eval belongs to, read from the runs of its environment queued around it."""
    near = (
        Run.objects.live()
        .filter(
            environment_id=run.environment_id,
            created_at__gte=run.created_at - CHAIN_SPAN,
            created_at__lte=run.created_at + CHAIN_SPAN,
        )
        .order_by("-created_at")[:500]
    )
    runs = {r.id: r for r in near}
    runs[run.id] = run
    ancestor = run
    while ancestor.parent_id and ancestor.parent_id not in runs:  # a chain older than the span
        ancestor = ancestor.parent
        runs[ancestor.id] = ancestor
    return next(c for c in chains(list(runs.values())) if run.id in c.ids)


# ------------------------------------------------------------------------------------ eval results


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def eval_results(run: Run, chain: Chain | None = None) -> dict[str, Any]:
    """An eval run's results table: the held-out reward and each component (mean, spread over the
    rollouts, pass rate), the change against the run it evaluates (that run's last training step)
    and against the previous eval of its chain, the environment's checks, the worst rollouts."""
    comps = run.components()
    chain = chain or chain_for(run)
    previous = chain.previous_eval(run)
    target_id = evaluated_run_id(run)
    target = Run.objects.filter(id=target_id).first() if target_id else None
    ids = [run.id] + ([previous.id] if previous else [])
    totals = _totals(ids)
    trained = _totals([target.id], last_step=True).get(target.id, {}) if target else {}
    passes = _pass_rates(run, comps)
    prev_passes = _pass_rates(previous, comps) if previous else {}
    mine, before = totals.get(run.id, {}), totals.get(previous.id, {}) if previous else {}
    rows = []
    for cid, name, weight in [(0, "reward", None), *((c.id, c.name, c.weight) for c in comps)]:
        s = mine.get(cid) or Stat(None, None, 0)
        t, p = trained.get(cid), before.get(cid)
        rows.append(
            {
                "name": name,
                "weight": weight,
                "mean": s.mean,
                "std": s.std,
                "n": s.n,
                "pass_rate": passes.get(cid),
                "vs_trained": _delta(s.mean, t.mean if t else None),
                "trained": t.mean if t else None,
                "vs_previous": _delta(s.mean, p.mean if p else None),
                "pass_vs_previous": _delta(passes.get(cid), prev_passes.get(cid)),
            }
        )
    prev_checks = ((previous.summary or {}).get("checks") or {}) if previous else {}
    checks = [
        {
            "name": name,
            "share": c.get("share"),
            "count": c.get("count"),
            "n": c.get("n"),
            "previous": (prev_checks.get(name) or {}).get("share"),
        }
        for name, c in ((run.summary or {}).get("checks") or {}).items()
    ]
    return {
        "rows": rows,
        "checks": checks,
        "previous": previous,
        "target": target,
        "target_note": _target_note(run, target, trained),
        "chain": chain,
        "story": story(chain),
        "worst": _worst(run),
        "worst_url": reverse("rollouts-explorer", kwargs={"run_id": run.id})
        + "?sort=reward&order=asc",
    }


def _target_note(run: Run, target: Run | None, trained: dict[int, Stat]) -> str:
    if target is None:
        return f"evaluates {run.base_model or 'its base model'}, not a run's output"
    if not trained:
        return f"{target.kind.upper()} runs store no rollouts: no training figures to compare"
    return ""


def _worst(run: Run) -> list[dict[str, Any]]:
    rows = (
        Rollout.objects.filter(run=run, reward__isnull=False)
        .order_by("reward", "id")
        .values("id", "reward", "step", "preview_head")[:WORST]
    )
    return [
        {
            **r,
            "url": reverse("rollouts-transcript", kwargs={"rollout_id": r["id"]}),
            "preview": (r["preview_head"] or "")[:140],
        }
        for r in rows
    ]


def story(chain: Chain) -> dict[str, Any] | None:
    """The chain's learning story: each eval's held-out reward, and each environment check's share,
    in chain order ("answers without connections 58% -> 9%")."""
    evals = chain.evals()
    if len(evals) < 2:
        return None
    totals = _totals([e.id for e in evals])
    steps = [
        {
            "run": e,
            "label": chain.label.get(e.id, ""),
            "reward": (totals.get(e.id, {}).get(0) or Stat(None, None, 0)).mean,
        }
        for e in evals
    ]
    names: list[str] = []
    for e in evals:
        names += [n for n in ((e.summary or {}).get("checks") or {}) if n not in names]
    checks = [{"name": n, "shares": [_check_share(e, n) for e in evals]} for n in names]
    return {"evals": steps, "checks": checks, "kinds": [r.kind for r in chain.runs]}


def _check_share(run: Run, name: str) -> float | None:
    return (((run.summary or {}).get("checks") or {}).get(name) or {}).get("share")


def headline(run: Run, stat: Stat | None, previous: Stat | None) -> str:
    """The runs list's figure for an eval: held-out reward, and its change against the previous
    eval of its chain."""
    if stat is None or stat.mean is None:
        return ""
    text = f"held-out reward {stat.mean:.3f}"
    if previous is not None and previous.mean is not None and math.isfinite(previous.mean):
        text += f" ({stat.mean - previous.mean:+.3f})"
    return text


def list_headlines(chain_list: list[Chain]) -> dict[int, str]:
    """run id -> headline, for every eval (one query) and teacher run in the chains given."""
    evals = [r for c in chain_list for r in c.runs if r.kind == Run.Kind.EVAL]
    totals = _totals([e.id for e in evals]) if evals else {}
    out = {}
    for c in chain_list:
        for r in c.runs:
            if r.kind == Run.Kind.EVAL:
                prev = c.previous_eval(r)
                out[r.id] = headline(
                    r, totals.get(r.id, {}).get(0), totals.get(prev.id, {}).get(0) if prev else None
                )
            elif r.kind == Run.Kind.TEACHER and (r.summary or {}).get("kept") is not None:
                s = r.summary
                out[r.id] = f"kept {s['kept']} of {s['kept'] + s.get('rejected', 0)}"
    return out


def teacher_result(run: Run) -> dict[str, Any] | None:
    """How many trajectories a teacher run kept and why it dropped the rest (its job's result)."""
    s = run.summary or {}
    if "kept" not in s:
        return None
    total = s["kept"] + s.get("rejected", 0)
    return {
        "kept": s["kept"],
        "rejected": s.get("rejected", 0),
        "total": total,
        "keep_rate": s["kept"] / total if total else None,
        "by": list((s.get("rejected_by") or {}).items()),
        "recorded": "rejected_by" in s,
        "dataset": s.get("dataset", ""),
        "rejected_file": s.get("rejected_file", ""),
        "filter": {
            k: v for k, v in (run.config or {}).items() if k in ("min_reward", "min_scores")
        },
    }

"""Behaviours at scale: recomputing a behaviour over a run of realistic rollouts
(bench/realistic.py's data), one new step incrementally, the dashboard chart's read, and find
more like this from 20 labelled rollouts, each as a ratio to an in-run baseline (a plain
per-step aggregate).

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_behav_bench
    .venv/bin/python -m bench.behaviours --rollouts 50000

Targets and how figures scale to 1M: docs/performance.md, "Module notes".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import load_line, ratio, report, setup_django  # noqa: E402
from bench.harness import timed as _timed  # noqa: E402

TARGET = 1_000_000
# Words of the realistic vocabulary in ~1.4% and ~10% of rollouts (bench/realistic.py MIDDLE_WORDS).
WORDS = {"rare-ish (1.4%)": "rasakavi", "common (10%)": "dedekato"}
PATTERN = r"rasakavi\s+\w+"  # checked on the 1.4% word's candidates: their text is read


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median seconds, the last result) over `repeat` calls."""
    t = _timed(fn, repeat)
    return t.median, t.result


def baseline(run: Any) -> Callable[[], Any]:
    """The floor: the run's rollouts counted and their advantages summed per step."""
    from django.db.models import Count, Sum

    from webapp.rollouts.models import Rollout

    def read() -> list:
        qs = Rollout.objects.filter(run=run).order_by().values("step")
        return list(qs.annotate(n=Count("id"), a=Sum("advantage")))

    return read


def behaviour(run: Any, name: str, query: dict, pattern: str = "") -> Any:
    from webapp.behaviours import services
    from webapp.behaviours.models import Behaviour

    Behaviour.objects.filter(environment=run.environment, name=name).delete()
    return services.define(run.environment, name=name, query=query, pattern=pattern)


def line(label: str, seconds: float, base: float, size: int, scale: str) -> None:
    """A figure, its ratio to the baseline and its extrapolation to TARGET rollouts."""
    at_target = seconds * TARGET / size if scale == "linear" else seconds
    tail = "" if scale == "measured" else f"  ~{at_target * 1000:9.1f} ms at 1M ({scale})"
    report(f"{label:<48} {seconds * 1000:9.1f} ms  {ratio(seconds, base, 1):>7} baseline{tail}")


def recompute(run: Any, size: int, base: float, repeat: int) -> None:
    from webapp.behaviours import services

    for label, word in WORDS.items():
        b = behaviour(run, f"bench {word}", {"q": word})
        s, _ = timed(lambda b=b: services.compute(b, run), repeat)
        matches = sum(services.series(b, run, refresh=False).k)
        line(f"recompute, {label}: {matches:,} matches", s, base, size, "linear")
    b = behaviour(run, "bench pattern", {"q": WORDS["rare-ish (1.4%)"]}, PATTERN)
    s, _ = timed(lambda: services.compute(b, run), max(1, repeat // 2))
    line(f"recompute with a pattern {PATTERN!r}", s, base, size, "linear")


def incremental(run: Any, base: float, repeat: int) -> None:
    from webapp.behaviours import services
    from webapp.behaviours.models import BehaviourStep

    b = behaviour(run, "bench incremental", {"q": WORDS["common (10%)"]})
    services.compute(b, run)
    last = BehaviourStep.objects.filter(behaviour=b, run=run).order_by("-step").first()

    def one_step() -> int:
        # The last step grew (its rows are rewritten by each update: found by step, not id).
        BehaviourStep.objects.filter(behaviour=b, run=run, step=last.step).update(n_rollouts=-1)
        return services.update(b, run)

    s, n = timed(one_step, repeat)
    assert n == 1
    line("incremental: one new step", s, base, 1, "constant")


def chart_read(run: Any, base: float, repeat: int) -> None:
    from django.test import Client

    from webapp.behaviours import services
    from webapp.behaviours.models import Behaviour

    keep = Behaviour.objects.filter(environment=run.environment, name="bench incremental")
    Behaviour.objects.filter(environment=run.environment).exclude(id__in=keep).delete()
    for b in keep:
        services.update(b, run)
    user = _user()
    client = Client()
    client.force_login(user)
    url = f"/behaviours/runs/{run.id}/series.json"
    assert client.get(url).status_code == 200
    s, _ = timed(lambda: client.get(url), repeat)
    line("dashboard chart read (series.json, 1 behaviour)", s, base, 1, "constant")


def _user() -> Any:
    from django.contrib.auth import get_user_model

    from webapp.accounts.roles import set_role

    user, _ = get_user_model().objects.get_or_create(username="bench-behaviours")
    set_role(user, "viewer")
    return user


def find_like(run: Any, size: int, base: float, repeat: int) -> None:
    """Timed whole, and its proposals' measurement apart: the sample it reads is fixed whatever the
    run's size; counting each proposal's matches grows with them (linear is its bound)."""
    from webapp.behaviours import likeness
    from webapp.behaviours.models import Behaviour
    from webapp.explorer.params import ExplorerQuery
    from webapp.explorer.query import matching_rollouts

    comps = run.components()
    q = ExplorerQuery.from_params({"q": WORDS["rare-ish (1.4%)"]}, [c.name for c in comps])
    ids = [i for p in matching_rollouts(run, q, comps) for i in p.values_list("id", flat=True)[:20]]
    measured = [0.0]
    original = likeness.measure

    def measure(*args: Any) -> None:
        t = time.perf_counter()
        original(*args)
        measured[0] += time.perf_counter() - t

    likeness.measure = measure
    try:
        s, doc = timed(lambda: likeness.propose(run, ids[:20]), repeat)
    finally:
        likeness.measure = original
    per_call = measured[0] / repeat
    best = doc["proposals"][0] if doc["proposals"] else {}
    print(
        f"  best proposal {best.get('text')!r}: {best.get('matches')} matches, recall "
        f"{best.get('recall')}/{best.get('labelled')}"
    )
    line("find more like this, 20 labelled", s, base, 1, "measured")
    fixed, scaling = s - per_call, per_call * TARGET / size
    print(
        f"  of which measuring the {len(doc['proposals'])} proposals {per_call * 1000:.1f} ms: "
        f"~{(fixed + scaling) * 1000:.1f} ms at 1M (fixed part + measuring scaled linearly)"
    )
    Behaviour.objects.filter(environment=run.environment, name__startswith="bench").delete()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=50_000, help="realistic rollouts to seed")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seeders", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    setup_django()
    from bench.realistic import seed, vacuum
    from webapp.explorer.search.base import run_size as _run_size

    run, _ = seed("realistic", args.rollouts, args.seeders)
    vacuum()
    size = _run_size(run)
    base, _ = timed(baseline(run), args.repeat)
    report(
        f"run {run.id}: {size:,} realistic rollouts; "
        f"baseline per-step aggregate {base * 1000:.1f} ms"
    )
    recompute(run, size, base, args.repeat)
    incremental(run, base, args.repeat)
    chart_read(run, base, args.repeat)
    find_like(run, size, base, args.repeat)
    print(load_line())


if __name__ == "__main__":
    main()

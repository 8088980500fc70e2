"""The explorer sorted by a rollout column (reward, advantage, length) or a component, filtered to a
step range: the worst case for a walk of the sort index is a range whose rows sort last (the best
rewards of the first steps, when reward climbs over the run), so every later step's rows are
skipped first.

Two plans (PostgresSearch.range_first): a wide range walks the sort index, the skipped entries
checked inside it (INCLUDE step, migration 0011), never by a heap fetch each; a narrow one is read
from an index by step that carries the sort values, and its top sorted. The paging tests run both
plans (RANGE_SHARE 0: always walk; 1: always read the range) against Python's sort; the plan tests
check each plan's index on Postgres.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.explorer.search import postgres
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import RewardScore, Rollout

STEPS = 6
G = 4


def climbing_groups() -> list[dict]:
    """Rewards and lengths that climb with the step, with ties across and within groups."""
    groups = []
    for step in range(STEPS):
        for k in range(2):
            groups.append(
                {
                    "step": step,
                    "key": f"p{k}",
                    "prompt": f"prompt {k}",
                    "rollouts": [
                        {
                            "index": i,
                            "completion": f"answer {step} {k} {i}",
                            "length": 10 * step + (i % 2),
                            "rewards": {
                                "correct": float((step + i) % 3 == 0 or step >= 4),
                                "format": round(0.1 * step + 0.05 * (i % 2), 2),
                                "penalty": -0.1 * ((i + k) % 2),
                            },
                        }
                        for i in range(G)
                    ],
                }
            )
    return groups


def paged(run, **kw) -> list[int]:
    out, cursor = [], None
    while True:
        page = explore(run, ExplorerQuery(cursor=cursor, limit=3, **kw))
        out += [r.rollout.id for r in page.rows]
        cursor = page.next_cursor
        if not cursor:
            return out


@pytest.fixture
def climbed(run):
    ingest_groups(run, {"groups": climbing_groups()})
    return run


@pytest.fixture(params=["walk", "range"])
def climbing(request, climbed, monkeypatch):
    monkeypatch.setattr(postgres, "RANGE_SHARE", 0.0 if request.param == "walk" else 1.0)
    return climbed


RANGES = [(0, 0), (0, 1), (2, 4), (None, 1), (3, None), (5, 5)]


def test_it_pages_a_step_range_in_sort_order_for_every_rollout_column(climbing):
    run = climbing
    for field in ("reward", "advantage", "length"):
        for order in ("asc", "desc"):
            for lo, hi in RANGES:
                rows = Rollout.objects.filter(run=run)
                if lo is not None:
                    rows = rows.filter(step__gte=lo)
                if hi is not None:
                    rows = rows.filter(step__lte=hi)
                want = sorted(rows.values_list(field, "id"), reverse=order == "desc")
                assert want, (field, lo, hi)
                got = paged(run, sort=field, order=order, step_min=lo, step_max=hi)
                assert got == [i for _, i in want], (field, order, lo, hi)


def test_it_pages_a_step_range_in_sort_order_for_a_component(climbing):
    run = climbing
    for name in ("correct", "format"):
        for order in ("asc", "desc"):
            for lo, hi in RANGES:
                scores = RewardScore.objects.filter(run=run, component__name=name)
                if lo is not None:
                    scores = scores.filter(rollout__step__gte=lo)
                if hi is not None:
                    scores = scores.filter(rollout__step__lte=hi)
                want = sorted(scores.values_list("value", "rollout_id"), reverse=order == "desc")
                got = paged(run, sort=name, order=order, step_min=lo, step_max=hi)
                assert got == [i for _, i in want], (name, order, lo, hi)


def explorer_sql(run, **kw) -> str:
    """The SQL of the explorer's page query (the one that orders the rows)."""
    with CaptureQueriesContext(connection) as ctx:
        explore(run, ExplorerQuery(limit=3, **kw))
    return next(
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith("SELECT") and "ORDER BY" in q["sql"] and "IS NOT NULL" in q["sql"]
    )


def plan_of(sql: str, *drop: str) -> str:
    with connection.cursor() as cur:
        # On tables this small any plan is cheap; with the other access paths off (rolled back
        # with the test) the plan shows whether the intended index alone can answer the query.
        if drop:
            cur.execute("DROP INDEX " + ", ".join(drop))
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
        cur.execute("EXPLAIN " + sql)
        return "\n".join(r[0] for r in cur.fetchall())


SORT_INDEXES = [
    ("reward", "rollout_run_reward"),
    ("advantage", "rollout_run_adv"),
    ("length", "rollout_run_length"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("field,index", SORT_INDEXES)
def test_a_walk_checks_the_step_range_inside_the_sort_index(climbed, field, index, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    monkeypatch.setattr(postgres, "RANGE_SHARE", 0.0)
    sql = explorer_sql(climbed, sort=field, order="desc", step_min=0, step_max=1)
    plan = plan_of(sql, "rollout_run_step")
    assert f"Index Only Scan Backward using {index}" in plan, plan
    assert "step" in plan.split(index, 1)[1], plan  # the step range is a filter of that scan


@pytest.mark.postgres
@pytest.mark.parametrize("sort", ["reward", "advantage", "length", "correct"])
def test_a_narrow_range_is_read_from_an_index_by_step_alone(climbed, sort):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    # steps 2-3 of 6: a third of the run, past RANGE_SHARE = 0.2; steps 2-2 is a sixth
    index = "score_step" if sort == "correct" else "rollout_run_step"
    assert not postgres.PostgresSearch().range_first(
        climbed, ExplorerQuery(step_min=2, step_max=3), sort
    )
    assert postgres.PostgresSearch().range_first(
        climbed, ExplorerQuery(step_min=2, step_max=2), sort
    )
    sql = explorer_sql(climbed, sort=sort, order="desc", step_min=2, step_max=2)
    plan = plan_of(sql)
    scan = next(line for line in plan.splitlines() if " using " in line)
    assert f"Index Only Scan using {index}" in scan, plan
    assert "Sort" in plan and "step >= 2" in plan.split(index, 1)[1], plan

"""The explorer sorted by a rollout column (reward, advantage, length) or a component, filtered to a
step range: the worst case for a walk of the sort index is a range whose rows sort last (the best
rewards of the first steps, when reward climbs over the run), so every later step's rows are
skipped first.

Three plans. A component or the reward: each step's top rows, merged (paging.per_step_fetch over
score_step / rollout_run_step_reward, keyed by step then value, migration 0012). Advantage and
length (PostgresSearch.range_first): a wide range walks the sort index, the skipped entries checked
inside it (INCLUDE step, migration 0011), never by a heap fetch each; a narrow one is read from an
index by step that carries the sort values, and its top sorted. The paging tests run every plan
(per_step; walk: RANGE_SHARE 0; range: RANGE_SHARE 1) against Python's sort, NULLs included; the
plan tests check each plan's index on Postgres.
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


def unscored(step: int, k: int, i: int, rewards: dict) -> dict:
    """NULLs in the sorts: one rollout of step 2 scored by nothing (its reward NULL), and
    `format` missing on a few others."""
    if (step, k, i) == (2, 0, 3):
        return {name: None for name in rewards}
    if (step + i + k) % 5 == 0:
        return {**rewards, "format": None}
    return rewards


def in_order(rows, order: str) -> list[int]:
    """(value, id) rows in keyset order: NULL above every number (last ascending, first
    descending)."""
    key = sorted(rows, key=lambda r: (r[0] is None, r[0] or 0, r[1]), reverse=order == "desc")
    return [i for _, i in key]


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
                            "rewards": unscored(
                                step,
                                k,
                                i,
                                {
                                    "correct": float((step + i) % 3 == 0 or step >= 4),
                                    "format": round(0.1 * step + 0.05 * (i % 2), 2),
                                    "penalty": -0.1 * ((i + k) % 2),
                                },
                            ),
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


@pytest.fixture(params=["per_step", "walk", "range"])
def climbing(request, climbed, monkeypatch):
    if request.param != "per_step":
        monkeypatch.setattr(postgres.PostgresSearch, "range_steps", lambda *a: None)
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
                want = in_order(rows.values_list(field, "id"), order)
                assert want, (field, lo, hi)
                got = paged(run, sort=field, order=order, step_min=lo, step_max=hi)
                assert got == want, (field, order, lo, hi)


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
                want = in_order(scores.values_list("value", "rollout_id"), order)
                got = paged(run, sort=name, order=order, step_min=lo, step_max=hi)
                assert got == want, (name, order, lo, hi)


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
    monkeypatch.setattr(postgres.PostgresSearch, "range_steps", lambda *a: None)
    sql = explorer_sql(climbed, sort=field, order="desc", step_min=0, step_max=1)
    plan = plan_of(sql, "rollout_run_step", "rollout_run_step_reward")
    assert f"Index Only Scan Backward using {index}" in plan, plan
    assert "step" in plan.split(index, 1)[1], plan  # the step range is a filter of that scan


@pytest.mark.postgres
@pytest.mark.parametrize("sort", ["reward", "advantage", "length", "correct"])
def test_a_narrow_range_is_read_from_an_index_by_step_alone(climbed, sort, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    monkeypatch.setattr(postgres.PostgresSearch, "range_steps", lambda *a: None)
    # steps 2-3 of 6: a third of the run, past RANGE_SHARE = 0.2; steps 2-2 is a sixth
    index = "score_step" if sort == "correct" else "rollout_run_step"
    assert not postgres.PostgresSearch().range_first(
        climbed, ExplorerQuery(step_min=2, step_max=3), sort
    )
    assert postgres.PostgresSearch().range_first(
        climbed, ExplorerQuery(step_min=2, step_max=2), sort
    )
    sql = explorer_sql(climbed, sort=sort, order="desc", step_min=2, step_max=2)
    # On a table this small a heap fetch is as cheap as an index-only read: without the reward's
    # per-step index the plan shows whether this one serves the range alone.
    plan = plan_of(sql, *([] if sort == "correct" else ["rollout_run_step_reward"]))
    scan = next(line for line in plan.splitlines() if " using " in line)
    assert f"Index Only Scan using {index}" in scan, plan
    assert "Sort" in plan and "step >= 2" in plan.split(index, 1)[1], plan


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sort,index", [("correct", "score_step"), ("reward", "rollout_run_step_reward")]
)
@pytest.mark.parametrize("order", ["asc", "desc"])
def test_a_step_range_by_a_component_or_the_reward_merges_each_steps_top(
    climbed, sort, index, order
):
    """Each step of the range is one descent of an index keyed by step then value, read for at
    most a page of rows (a LIMIT inside the LATERAL), whatever the step's size."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    with CaptureQueriesContext(connection) as ctx:
        explore(climbed, ExplorerQuery(limit=3, sort=sort, order=order, step_min=1, step_max=4))
    sql = next(
        q["sql"]
        for q in ctx.captured_queries
        if "LATERAL" in q["sql"] and "IS NOT NULL" in q["sql"]  # the values' segment
    )
    plan = plan_of(sql)
    scan = "Index Only Scan Backward" if order == "desc" else "Index Only Scan"
    assert f"{scan} using {index}" in plan, plan
    assert "Nested Loop" in plan and plan.count("Limit") == 2, plan  # the step's and the page's
    assert "Sort Key" in plan.split(index, 1)[0], plan  # only the merged tops are sorted

"""The explorer sorted by a rollout column (reward, advantage, length) or a component, filtered to a
step range: the worst case for a walk of the sort index is a range whose rows sort last (the best
rewards of the first steps, when reward climbs over the run), so every later step's rows are
skipped first.

Two plans. With a range of at most MERGED_ENTRIES / page size steps, each step's top rows, merged
(paging.per_step_fetch over score_step / rollout_run_step_<field>, keyed by step then value,
migration 0012): steps x page size entries whatever the run's size. Past it, the sort index is
walked with the step range checked inside it (INCLUDE step, migration 0011), never by a heap fetch
each. The paging tests run both plans against Python's sort, NULLs included; the plan tests check
each plan's index on Postgres.
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


@pytest.fixture(params=["per_step", "walk"])
def climbing(request, climbed, monkeypatch):
    if request.param == "walk":
        monkeypatch.setattr(postgres, "MERGED_ENTRIES", 0)
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


STEP_INDEXES = (
    "rollout_run_step",
    "rollout_run_step_reward",
    "rollout_run_step_adv",
    "rollout_run_step_length",
)
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
    monkeypatch.setattr(postgres, "MERGED_ENTRIES", 4)  # steps 0-1 x 4 rows (limit 3): walked
    sql = explorer_sql(climbed, sort=field, order="desc", step_min=0, step_max=1)
    plan = plan_of(sql, *STEP_INDEXES)  # any index led by (run, step) offers the range
    assert f"Index Only Scan Backward using {index}" in plan, plan
    assert "step" in plan.split(index, 1)[1], plan  # the step range is a filter of that scan


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sort,index",
    [
        ("correct", "score_step"),
        ("reward", "rollout_run_step_reward"),
        ("advantage", "rollout_run_step_adv"),
        ("length", "rollout_run_step_length"),
    ],
)
@pytest.mark.parametrize("order", ["asc", "desc"])
def test_a_step_range_merges_each_steps_top_from_an_index_by_step_and_value(
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

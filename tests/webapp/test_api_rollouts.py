"""The explorer API read (GET /api/v1/runs/<id>/rollouts/): a fixed number of queries whatever the
page size, and the same JSON as the explorer's rows give (explore(), model instances), with NULL
scores, cursors and a replay's sort; the token's role read with its user on every request."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.conftest import make_group
from tests.webapp import replay_fixtures as fx
from webapp.accounts.roles import ensure_groups, set_role
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.rollouts.ingest import ingest_groups

# token + role, run, components, the keyset walk (two segments at most: NULLs and values),
# the page's rollouts with their group's std, the page's scores
MAX_QUERIES = 7


def expected_json(run: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The response as the view built it from explore()'s model instances before it read plain
    rows: what the API must still answer, key order included."""
    comps = run.components()
    q = ExplorerQuery.from_params(params, [c.name for c in comps])
    page = explore(run, q)
    return {
        "sort": q.sort,
        "order": q.order,
        "next": page.next_cursor,
        "rollouts": [
            {
                "id": row.rollout.id,
                "step": row.rollout.step,
                "group_id": row.rollout.group_id,
                "index": row.rollout.index,
                "split": row.rollout.split,
                "reward": row.rollout.reward,
                "advantage": row.rollout.advantage,
                "length": row.rollout.length,
                "completion": row.rollout.completion,
                "rewards": row.values,
                "group_std": row.group_std,
                "sort_value": row.sort_value,
            }
            for row in page.rows
        ],
    }


def _pages(client: Any, run: Any, **params: Any) -> list[tuple[dict, dict]]:
    """Every page of the listing: (params, response JSON)."""
    out, cursor = [], None
    while True:
        p = {**params, **({"cursor": cursor} if cursor else {})}
        res = client.get(reverse("api-run-rollouts", args=[run.id]), p)
        assert res.status_code == 200, res.content
        out.append((p, res.json()))
        cursor = res.json()["next"]
        if not cursor:
            return out


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got == want
    assert list(got) == list(want)
    for g, w in zip(got["rollouts"], want["rollouts"], strict=True):
        assert list(g) == list(w)


@pytest.fixture
def scored(run):
    """Three steps of groups with ties and NULL scores (an unscorable completion)."""
    vals = [0.0, 0.5, 0.5, None, 1.0, None]
    groups = [
        make_group(s, f"k{s}", [{"correct": v, "format": 1.0 - s / 4} for v in vals])
        for s in range(3)
    ]
    ingest_groups(run, {"groups": groups})
    return run


@pytest.mark.parametrize(
    "params",
    [
        {"sort": "correct", "order": "desc", "limit": 4},
        {"sort": "correct", "order": "asc", "limit": 5},
        {"sort": "reward", "order": "desc", "limit": 7},
        {"sort": "format", "order": "asc", "limit": 3, "step_min": 1, "split": "train"},
    ],
)
def test_it_answers_the_json_of_the_explorer_rows_on_every_page(api, personas, scored, params):
    pages = _pages(api(personas["viewer"]), scored, **params)
    assert len(pages) > 1  # the cursors were followed
    assert any(
        r["rewards"]["correct"] is None for _, body in pages for r in body["rollouts"]
    )  # NULL scores included
    for p, body in pages:
        _same(body, expected_json(scored, p))


def test_it_answers_the_json_of_the_explorer_rows_for_a_replay_sort(api, personas):
    from webapp.replays import services

    run = fx.diagram_run(personas["trainer"])
    completions = [fx.EDGE_SPAM, fx.FULL, fx.MISSING_EDGE, fx.EXTRA_NODE, fx.PROSE]
    fx.ingest(run, [fx.group_record(0, "a", completions), fx.group_record(1, "b", completions)])
    replay = services.create_replay(run, {"versions": [{"version": "semantic_coverage@no_extras"}]})
    services.work(replay.id, "test")
    params = {"sort": "replay.semantic_coverage", "replay": replay.id, "limit": 3}
    pages = _pages(api(personas["viewer"]), run, **params)
    assert len(pages) > 1
    for p, body in pages:
        _same(body, expected_json(run, p))


@pytest.mark.parametrize(
    "params",
    [
        {"sort": "correct", "order": "desc"},
        {"sort": "correct", "order": "asc"},
        {"sort": "reward"},
        {"sort": "length", "order": "asc", "step_min": 1},
    ],
)
def test_it_reads_a_page_in_a_fixed_number_of_queries(api, personas, scored, params):
    client = api(personas["viewer"])
    url = reverse("api-run-rollouts", args=[scored.id])
    counts, rows = [], 12 if "step_min" in params else 18
    for limit in (1, 5, 500):  # 1 and 5 stay in one keyset segment (6 NULLs, 12 values)
        with CaptureQueriesContext(connection) as ctx:
            res = client.get(url, {**params, "limit": limit})
        assert res.status_code == 200 and len(res.json()["rollouts"]) == min(limit, rows)
        counts.append(len(ctx.captured_queries))
    # a step range reads the run's steps from its per-step statistics (Postgres: range_steps)
    most = MAX_QUERIES + (connection.vendor == "postgresql" and "step_min" in params)
    assert counts[0] == counts[1] and max(counts) <= most, counts


def test_it_refuses_an_unknown_or_inactive_token(api, personas, run):
    from rest_framework.test import APIClient

    url = reverse("api-run-rollouts", args=[run.id])
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    res = stranger.get(url)
    assert res.status_code == 401 and res.json()["errors"][0]["error"] == "Invalid token."
    viewer = personas["viewer"]
    client = api(viewer)
    assert client.get(url).status_code == 200
    viewer.is_active = False
    viewer.save(update_fields=["is_active"])
    res = client.get(url)
    assert res.status_code == 401
    assert res.json()["errors"][0]["error"] == "User inactive or deleted."


def test_it_reads_the_tokens_role_with_its_user_on_every_request(api, personas, run):
    """The strongest of the user's role groups, read afresh per request: a promotion and a
    demotion both apply to the very next call on the same token."""
    user = personas["viewer"]
    client = api(user)
    url = reverse("api-run-groups", args=[run.id])
    body = {"groups": [make_group(0, "a", [{"correct": 1.0}])]}
    assert client.post(url, body, format="json").status_code == 403
    ensure_groups()
    user.groups.add(*Group.objects.filter(name__in=["annotator", "trainer"]))  # two roles
    assert client.post(url, body, format="json").status_code == 201
    set_role(user, "annotator")
    body = {"groups": [make_group(0, "b", [{"correct": 1.0}])]}
    assert client.post(url, body, format="json").status_code == 403
    user.groups.clear()
    user.is_superuser = True  # admin whatever the groups say
    user.save(update_fields=["is_superuser"])
    assert client.post(url, body, format="json").status_code == 201

"""The explorer sorts and filters by a replay's values like any component's
(sort=replay.<component>, min_/max_replay.<component>, replay=<id>), through the API and
the page, keyset-paged."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp import replay_fixtures as fx
from webapp.errors import FieldError

NO_EXTRAS = [{"version": "semantic_coverage@no_extras"}]
COMPLETIONS = [fx.EDGE_SPAM, fx.FULL, fx.MISSING_EDGE, fx.EXTRA_NODE, fx.MISSING_NODE, fx.PROSE]


@pytest.fixture
def replayed(personas):
    from webapp.replays import services
    from webapp.replays.models import Replay

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run, [fx.group_record(0, "a", COMPLETIONS), fx.group_record(1, "b", COMPLETIONS[::-1])]
    )
    replay = services.create_replay(run, {"versions": NO_EXTRAS})
    services.work(replay.id, "test")
    return Replay.objects.select_related("run").get(id=replay.id)


def _replayed_values(replay) -> dict[int, float]:
    return dict(
        replay.scores.filter(component__name="semantic_coverage").values_list("rollout_id", "value")
    )


def _get(client, run, **params):
    return client.get(reverse("api-run-rollouts", args=[run.id]), params)


def test_it_sorts_by_a_replays_values_across_keyset_pages(replayed, client_as):
    client, run = client_as("viewer"), replayed.run
    values = _replayed_values(replayed)
    original = dict(
        run.rollouts.values_list("id", "scores__value").filter(
            scores__component__name="semantic_coverage"
        )
    )
    assert (
        values != original
    )  # the version changes the edge-spam rollouts' values: the order must follow it
    for order in ("desc", "asc"):
        seen, cursor = [], None
        while True:
            body = _get(
                client,
                run,
                sort="replay.semantic_coverage",
                replay=replayed.id,
                order=order,
                limit=5,
                **({"cursor": cursor} if cursor else {}),
            ).json()
            seen += [(r["id"], r["sort_value"]) for r in body["rollouts"]]
            cursor = body["next"]
            if not cursor:
                break
        expected = sorted(values.items(), key=lambda kv: (kv[1], kv[0]), reverse=order == "desc")
        assert seen == expected


def test_it_filters_by_a_replays_values_with_the_other_filters(replayed, client_as):
    client, run = client_as("viewer"), replayed.run
    values = _replayed_values(replayed)
    body = _get(
        client, run, replay=replayed.id, **{"min_replay.semantic_coverage": "0.7", "step_min": "1"}
    ).json()
    steps = dict(run.rollouts.values_list("id", "step"))
    assert sorted(r["id"] for r in body["rollouts"]) == sorted(
        i for i, v in values.items() if v >= 0.7 and steps[i] >= 1
    )
    assert body["rollouts"] and all(r["step"] == 1 for r in body["rollouts"])
    sorted_body = _get(
        client,
        run,
        sort="replay.semantic_coverage",
        replay=replayed.id,
        step_max="0",
        **{"max_replay.semantic_coverage": "0.9"},
    ).json()
    assert [r["id"] for r in sorted_body["rollouts"]] == [
        i
        for i, v in sorted(values.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        if v <= 0.9 and steps[i] == 0
    ]


@pytest.mark.parametrize(
    "params, field, words",
    [
        ({"sort": "replay.semantic_coverage"}, "replay", "required"),
        ({"min_replay.semantic_coverage": "0.5"}, "replay", "required"),
        ({"sort": "replay.nope", "replay": "1"}, "sort", "must be one of"),
        (
            {"sort": "replay.json_valid", "replay": "{replay}"},
            "replay",
            "does not replay 'json_valid'",
        ),
        (
            {"sort": "replay.semantic_coverage", "replay": "999999"},
            "replay",
            "no replay 999999 of this run",
        ),
        ({"replay": "x"}, "replay", "must be an integer"),
        (
            {"min_replay.semantic_coverage": "nan", "replay": "{replay}"},
            "min_replay.semantic_coverage",
            "finite",
        ),
    ],
)
def test_it_refuses_bad_replay_params_naming_the_field(replayed, client_as, params, field, words):
    params = {k: v.format(replay=replayed.id) for k, v in params.items()}
    res = _get(client_as("viewer"), replayed.run, **params)
    assert res.status_code == 400
    err = res.json()["errors"][0]
    assert err["field"] == field and words in err["error"]


def test_it_refuses_a_replay_of_another_run(replayed, client_as, personas):
    other = fx.diagram_run(personas["trainer"])
    res = _get(client_as("viewer"), other, sort="replay.semantic_coverage", replay=replayed.id)
    assert res.status_code == 400 and res.json()["errors"][0]["field"] == "replay"


def test_it_links_the_replay_page_to_the_explorer_sorted_by_the_replayed_values(
    replayed, client_as
):
    client = client_as("viewer")
    page = client.get(reverse("replays-detail", args=[replayed.id])).content.decode()
    url = (
        f"{reverse('rollouts-explorer', args=[replayed.run_id])}"
        f"?sort=replay.semantic_coverage&amp;order=desc&amp;replay={replayed.id}"
    )
    assert url in page
    explorer = client.get(url.replace("&amp;", "&"))
    values = _replayed_values(replayed)
    best = max(values.items(), key=lambda kv: (kv[1], kv[0]))[0]
    assert (
        explorer.status_code == 200
        and reverse("rollouts-transcript", args=[best]) in explorer.content.decode()
    )


def test_it_refuses_a_replay_sort_built_in_code_without_a_replay(replayed):
    from webapp.explorer.params import ExplorerQuery
    from webapp.explorer.query import explore

    with pytest.raises(FieldError) as e:
        explore(replayed.run, ExplorerQuery(sort="replay.semantic_coverage"))
    assert e.value.field == "replay"


def test_the_transcript_walks_the_replay_order_with_prev_and_next(replayed, client_as):
    client = client_as("viewer")
    values = _replayed_values(replayed)
    order = [i for i, _ in sorted(values.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]
    params = {"sort": "replay.semantic_coverage", "replay": replayed.id, "order": "desc"}
    middle = order[len(order) // 2]
    resp = client.get(reverse("rollouts-transcript", args=[middle]), params)
    assert resp.status_code == 200
    assert (resp.context["prev_id"], resp.context["next_id"]) == (
        order[order.index(middle) - 1],
        order[order.index(middle) + 1],
    )
    other = client.get(reverse("rollouts-transcript", args=[middle]), {**params, "replay": 10**9})
    assert other.status_code == 200 and other.context["next_id"] is None  # not this run's replay

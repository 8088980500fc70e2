"""REST API v1: auth, run creation, ingestion errors, rollout queries with keyset
cursors, group detail."""

import json

import pytest
from django.core.management import call_command

from tests.conftest import make_group
from webapp.rollouts.models import Group, Rollout

ENV = {
    "name": "api-env",
    "components": [{"name": "acc", "weight": 1.0}, {"name": "fmt", "weight": 0.5}],
}


def _post(client, url, body, raw=False):
    return client.post(url, data=body if raw else json.dumps(body), content_type="application/json")


def test_it_refuses_anonymous_requests(client, db):
    assert client.get("/api/v1/runs/").status_code in (401, 403)
    assert _post(client, "/api/v1/runs/", {"name": "x"}).status_code in (401, 403)


def test_it_creates_a_run_and_ingests_groups(api, personas):
    c = api(personas["trainer"])
    res = _post(
        c,
        "/api/v1/runs/",
        {"name": "r1", "kind": "grpo", "environment": ENV, "config": {"beta": 0.0}},
    )
    assert res.status_code == 201, res.json()
    run_id = res.json()["id"]
    body = {"groups": [make_group(0, "p", [{"acc": 1, "fmt": 1}, {"acc": 0, "fmt": 1}])]}
    res = _post(c, f"/api/v1/runs/{run_id}/groups/", body)
    assert res.status_code == 201 and res.json()["rollouts"] == 2
    again = _post(c, f"/api/v1/runs/{run_id}/groups/", body)
    assert again.status_code == 200 and again.json()["groups"] == 0
    assert Rollout.objects.count() == 2


def test_it_forbids_a_viewer_to_ingest(api, personas, run):
    res = _post(api(personas["viewer"]), f"/api/v1/runs/{run.id}/groups/", {"groups": []})
    assert res.status_code == 403


@pytest.mark.parametrize(
    "body, field",
    [
        ('{"groups": [', "body"),
        ('{"groups": [{"step": NaN}]}', "body"),
        (
            '{"groups": [{"step": 0, "key": "k", "prompt": "p", "rollouts": [{"index": 0, '
            '"completion": "c", "rewards": {"nope": 1}}]}]}',
            "groups[0].rollouts[0].rewards.nope",
        ),
        (
            '{"groups": [{"step": 0, "key": "k", "prompt": "p", "rollouts": [{"index": 0, '
            '"completion": "c", "rewards": {"correct": "1"}}]}]}',
            "groups[0].rollouts[0].rewards.correct",
        ),
        ('{"groups": 3}', "groups"),
    ],
)
def test_it_answers_400_naming_the_field(api, personas, run, body, field):
    res = _post(api(personas["trainer"]), f"/api/v1/runs/{run.id}/groups/", body, raw=True)
    assert res.status_code == 400
    assert res.json()["errors"][0]["field"] == field
    assert Group.objects.count() == 0


def test_it_rejects_a_body_over_the_size_limit(api, personas, run, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    body = {"groups": [make_group(0, "p", [{"correct": 1}] * 40)]}
    res = _post(api(personas["trainer"]), f"/api/v1/runs/{run.id}/groups/", body)
    assert res.status_code == 400 and "larger than" in res.json()["errors"][0]["error"]
    assert Group.objects.count() == 0


def test_it_pages_rollouts_sorted_by_a_component_with_stable_ties(api, personas, run):
    from webapp.rollouts.ingest import ingest_groups

    vals = [0.0, 0.5, 0.5, 0.5, 1.0, None]
    groups = [
        make_group(s, f"k{s}", [{"correct": v, "format": 1.0} for v in vals]) for s in range(3)
    ]
    ingest_groups(run, {"groups": groups})
    c = api(personas["viewer"])
    for order in ("asc", "desc"):
        seen, cursor = [], None
        while True:
            url = f"/api/v1/runs/{run.id}/rollouts/?sort=correct&order={order}&limit=4"
            url += f"&cursor={cursor}" if cursor else ""
            data = c.get(url).json()
            seen += [(r["rewards"]["correct"], r["id"]) for r in data["rollouts"]]
            cursor = data["next"]
            if not cursor:
                break
        assert len(seen) == 18 and len({i for _, i in seen}) == 18
        key = [(float("inf") if v is None else v, i) for v, i in seen]
        assert key == sorted(key, reverse=order == "desc")


def test_it_filters_rollouts_by_step_and_reports_group_std(api, personas, run):
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(
        run,
        {"groups": [make_group(s, "k", [{"correct": 1.0}, {"correct": 0.0}]) for s in range(4)]},
    )
    data = (
        api(personas["viewer"])
        .get(f"/api/v1/runs/{run.id}/rollouts/?sort=reward&step_min=1&step_max=2")
        .json()
    )
    assert {r["step"] for r in data["rollouts"]} == {1, 2}
    assert data["rollouts"][0]["group_std"] == pytest.approx(0.7071, abs=1e-3)
    bad = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/rollouts/?sort=bogus")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "sort"


def test_it_returns_a_group_with_component_stats(api, personas, run):
    from webapp.rollouts.ingest import ingest_groups

    scores = [{"correct": 1.0, "format": 1.0}, {"correct": 0.0, "format": 1.0}]
    ingest_groups(run, {"groups": [make_group(3, "g", scores)]})
    data = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/groups/?step=3&key=g").json()
    assert data["components"]["format"]["zero_std"] is True
    assert data["components"]["correct"]["std"] == pytest.approx(0.7071, abs=1e-3)
    assert [r["index"] for r in data["rollouts"]] == [0, 1]


def test_it_records_metrics_and_keeps_the_latest_value(api, personas, run):
    c = api(personas["trainer"])
    url = f"/api/v1/runs/{run.id}/metrics/"
    assert (
        _post(c, url, {"metrics": [{"step": 1, "values": {"loss": 2.0, "kl": 0.1}}]}).status_code
        == 200
    )
    assert _post(c, url, {"metrics": [{"step": 1, "values": {"loss": 1.5}}]}).status_code == 200
    assert dict(run.metrics.values_list("name", "value")) == {"loss": 1.5, "kl": 0.1}
    bad = _post(c, url, {"metrics": [{"step": 1, "values": {"loss": "x"}}]})
    assert bad.json()["errors"][0]["field"] == "metrics[0].values.loss"


def test_it_serves_an_openapi_schema(api, personas):
    res = api(personas["viewer"]).get("/api/v1/schema/?format=json")
    assert res.status_code == 200
    assert "/api/v1/runs/{run_id}/groups/" in res.json()["paths"]


def test_createapitoken_prints_the_token_on_its_last_line(db, capsys):
    from rest_framework.authtoken.models import Token

    call_command("createapitoken", "bot")
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == Token.objects.get(user__username="bot").key

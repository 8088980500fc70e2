"""The API refuses what it would otherwise drop without a word (unknown fields, wrong types),
answers every error as JSON (404s included), finds-or-creates a run by name, and reads roles
at request time."""

from __future__ import annotations

import pytest

from tests.conftest import make_group
from webapp.accounts.roles import set_role
from webapp.runs.models import Run

ENV = {"name": "strict-env", "components": [{"name": "correct"}]}


def errors_of(res) -> list[dict]:
    assert res["Content-Type"].startswith("application/json"), res["Content-Type"]
    return res.json()["errors"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "r", "environment": ENV, "nmae": "typo"}, "nmae"),
        ({"name": "r", "environment": ENV, "config": []}, "config"),
        ({"name": "r", "environment": ENV, "base_model": 7}, "base_model"),
        ({"name": "r", "environment": ENV, "get_or_create": "yes"}, "get_or_create"),
        ({"name": "r", "environment": {**ENV, "colour": "red"}}, "environment.colour"),
        (
            {"name": "r", "environment": {"name": "e", "components": [{"name": "c", "wieght": 2}]}},
            "environment.components[0].wieght",
        ),
        (
            {
                "name": "r",
                "environment": {"name": "e", "components": [{"name": "c", "description": {}}]},
            },
            "environment.components[0].description",
        ),
        ({"name": "r", "environment": ENV, "": 1}, '""'),
    ],
)
def test_it_refuses_unknown_fields_and_wrong_types_in_a_run_naming_the_field(
    api, personas, body, field
):
    res = api(personas["trainer"]).post("/api/v1/runs/", body, format="json")
    assert res.status_code == 400
    assert errors_of(res)[0]["field"] == field
    assert not Run.objects.filter(name="r").exists()


@pytest.mark.parametrize(
    "group, field",
    [
        ({"stepp": 1}, "groups[0].stepp"),
        (
            {"rollouts": [{"index": 0, "completion": "x", "rewardz": {"correct": 1}}]},
            "groups[0].rollouts[0].rewardz",
        ),
    ],
)
def test_it_refuses_unknown_fields_in_an_ingested_batch(api, personas, run, group, field):
    g = make_group(0, "k", [{"correct": 1}])
    if "rollouts" in group:
        g["rollouts"] = group["rollouts"]
    else:
        g.update(group)
    res = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/groups/", {"groups": [g]}, format="json"
    )
    assert res.status_code == 400 and field in [e["field"] for e in errors_of(res)]
    assert run.groups.count() == 0


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"aggregation": {}}, "spec.aggregation"),
        ({"aggregation": ""}, "spec.aggregation"),
        ({"scale_rewards": []}, "spec.scale_rewards"),
        ({"drop": {}}, "spec.drop"),
        ({"weights": []}, "spec.weights"),
        ({"drop": [], "extra": 1}, "spec.extra"),
    ],
)
def test_it_refuses_an_ablation_spec_with_a_wrong_type_naming_the_field(
    api, personas, run, spec, field
):
    res = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/ablations/", {"spec": spec}, format="json"
    )
    assert res.status_code == 400 and errors_of(res)[0]["field"] == field


def test_it_still_takes_the_runs_settings_when_a_spec_leaves_them_out(api, personas, run):
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(run, {"groups": [make_group(0, "k", [{"correct": 1}, {"correct": 0}])]})
    res = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/ablations/",
        {"spec": {"drop": ["format"], "aggregation": None}},
        format="json",
    )
    assert res.status_code == 201, res.content


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nope/",
        "/api/v2/runs/",
        "/api/v1/runs/abc/groups/",
        "/api/v1/runs/999999/groups/?step=0&key=k",
        "/api/v1/ablations/999999/",
    ],
)
def test_it_answers_404_as_json_under_api(api, personas, path):
    res = api(personas["viewer"]).get(path)
    assert res.status_code == 404
    assert errors_of(res)[0]["error"]


def test_it_says_a_url_needs_its_trailing_slash(api, personas):
    res = api(personas["trainer"]).post("/api/v1/runs", {}, format="json")
    assert res.status_code == 404 and "/api/v1/runs/" in errors_of(res)[0]["error"]


def test_it_answers_404_as_json_also_with_debug_on(api, personas, settings):
    settings.DEBUG = True  # Django's HTML debug 404 page must not answer an API client
    assert errors_of(api(personas["viewer"]).get("/api/v1/nothing-here/"))


def test_it_keeps_html_404_pages_outside_the_api(client_as):
    res = client_as("viewer").get("/no-such-page/")
    assert res.status_code == 404 and not res["Content-Type"].startswith("application/json")


def test_it_finds_or_creates_a_run_by_name(api, personas):
    c = api(personas["trainer"])
    body = {"name": "shared", "environment": ENV, "get_or_create": True}
    first, again = (
        c.post("/api/v1/runs/", body, format="json"),
        c.post("/api/v1/runs/", body, format="json"),
    )
    assert (first.status_code, first.json()["created"]) == (201, True)
    assert (again.status_code, again.json()) == (200, {"id": first.json()["id"], "created": False})
    assert Run.objects.filter(name="shared").count() == 1


def test_it_refuses_to_find_a_run_by_a_name_that_several_runs_share(api, personas, env3):
    from webapp.rollouts.services import create_run

    for _ in range(2):
        create_run(name="twice", kind="grpo", environment=env3, config={})
    res = api(personas["trainer"]).post(
        "/api/v1/runs/", {"name": "twice", "environment": ENV, "get_or_create": True}, format="json"
    )
    assert res.status_code == 409 and errors_of(res)[0]["field"] == "name"


def test_it_refuses_to_find_a_run_with_another_environment(api, personas):
    c = api(personas["trainer"])
    c.post("/api/v1/runs/", {"name": "mine", "environment": ENV}, format="json")
    res = c.post(
        "/api/v1/runs/",
        {"name": "mine", "environment": {"name": "other", "components": []}, "get_or_create": True},
        format="json",
    )
    assert res.status_code == 409 and errors_of(res)[0]["field"] == "environment"


def test_it_takes_write_access_from_a_demoted_owners_token_at_once(api, personas):
    owner = personas["trainer"]
    c = api(owner)
    run_id = c.post("/api/v1/runs/", {"name": "owned", "environment": ENV}, format="json").json()[
        "id"
    ]
    batch = {"groups": [make_group(0, "a", [{"correct": 1}])]}
    assert c.post(f"/api/v1/runs/{run_id}/groups/", batch, format="json").status_code == 201
    set_role(owner, "viewer")  # the same token, the very next request
    batch = {"groups": [make_group(0, "b", [{"correct": 1}])]}
    assert c.post(f"/api/v1/runs/{run_id}/groups/", batch, format="json").status_code == 403
    assert (
        c.post(f"/api/v1/runs/{run_id}/metrics/", {"metrics": []}, format="json").status_code == 403
    )
    assert c.post(f"/api/v1/runs/{run_id}/finish/").status_code == 403
    assert (
        c.post(f"/api/v1/runs/{run_id}/ablations/", {"spec": {}}, format="json").status_code == 403
    )
    assert c.get(f"/api/v1/runs/{run_id}/rollouts/").status_code == 200  # a viewer still reads


def test_it_lets_an_owner_demoted_to_annotator_keep_writing_to_their_own_run_only(
    api, personas, run
):
    owner = personas["trainer"]
    c = api(owner)
    mine = c.post("/api/v1/runs/", {"name": "owned", "environment": ENV}, format="json").json()[
        "id"
    ]
    set_role(owner, "annotator")
    batch = {"groups": [make_group(0, "a", [{"correct": 1}])]}
    assert c.post(f"/api/v1/runs/{mine}/groups/", batch, format="json").status_code == 201
    Run.objects.filter(id=run.id).update(owner=personas["admin"])
    assert c.post(f"/api/v1/runs/{run.id}/groups/", batch, format="json").status_code == 403


@pytest.mark.parametrize(
    "body, field",
    [
        ({"metrics": [], "extra": 1}, "extra"),
        ({"metrics": [{"step": 0, "values": {"loss": 1.0}, "vals": {}}]}, "metrics[0].vals"),
    ],
)
def test_it_refuses_unknown_fields_in_metrics(api, personas, run, body, field):
    res = api(personas["trainer"]).post(f"/api/v1/runs/{run.id}/metrics/", body, format="json")
    assert res.status_code == 400 and errors_of(res)[0]["field"] == field
    assert not run.metrics.exists()

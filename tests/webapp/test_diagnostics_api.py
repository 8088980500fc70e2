"""Diagnostics as an API (GET /api/v1/runs/<id>/diagnostics/) and a CLI (manage.py diagnose), and
the onsets on the diagnostics page. Runs are stored through the ingestion service, field by field as
the recorder's records are."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups


@pytest.fixture(autouse=True)
def _fresh_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def seed_saturating(run, steps: int = 12, onset: int = 4, dead_correct: bool = False) -> None:
    """`format` (behavioural) varies until `onset`, then is 1 in every rollout; `correct` (outcome)
    keeps varying (or, dead_correct: is 0 everywhere, a verifier that never runs)."""
    groups = []
    for s in range(steps):
        for k in range(3):
            groups.append(
                make_group(
                    s,
                    f"p{k}",
                    [
                        {
                            "correct": 0 if dead_correct else (i + k + s) % 2,
                            "format": 1 if s >= onset else (i + k) % 2,
                            "penalty": -0.1 * ((i * 7 + k + s) % 4),
                        }
                        for i in range(4)
                    ],
                )
            )
    ingest_groups(run, {"groups": groups})


def url(run, window: str | None = None) -> str:
    return f"/api/v1/runs/{run.id}/diagnostics/" + (f"?window={window}" if window else "")


def finding(doc: dict, code: str) -> dict:
    return next(f for f in doc["findings"] if f["code"] == code)


def diagnose(*args: str) -> tuple[int, str]:
    """(exit status, stdout) of `manage.py diagnose ARGS`."""
    out = io.StringIO()
    try:
        call_command("diagnose", *args, stdout=out)
    except SystemExit as e:
        return int(e.code), out.getvalue()
    return 0, out.getvalue()


# ---------------------------------------------------------------- API


def test_it_returns_findings_with_their_onset_to_a_viewer_token(api, personas, run):
    seed_saturating(run)
    r = api(personas["viewer"]).get(url(run))
    assert r.status_code == 200
    doc = r.json()
    assert doc["status"] == "warning" and doc["note"] is None and doc["window"] == 50
    f = finding(doc, "saturation")
    assert f["component"] == "format" and f["onset_step"] == 4 and f["severity"] == "warning"
    assert f["title"].startswith("'format' is saturated from step 4")
    assert f["evidence"]["at_max"] == 1.0 and f["fix"]
    assert (
        f"/runs/{run.id}/rollouts/" in f["link"]
        and "step_min=4" in f["link"]
        and "sort=correct" in f["link"]
    )
    assert [c["name"] for c in doc["components"]] == ["correct", "format", "penalty"]
    fmt = doc["over_time"]["components"]["format"]
    assert (
        doc["over_time"]["steps"] == list(range(12))
        and fmt["at_max"][4:] == [1.0] * 8
        and fmt["at_max"][0] == 0.5
    )


def test_it_diagnoses_only_the_window_asked_for(api, personas, run):
    seed_saturating(run)
    doc = api(personas["viewer"]).get(url(run, "3")).json()
    assert doc["window"] == 3 and doc["steps"] == {"min": 9, "max": 11}
    assert api(personas["viewer"]).get(url(run, "all")).json()["window"] is None


@pytest.mark.parametrize("window", ["0", "-3", "abc", "1e3", "100001"])
def test_it_rejects_a_bad_window_naming_the_field(api, personas, run, window):
    r = api(personas["viewer"]).get(url(run, window))
    assert r.status_code == 400
    assert (
        r.json()["errors"][0]["field"] == "window"
        and "whole number of steps" in r.json()["errors"][0]["error"]
    )


def test_it_needs_a_login_and_answers_404_for_an_unknown_run(client, api, personas, run):
    assert client.get(url(run)).status_code in (401, 403)
    r = api(personas["viewer"]).get("/api/v1/runs/999999/diagnostics/")
    assert r.status_code == 404 and "errors" in r.json()


@pytest.mark.parametrize("case", ["one step, one group", "all values missing", "no rollouts"])
def test_it_says_not_enough_groups_to_judge_instead_of_a_finding(api, personas, run, case):
    if case == "one step, one group":
        ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 0}, {"correct": 0}])]})
    elif case == "all values missing":
        ingest_groups(
            run,
            {
                "groups": [
                    make_group(s, f"p{k}", [{"correct": None}, {"correct": None}])
                    for s in range(3)
                    for k in range(4)
                ]
            },
        )
    doc = api(personas["viewer"]).get(url(run)).json()
    assert doc["status"] == "not_enough_data" and doc["note"].startswith(
        "not enough groups to judge"
    )
    assert doc["findings"] == []
    status, out = diagnose(str(run.id), "--fail-on", "warning")
    assert status == 0 and "not enough groups to judge" in out


def test_it_documents_the_route_in_the_openapi_schema(api, personas):
    r = api(personas["viewer"]).get(
        "/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    schema = json.loads(r.content)
    op = schema["paths"]["/api/v1/runs/{run_id}/diagnostics/"]["get"]
    assert [p["name"] for p in op["parameters"] if p["in"] == "query"] == ["window"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    finding_ref = schema["components"]["schemas"][ref]["properties"]["findings"]["items"][
        "$ref"
    ].rsplit("/", 1)[-1]
    assert {"code", "severity", "onset_step", "evidence", "fix"} <= set(
        schema["components"]["schemas"][finding_ref]["properties"]
    )


# ---------------------------------------------------------------- CLI


def test_it_exits_non_zero_on_findings_at_the_fail_on_level(run):
    seed_saturating(run)
    assert diagnose(str(run.id))[0] == 0  # without --fail-on: always 0
    assert diagnose(str(run.id), "--fail-on", "critical")[0] == 0  # a warning only
    status, out = diagnose(run.name, "--fail-on", "warning")  # by name too
    assert status == 1
    assert (
        "WARNING saturation [from step 4]: 'format' is saturated from step 4" in out
        and "step_min=4" in out
    )


def test_it_fails_on_critical_when_the_verifier_never_ran(env3, personas):
    from webapp.rollouts.services import create_run

    broken = create_run(
        name="broken", kind="import", environment=env3, config={}, owner=personas["trainer"]
    )
    seed_saturating(broken, dead_correct=True)
    status, out = diagnose(str(broken.id), "--fail-on", "critical", "--window", "all")
    assert status == 1 and "CRITICAL" in out and "'correct'" in out


def test_it_prints_the_api_document_as_json(api, personas, run):
    seed_saturating(run)
    status, out = diagnose(str(run.id), "--json", "--window", "all")
    doc = json.loads(out)
    assert status == 0 and doc["window"] is None
    assert doc["findings"] == api(personas["viewer"]).get(url(run, "all")).json()["findings"]


@pytest.mark.parametrize("args", [["999999"], ["no such run"], ["{run}", "--window", "zero"]])
def test_it_exits_2_on_bad_input(run, args):
    with pytest.raises(CommandError) as e:
        call_command("diagnose", *[a.format(run=run.id) for a in args], stdout=io.StringIO())
    assert e.value.returncode == 2 and ("RUN" in str(e.value) or "--window" in str(e.value))


# ---------------------------------------------------------------- page


def test_it_marks_the_onset_on_the_page_and_links_transcripts_from_it(client_as, run):
    seed_saturating(run)
    r = client_as("viewer").get(f"/diagnostics/runs/{run.id}/")
    html = r.content.decode()
    assert r.status_code == 200 and 'data-onset="4"' in html and "step_min=4" in html
    figures = json.loads(
        html.split('id="diag-figures" type="application/json">', 1)[1].split("</script>", 1)[0]
    )
    shapes = figures["at-max"]["layout"]["shapes"]
    assert [s["x0"] for s in shapes] == [4] and figures["zero-std"]["layout"]["shapes"][0][
        "x0"
    ] == 4


def test_it_says_not_enough_groups_on_the_page(client_as, run):
    ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 0}, {"correct": 1}])]})
    html = client_as("viewer").get(f"/diagnostics/runs/{run.id}/").content.decode()
    assert "Not enough groups to judge" in html


def test_it_says_not_enough_data_on_the_run_dashboard(client_as, run):
    ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 0}, {"correct": 1}])]})
    html = client_as("viewer").get(f"/runs/{run.id}/").content.decode()
    assert (
        'diag-status not_enough_data">not enough data<' in html
        and "Not enough groups to judge" in html
    )


def test_it_infers_kinds_for_components_sent_without_one(api, personas):
    """A run created through the API with bare component names (no kind, no range) still gets its
    saturation finding, and the answer says what was inferred."""
    client = api(personas["trainer"])
    r = client.post(
        "/api/v1/runs/",
        {
            "name": "no-kinds",
            "environment": {
                "name": "bare",
                "components": [{"name": "passes"}, {"name": "asked", "weight": 0.6}],
            },
        },
        format="json",
    )
    assert r.status_code in (200, 201), r.content
    run_id = r.json()["id"]
    groups = [
        make_group(
            s,
            f"p{k}",
            [
                {"passes": int((i + k + s) % 3 == 0), "asked": 1 if s >= 4 else (i + k) % 2}
                for i in range(4)
            ],
        )
        for s in range(12)
        for k in range(3)
    ]
    assert client.post(
        f"/api/v1/runs/{run_id}/groups/", {"groups": groups}, format="json"
    ).status_code in (200, 201)
    doc = api(personas["viewer"]).get(f"/api/v1/runs/{run_id}/diagnostics/").json()
    f = finding(doc, "saturation")
    assert (
        f["component"] == "asked"
        and f["onset_step"] == 4
        and "No kinds were declared" in f["detail"]
    )
    assert doc["inferred_kinds"]["asked"].endswith("validity-like")
    assert doc["inferred_kinds"]["passes"].endswith("task-like")

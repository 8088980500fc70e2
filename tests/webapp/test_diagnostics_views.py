"""Diagnostics pages, the dashboard slot, ablations (preview, save, compare, launch, overlay), the
ablation API, and the run window. Test client, no browser."""

from __future__ import annotations

import json

import pytest
from django.template.loader import render_to_string

from tests.conftest import make_group
from training import ablation as abl
from webapp.diagnostics import services
from webapp.diagnostics.models import Ablation
from webapp.rollouts.ingest import ingest_groups
from webapp.runs import launch
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run


@pytest.fixture(autouse=True)
def _fresh_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def seed(run, steps: int = 6) -> None:
    """Per step, three groups: `correct` varies, `format` is always 1 (saturated, no
    signal), `penalty` varies."""
    groups = []
    for s in range(steps):
        for k in range(3):
            groups.append(
                make_group(
                    s,
                    f"p{k}",
                    [
                        {
                            "correct": (i + k + s) % 2,
                            "format": 1,
                            "penalty": -0.1 * ((i * 7 + k + s) % 4),
                        }
                        for i in range(4)
                    ],
                )
            )
    ingest_groups(run, {"groups": groups})


def diag_url(run) -> str:
    return f"/diagnostics/runs/{run.id}/"


def ablation_params(**extra) -> dict:
    params = {
        "scale_rewards": "group",
        "aggregation": "sum_then_normalize",
        "weight_correct": "1.0",
        "weight_format": "0.5",
        "weight_penalty": "0.2",
    }
    params.update(extra)
    return params


# ---------------------------------------------------------------- health page and slot


def test_it_shows_health_and_findings_to_a_viewer(client_as, run):
    seed(run)
    r = client_as("viewer").get(diag_url(run))
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-code="saturation"' in html and "&#x27;format&#x27; is saturated" in html
    assert f"/runs/{run.id}/rollouts/?sort=correct&amp;order=asc" in html  # example transcripts
    health = {c["name"]: c for c in r.context["diag"]["health"]["components"]}
    assert health["format"]["zero_std_frac"] == 1.0 and health["format"]["share"] == pytest.approx(
        0.0, abs=1e-12
    )
    assert health["correct"]["share"] > 0.5
    figures = json.loads(
        html.split('id="diag-figures" type="application/json">', 1)[1].split("</script>", 1)[0]
    )
    assert {"zero-std", "share", "corr", "means"} <= set(figures)


def test_it_needs_a_login(client, run):
    r = client.get(f"/diagnostics/runs/{run.id}/")
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]


def test_it_rejects_a_bad_window_naming_the_parameter(client_as, run):
    seed(run)
    r = client_as("viewer").get(diag_url(run), {"window": "lots"})
    assert r.status_code == 400 and "window: must be" in r.content.decode()
    assert client_as("viewer").get(diag_url(run), {"window": "all"}).status_code == 200


def test_it_diagnoses_only_the_window_of_last_steps(client_as, run):
    seed(run, steps=6)
    r = client_as("viewer").get(diag_url(run), {"window": "2"})
    h = r.context["diag"]["health"]
    assert (h["step_min"], h["step_max"], h["n_groups"]) == (4, 5, 6)


def test_it_rediagnoses_when_the_run_gains_groups_without_counting_them(run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seed(run, steps=3)
    assert services.diagnose_run(run, window=None)["health"]["n_groups"] == 9
    with CaptureQueriesContext(connection) as ctx:
        services.diagnose_run(run, window=None)  # cached: only the key is read
    # The key is read per request: bounded by the run's steps, no aggregate over its groups.
    assert not any(
        "rollouts_group" in q["sql"] and "COUNT(" in q["sql"] for q in ctx.captured_queries
    )
    ingest_groups(run, {"groups": [make_group(1, "late", [{"correct": 1}, {"correct": 0}])]})
    assert services.diagnose_run(run, window=None)["health"]["n_groups"] == 10  # an earlier step
    ingest_groups(run, {"groups": [make_group(3, "p0", [{"correct": 1}, {"correct": 0}])]})
    assert services.diagnose_run(run, window=None)["health"]["n_groups"] == 11


def test_it_reports_metric_spikes_from_step_metrics(client_as, run):
    seed(run)
    values = [
        {"step": s, "values": {"kl": 0.9 if s == 12 else 0.02 + 0.001 * (s % 3), "grad_norm": 1.0}}
        for s in range(20)
    ]
    record_metrics(run, {"metrics": values})
    html = client_as("viewer").get(diag_url(run)).content.decode()
    assert 'data-code="unstable"' in html and "&#x27;kl&#x27; spikes at step 12" in html


def test_it_runs_the_quality_detector_on_the_annotated_bad_cases(client_as, run, monkeypatch):
    seed(run)
    from webapp.rollouts.models import Rollout

    top = list(
        Rollout.objects.filter(run=run).order_by("-reward", "id").values_list("id", flat=True)[:20]
    )
    everyone = list(Rollout.objects.filter(run=run).values_list("id", flat=True))
    monkeypatch.setattr(services.annotations, "bad_case_rollout_ids", lambda r: top)
    monkeypatch.setattr(
        services.annotations, "annotated_rollout_ids", lambda r: everyone
    )  # every rollout counts
    html = client_as("viewer").get(diag_url(run)).content.decode()
    assert 'data-code="reward_vs_quality"' in html


def test_it_renders_the_dashboard_slot_compactly(run):
    seed(run)
    html = render_to_string("diagnostics/_dashboard_slot.html", {"run": run})
    assert "Diagnostics" in html and f"/diagnostics/runs/{run.id}/" in html
    assert 'data-code="saturation"' in html and "diag-status warning" in html
    assert "format" in html and "100%" in html  # format: constant in every group


def test_it_renders_the_slot_for_a_run_without_rollouts(run):
    assert "No rollouts to diagnose yet" in render_to_string(
        "diagnostics/_dashboard_slot.html", {"run": run}
    )


def test_it_never_renders_component_text_as_markup(client_as, db, personas):
    from webapp.rollouts.services import create_run, ensure_environment

    env = ensure_environment("xss", [{"name": "a<b>", "weight": 1.0, "kind": "outcome"}])
    run = create_run(
        name="<script>alert(1)</script>",
        kind="import",
        environment=env,
        config={},
        status="running",
    )
    ingest_groups(run, {"groups": [make_group(0, "g", [{"a<b>": 1}, {"a<b>": 0}])]})
    html = client_as("viewer").get(diag_url(run)).content.decode()
    assert "<script>alert(1)</script>" not in html and "a<b>" not in html.replace(
        '"a\\u003Cb\\u003E"', ""
    )


# ---------------------------------------------------------------- ablation pages


def test_it_previews_an_ablation_for_a_viewer_without_saving(client_as, run):
    seed(run)
    url = f"/diagnostics/runs/{run.id}/ablations/"
    assert client_as("viewer").get(url).status_code == 200
    r = client_as("viewer").get(url, ablation_params(drop="format"))
    assert r.status_code == 200
    assert abl.NO_SIGNAL in r.content.decode()  # format is constant inside every group
    assert r.context["result"]["mean_abs_delta"] == pytest.approx(0.0, abs=1e-9)
    assert not Ablation.objects.exists()
    partial = client_as("viewer").get(url, ablation_params(drop="correct"), HTTP_HX_REQUEST="true")
    assert partial.status_code == 200 and b"<html" not in partial.content
    assert partial.context["result"]["mean_abs_delta"] > 0.1
    assert partial.context["result"]["verdict"]["level"] != "no_signal"


@pytest.mark.parametrize(
    "role, status", [("viewer", 403), ("annotator", 403), ("trainer", 302), ("admin", 302)]
)
def test_it_lets_only_trainers_save_ablations(client_as, run, role, status):
    seed(run)
    r = client_as(role).post(
        f"/diagnostics/runs/{run.id}/ablations/save/", ablation_params(drop="format", name="no fmt")
    )
    assert r.status_code == status
    assert Ablation.objects.count() == (1 if status == 302 else 0)
    if status == 302:
        a = Ablation.objects.get()
        assert r["Location"] == f"/diagnostics/ablations/{a.id}/"
        assert (a.name, a.spec["drop"], a.created_by.username) == ("no fmt", ["format"], role)
        assert a.results["verdict"]["level"] == "no_signal"


def test_it_saves_through_htmx_with_a_redirect_header(client_as, run):
    seed(run)
    r = client_as("trainer").post(
        f"/diagnostics/runs/{run.id}/ablations/save/",
        ablation_params(weight_correct="3"),
        HTTP_HX_REQUEST="true",
    )
    a = Ablation.objects.get()
    assert r.status_code == 204 and r["HX-Redirect"] == f"/diagnostics/ablations/{a.id}/"
    assert a.spec["weights"] == {"correct": 3.0} and a.name == "correct=3"


def test_it_refuses_saving_with_get(client_as, run):
    assert (
        client_as("trainer").get(f"/diagnostics/runs/{run.id}/ablations/save/").status_code == 405
    )


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"weight_correct": "lots"}, "Enter a number"),
        ({"aggregation": "average"}, "Select a valid choice"),
        ({"drop": ["correct", "format", "penalty"]}, "spec.drop: cannot drop every component"),
        ({"drop": "nope"}, "Select a valid choice"),
    ],
)
def test_it_reports_form_errors_naming_the_field_and_stores_nothing(client_as, run, params, needle):
    seed(run)
    r = client_as("trainer").post(
        f"/diagnostics/runs/{run.id}/ablations/save/", ablation_params(**params)
    )
    assert r.status_code == 400 and needle in r.content.decode()
    assert not Ablation.objects.exists()
    preview = client_as("viewer").get(
        f"/diagnostics/runs/{run.id}/ablations/", ablation_params(**params)
    )
    assert preview.status_code == 400 and preview.context["result"] is None


def test_it_shows_a_saved_ablation_with_links_to_the_most_affected_groups(client_as, run):
    seed(run)
    client_as("trainer").post(
        f"/diagnostics/runs/{run.id}/ablations/save/", ablation_params(drop="correct")
    )
    a = Ablation.objects.get()
    html = client_as("viewer").get(f"/diagnostics/ablations/{a.id}/").content.decode()
    top = a.results["top_groups"]
    assert top and f'href="/groups/{top[0]["group_id"]}/"' in html
    assert "launch a twin run" not in html  # viewers see no launch button


def test_it_compares_several_ablations_side_by_side(client_as, run):
    seed(run)
    c = client_as("trainer")
    for params in (
        ablation_params(drop="format", name="A"),
        ablation_params(drop="correct", name="B"),
        ablation_params(aggregation="normalize_then_sum", name="C"),
    ):
        c.post(f"/diagnostics/runs/{run.id}/ablations/save/", params)
    ids = list(Ablation.objects.order_by("id").values_list("id", flat=True))
    r = client_as("viewer").get(f"/diagnostics/runs/{run.id}/ablations/compare/", {"ids": ids[:2]})
    assert r.status_code == 200 and [a.name for a in r.context["ablations"]] == ["A", "B"]
    assert [t["name"] for t in r.context["figures"]["compare"]["data"]] == ["A", "B"]
    assert (
        len(
            client_as("viewer")
            .get(f"/diagnostics/runs/{run.id}/ablations/compare/")
            .context["ablations"]
        )
        == 3
    )


# ---------------------------------------------------------------- training ablation (twin run)


def _saved(client_as, run, **params) -> Ablation:
    client_as("trainer").post(
        f"/diagnostics/runs/{run.id}/ablations/save/", ablation_params(**params)
    )
    return Ablation.objects.latest("id")


def test_it_lets_only_trainers_launch_a_twin_run(client_as, run):
    seed(run)
    a = _saved(client_as, run, drop="format")
    for role in ("viewer", "annotator"):
        assert client_as(role).post(f"/diagnostics/ablations/{a.id}/launch/").status_code == 403
    assert Run.objects.count() == 1


def test_it_launches_a_twin_grpo_run_with_the_modified_reward(client_as, run, monkeypatch):
    seed(run)
    run.config = {**run.config, "learning_rate": 1e-5, "scale_rewards": "group"}
    run.save()
    a = _saved(client_as, run, drop="format", weight_correct="2")
    launched = []
    monkeypatch.setattr(launch, "enqueue_run", launched.append)
    r = client_as("trainer").post(f"/diagnostics/ablations/{a.id}/launch/")
    twin = Run.objects.exclude(id=run.id).get()
    assert (
        r.status_code == 302 and r["Location"] == f"/diagnostics/runs/{run.id}/overlay/{twin.id}/"
    )
    assert (twin.kind, twin.status, twin.parent_id) == ("grpo", "queued", run.id)
    assert twin.reward_weights() == {"correct": 2.0, "format": 0.0, "penalty": 0.2}
    assert "reward_weights" not in twin.config  # one source: the run's reward settings
    assert twin.config["ablation_of"] == run.id and twin.config["learning_rate"] == 1e-5
    assert launched == [twin.id]
    a.refresh_from_db()
    assert a.twin_id == twin.id
    again = client_as("trainer").post(f"/diagnostics/ablations/{a.id}/launch/")  # no second twin
    assert again.status_code == 302 and Run.objects.count() == 2


def test_it_overlays_the_curves_of_a_run_and_its_twin(client_as, run, monkeypatch):
    seed(run, steps=4)
    a = _saved(client_as, run, drop="format")
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")
    client_as("trainer").post(f"/diagnostics/ablations/{a.id}/launch/")
    twin = Run.objects.exclude(id=run.id).get()
    ingest_groups(
        twin, {"groups": [make_group(s, "p", [{"correct": 1}, {"correct": 0}]) for s in range(3)]}
    )
    record_metrics(twin, {"metrics": [{"step": s, "values": {"reward": 0.4}} for s in range(3)]})
    r = client_as("viewer").get(f"/diagnostics/runs/{run.id}/overlay/{twin.id}/")
    assert r.status_code == 200
    figs = r.context["figures"]
    assert [t["name"].split(":")[0] for t in figs["reward"]["data"]] == ["original", "twin", "twin"]
    assert (
        figs["reward"]["data"][2]["name"].endswith("(trainer log)")
        and figs["reward"]["data"][2]["y"] == [0.4] * 3
    )
    assert figs["reward"]["data"][1]["x"] == [0, 1, 2] and figs["reward"]["data"][1]["y"] == [
        0.5,
        0.5,
        0.5,
    ]
    assert any(
        f["layout"]["title"]["text"].startswith("correct") for k, f in figs.items() if k != "reward"
    )
    # The twin dropped "format": its aggregate curve differs by construction, and the page says so.
    assert [w for _, w in r.context["weights"]] == [run.reward_weights(), twin.reward_weights()]
    assert "sum their rewards with different weights" in r.content.decode()


def test_it_says_nothing_about_weights_when_an_overlay_shares_them(client_as, run, env3):
    from webapp.rollouts.services import create_run

    other = create_run(name="same weights", kind="grpo", environment=env3, config={})
    r = client_as("viewer").get(f"/diagnostics/runs/{run.id}/overlay/{other.id}/")
    assert r.status_code == 200 and r.context["weights"] is None
    assert "different weights" not in r.content.decode()


# ---------------------------------------------------------------- API


def test_it_creates_and_reads_an_ablation_through_the_api(api, personas, run):
    seed(run)
    r = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/ablations/", {"spec": {"drop": ["format"]}}, format="json"
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["results"]["verdict"]["level"] == "no_signal" and body["name"] == "drop format"
    got = api(personas["viewer"]).get(f"/api/v1/ablations/{body['id']}/").json()
    assert got["results"]["mean_abs_delta"] == body["results"]["mean_abs_delta"]
    listed = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/ablations/").json()["ablations"]
    assert [a["id"] for a in listed] == [body["id"]]


def test_it_refuses_api_ablations_from_viewers(api, personas, run):
    r = api(personas["viewer"]).post(
        f"/api/v1/runs/{run.id}/ablations/", {"spec": {}}, format="json"
    )
    assert r.status_code == 403 and not Ablation.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "spec"),
        ({"spec": []}, "spec"),
        ({"spec": {"drop": ["nope"]}}, "spec.drop"),
        ({"spec": {"drop": "format"}}, "spec.drop"),
        ({"spec": {"weights": {"correct": "2"}}}, "spec.weights.correct"),
        ({"spec": {"weights": {"ghost": 1}}}, "spec.weights.ghost"),
        ({"spec": {"scale_rewards": "sometimes"}}, "spec.scale_rewards"),
        ({"spec": {"aggregation": "mean"}}, "spec.aggregation"),
        ({"spec": {"dropp": []}}, "spec.dropp"),
        ({"spec": {}, "name": 5}, "name"),
        ({"spec": {}, "colour": "red"}, "colour"),
    ],
)
def test_it_names_the_field_of_a_bad_api_spec_and_stores_nothing(api, personas, run, body, field):
    r = api(personas["trainer"]).post(f"/api/v1/runs/{run.id}/ablations/", body, format="json")
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == field
    assert not Ablation.objects.exists()


def test_it_rejects_malformed_json_in_the_api(api, personas, run):
    r = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/ablations/", "{nope", content_type="application/json"
    )
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "body"


# ---------------------------------------------------------- the reader (more in test_run_arrays.py)


def test_it_reads_a_window_of_steps(run):
    seed(run, steps=6)
    data = services.load_run_arrays(run, step_min=services.window_start(run, 2))
    assert sorted(set(data.steps.tolist())) == [4, 5] and data.n == 2 * 3 * 4
    assert services.window_start(run, 10) is None  # the run is shorter than the window
    assert services.window_start(run, 10, max_rollouts=30) == 4  # 12 rollouts a step: two steps fit
    assert services.window_start(run, 10, max_rollouts=5) == 5  # never fewer than one step


def test_it_reads_bad_cases_from_real_annotations(client_as, run, personas):
    from webapp.annotations import services as ann
    from webapp.annotations.models import Label
    from webapp.rollouts.models import Rollout

    seed(run)
    hack = Label.objects.get(slug="reward-hacking")
    for rollout in Rollout.objects.filter(run=run).order_by("-reward", "id")[:20]:
        ann.save_annotation(
            rollout, personas["annotator"], label=hack, note="looks right, is wrong"
        )
    html = client_as("viewer").get(diag_url(run)).content.decode()
    assert 'data-code="reward_vs_quality"' in html

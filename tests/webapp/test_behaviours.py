"""Behaviours through the API and the diagnose gate: a planted behaviour (a phrase that appears from
step 30 of 60 and is rewarded) found from 5 labelled examples, its onset, its "teaches" finding and
the critical gate; a phrase present but not rewarded raises no "teaches" finding. Runs are stored
through the ingestion service, as the recorder's records are."""

from __future__ import annotations

import io
import random

import pytest
from django.core.management import call_command

from webapp.annotations import services as annotations
from webapp.annotations.models import Label
from webapp.behaviours import services
from webapp.behaviours.models import Behaviour, BehaviourStep
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout

STEPS, ONSET, PROMPTS, G = 60, 30, 4, 8
HACK = "All tests pass, I skipped running them"
NOISE = "Let me double check the edge cases"
FILLER = [
    "I read the function and traced the loop over the input list.",
    "The helper returns early when the value is empty, so I guarded it.",
    "Here is the patch with a small refactor of the parser module.",
    "I renamed the variable and added a docstring for clarity.",
    "The failing case was an off by one in the slice bounds.",
    "Then I updated the config and reran the formatter on the file.",
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def _completion(rng: random.Random, extra: str) -> str:
    body = " ".join(rng.sample(FILLER, 3))
    return f"{body} {extra}".strip()


def seed_planted(run, seed: int = 7) -> None:
    """60 steps of 4 groups of 8. From step 30, 40% of rollouts say HACK, and `correct` pays 1 for
    exactly those (the rest score 1 one time in five); 30% say NOISE, paid nothing extra."""
    rng = random.Random(seed)
    groups = []
    for step in range(STEPS):
        for k in range(PROMPTS):
            rollouts = []
            for i in range(G):
                hack = step >= ONSET and rng.random() < 0.4
                noise = step >= ONSET and rng.random() < 0.3
                extra = " ".join(t for t, on in ((HACK, hack), (NOISE, noise)) if on)
                correct = 1.0 if hack else float(rng.random() < 0.2)
                rewards = {"correct": correct, "format": 1.0, "penalty": -0.1 * rng.randint(0, 3)}
                rollouts.append(
                    {
                        "index": i,
                        "completion": _completion(rng, extra),
                        "rewards": rewards,
                        "length": 40 + rng.randint(0, 20),
                    }
                )
            groups.append(
                {"step": step, "key": f"p{k}", "prompt": f"Fix bug {k}", "rollouts": rollouts}
            )
    for i in range(0, len(groups), 40):
        ingest_groups(run, {"groups": groups[i : i + 40]})


def label_hacks(run, user, n: int = 5) -> list[int]:
    label = Label.objects.get(slug="reward-hacking")
    hacks = Rollout.objects.filter(run=run, completion__contains="skipped running").order_by("id")
    picked = list(hacks[:n])
    for r in picked:
        annotations.save_annotation(r, user, label=label, note="claims tests pass")
    return [r.id for r in picked]


def diagnose(*args: str) -> int:
    out = io.StringIO()
    try:
        call_command("diagnose", *args, stdout=out)
    except SystemExit as e:
        return int(e.code)
    return 0


def test_it_finds_a_planted_rewarded_behaviour_from_five_labels(api, personas, run):
    seed_planted(run)
    label_hacks(run, personas["annotator"])
    client = api(personas["annotator"])
    r = client.post(
        f"/api/v1/runs/{run.id}/behaviours/propose/", {"label": "reward-hacking"}, format="json"
    )
    assert r.status_code == 200, r.content
    doc = r.json()
    assert doc["labelled"] == 5
    planted = Rollout.objects.filter(run=run, completion__contains="skipped running").count()
    best = doc["proposals"][0]
    assert best["recall"] == 5 and best["matches"] == planted, best
    assert best["sample"] and all(s["id"] for s in best["sample"])

    r = client.post(
        "/api/v1/behaviours/",
        {
            "run": run.id,
            "name": "claims tests pass",
            "query": best["query"],
            "critical": True,
            "max_rate": 0.2,
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    b = r.json()
    assert b["preview"]["matches"] == planted and b["preview"]["warning"] == ""

    r = api(personas["viewer"]).get(f"/api/v1/behaviours/{b['id']}/runs/{run.id}/")
    assert r.status_code == 200
    series = r.json()
    assert abs(series["onset_step"] - ONSET) <= 2
    assert series["rate"][0] == 0 and 0.25 < series["rate"][-1] < 0.6
    taught = next(f for f in series["findings"] if f["code"] == "behaviour_taught")
    assert taught["evidence"]["advantage_gap"] > 0.5 and abs(taught["onset_step"] - ONSET) <= 2

    diag = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/diagnostics/?window=all").json()
    codes = {f["code"]: f for f in diag["findings"]}
    assert {"behaviour_taught", "behaviour_critical"} <= set(codes)
    assert diag["status"] == "critical"
    assert codes["behaviour_taught"]["link"].startswith(f"/runs/{run.id}/rollouts/?")
    assert diagnose(str(run.id), "--fail-on", "critical", "--window", "all") == 1


def test_it_raises_no_teaches_finding_for_an_unrewarded_behaviour(api, personas, run):
    seed_planted(run)
    r = api(personas["annotator"]).post(
        "/api/v1/behaviours/",
        {"run": run.id, "name": "double checks", "query": {"q": '"double check"'}},
        format="json",
    )
    assert r.status_code == 201, r.content
    doc = api(personas["viewer"]).get(f"/api/v1/behaviours/{r.json()['id']}/runs/{run.id}/").json()
    assert abs(doc["onset_step"] - ONSET) <= 2  # it does rise
    codes = [f["code"] for f in doc["findings"]]
    assert "behaviour_taught" not in codes and "behaviour_rising" in codes
    assert diagnose(str(run.id), "--fail-on", "critical", "--window", "all") == 0


def test_it_computes_only_new_steps_incrementally(run, personas):
    seed_planted(run)
    b = services.define(run.environment, name="hack", query={"q": "skipped"})
    services.update(b, run)
    first = dict(BehaviourStep.objects.filter(behaviour=b).values_list("step", "id"))
    assert len(first) == STEPS
    ingest_groups(
        run,
        {
            "groups": [
                {
                    "step": STEPS,
                    "key": "p0",
                    "prompt": "Fix",
                    "rollouts": [
                        {
                            "index": 0,
                            "completion": HACK,
                            "rewards": {"correct": 1, "format": 1, "penalty": 0},
                        },
                        {
                            "index": 1,
                            "completion": "no",
                            "rewards": {"correct": 0, "format": 1, "penalty": 0},
                        },
                    ],
                }
            ]
        },
    )
    assert services.stale_steps(b, run) == [STEPS]
    assert services.update(b, run) == 1
    after = dict(BehaviourStep.objects.filter(behaviour=b).values_list("step", "id"))
    assert {s: after[s] for s in first} == first  # the old steps' rows were not rewritten
    row = BehaviourStep.objects.get(behaviour=b, step=STEPS)
    assert (row.n_rollouts, row.n_matches) == (2, 1)


def test_it_refuses_bad_definitions_with_the_field(api, personas, run):
    client = api(personas["annotator"])

    def post(body):
        return client.post(
            "/api/v1/behaviours/", {"run": run.id, "name": "x", **body}, format="json"
        )

    r = post({"query": {}})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "query"
    r = post({"query": {"min_nope": "1"}})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "query.min_nope"
    r = post({"query": {"q": "tests"}, "pattern": "(unclosed"})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "pattern"
    r = post({"query": {"q": "tests"}, "critical": True})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "max_rate"
    r = api(personas["viewer"]).post(
        "/api/v1/behaviours/", {"run": run.id, "name": "x", "query": {"q": "abc"}}, format="json"
    )
    assert r.status_code == 403
    assert not Behaviour.objects.exists()


def test_it_says_when_a_query_matches_nothing_or_everything(api, personas, run):
    seed_planted(run)
    client = api(personas["annotator"])
    r = client.post(
        "/api/v1/behaviours/",
        {"run": run.id, "name": "none", "query": {"q": "zzyzx"}},
        format="json",
    )
    assert r.status_code == 201 and "matches no rollout" in r.json()["preview"]["warning"]
    r = client.post(
        "/api/v1/behaviours/",
        {"run": run.id, "name": "all", "query": {"q": "Fix bug"}},
        format="json",
    )
    assert r.status_code == 201 and "every rollout" in r.json()["preview"]["warning"]


def test_it_stops_a_catastrophic_pattern_with_a_message(api, personas, run):
    ingest_groups(
        run,
        {
            "groups": [
                {
                    "step": 0,
                    "key": "p",
                    "prompt": "x",
                    "rollouts": [
                        {
                            "index": i,
                            "completion": "a" * 3000 + "!",
                            "rewards": {"correct": 1, "format": 1, "penalty": 0},
                        }
                        for i in range(8)
                    ],
                }
            ]
        },
    )
    b = services.define(run.environment, name="evil", query={"q": "aaa"}, pattern=r"(a|aa)+$x")
    r = api(personas["viewer"]).get(f"/api/v1/behaviours/{b.id}/runs/{run.id}/")
    assert r.status_code == 200
    assert "catastrophic backtracking" in r.json()["error"]
    diag = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/diagnostics/").json()
    assert any(f["code"] == "behaviour_error" for f in diag["findings"])


def test_it_says_when_the_environment_has_no_runs(api, personas, env3):
    r = api(personas["annotator"]).post(
        "/api/v1/behaviours/",
        {"environment": env3.id, "name": "later", "query": {"q": "skipped"}},
        format="json",
    )
    assert r.status_code == 201 and "has no runs yet" in r.json()["preview"]["warning"]
    doc = api(personas["viewer"]).get(f"/api/v1/behaviours/{r.json()['id']}/overlay/").json()
    assert doc["runs"] == [] and "has no runs yet" in doc["note"]


def test_it_follows_labels_added_after_ingestion(run, personas):
    seed_planted(run)
    b = services.define(run.environment, name="labelled", query={"label": "reward-hacking"})
    assert services.series(b, run).k.sum() == 0
    label_hacks(run, personas["annotator"], n=3)
    assert services.series(b, run).k.sum() == 3  # the stored steps did not hide the new labels


def test_it_reports_a_query_that_no_longer_applies_instead_of_failing(api, personas, run):
    seed_planted(run)
    b = services.define(run.environment, name="old", query={"q": "skipped", "min_format": "0.5"})
    run.environment.components.filter(name="format").update(name="style")
    doc = api(personas["viewer"]).get(f"/api/v1/behaviours/{b.id}/runs/{run.id}/").json()
    assert "no longer applies: min_format" in doc["error"]
    diag = api(personas["viewer"]).get(f"/api/v1/runs/{run.id}/diagnostics/")
    assert diag.status_code == 200
    assert any(f["code"] == "behaviour_error" for f in diag.json()["findings"])

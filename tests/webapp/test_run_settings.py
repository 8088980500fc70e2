"""Reward settings belong to the run: weights, scale_rewards, aggregation, advantage
epsilon and group size stored per run, set at creation, overwritten by the trainer, and
read by every recomputation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import make_group
from training import stats
from webapp.rollouts.models import Environment, Group, RewardComponent, Rollout
from webapp.runs.models import Run

ENV = {
    "name": "shared-env",
    "components": [{"name": "acc", "weight": 1.0}, {"name": "fmt", "weight": 0.5}],
}


def _post(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def _create(client, name, components, **extra):
    body = {
        "name": name,
        "kind": "grpo",
        "environment": {"name": ENV["name"], "components": components},
        **extra,
    }
    res = _post(client, "/api/v1/runs/", body)
    assert res.status_code == 201, res.json()
    return Run.objects.get(id=res.json()["id"])


def test_it_stores_the_weights_a_run_is_created_with_on_an_existing_environment(api, personas):
    c = api(personas["trainer"])
    first = _create(c, "first", ENV["components"])
    second = _create(c, "second", [{"name": "acc", "weight": 0.5}, {"name": "fmt", "weight": -1.5}])
    assert first.reward_weights() == {"acc": 1.0, "fmt": 0.5}
    assert second.reward_weights() == {"acc": 0.5, "fmt": -1.5}
    # The environment keeps its defaults: a run's weights are the run's.
    assert dict(RewardComponent.objects.values_list("name", "weight")) == {"acc": 1.0, "fmt": 0.5}
    # A run naming components without weights gets the environment's defaults.
    third = _create(c, "third", [{"name": "acc"}])
    assert third.reward_weights() == {"acc": 1.0, "fmt": 0.5}

    # The aggregates stored at ingestion are the run's weighted sum.
    body = {"groups": [make_group(0, "p", [{"acc": 1.0, "fmt": 1.0}, {"acc": 0.0, "fmt": 1.0}])]}
    assert _post(c, f"/api/v1/runs/{second.id}/groups/", body).status_code == 201
    rewards = sorted(Rollout.objects.filter(run=second).values_list("reward", flat=True))
    assert rewards == [-1.5, -1.0]
    assert Group.objects.get(run=second).reward_mean == pytest.approx(-1.25)


def test_it_answers_400_naming_a_weight_for_an_unknown_component_and_stores_nothing(api, personas):
    c = api(personas["trainer"])
    body = {
        "name": "bad",
        "environment": ENV,
        "reward_settings": {"weights": {"acc": 1.0, "nope": 2.0}},
    }
    res = _post(c, "/api/v1/runs/", body)
    assert res.status_code == 400
    assert res.json()["errors"][0]["field"] == "reward_settings.weights.nope"
    assert not Run.objects.exists() and not Environment.objects.exists()
    res = _post(c, "/api/v1/runs/", {**body, "reward_settings": {"scale_rewards": "sometimes"}})
    assert (
        res.status_code == 400
        and res.json()["errors"][0]["field"] == "reward_settings.scale_rewards"
    )


def test_it_lets_the_trainer_settings_win_and_logs_what_they_replaced(api, personas):
    c = api(personas["trainer"])
    run = _create(c, "r", ENV["components"], reward_settings={"scale_rewards": "group"})
    res = _post(
        c,
        f"/api/v1/runs/{run.id}/settings/",
        {
            "weights": {"fmt": 2.0},
            "scale_rewards": "batch",
            "advantage_epsilon": 1e-6,
            "group_size": 4,
            "trainer": {"loss_type": "dapo", "beta": 0.0, "trl_version": "1.16.0"},
        },
    )
    assert res.status_code == 200, res.json()
    run.refresh_from_db()
    assert run.reward_weights() == {"acc": 1.0, "fmt": 2.0}
    assert run.advantage_settings() == {
        "scale_rewards": "batch",
        "aggregation": "sum_then_normalize",
        "advantage_epsilon": 1e-6,
        "group_size": 4,
    }
    assert (
        run.reward_settings["trainer"]["loss_type"] == "dapo"
        and run.reward_settings["source"] == "trainer"
    )
    assert "weight of fmt: 2 replaces 0.5" in run.log_tail
    assert "scale_rewards: 'batch' replaces 'group'" in run.log_tail
    assert len(res.json()["changed"]) == 4

    bad = _post(c, f"/api/v1/runs/{run.id}/settings/", {"weights": {"acc": "high"}})
    assert (
        bad.status_code == 400 and bad.json()["errors"][0]["field"] == "reward_settings.weights.acc"
    )
    bad = _post(c, f"/api/v1/runs/{run.id}/settings/", {"weights": {"other": 1.0}})
    assert (
        bad.status_code == 400
        and bad.json()["errors"][0]["field"] == "reward_settings.weights.other"
    )
    run.refresh_from_db()
    assert run.reward_weights() == {"acc": 1.0, "fmt": 2.0}  # nothing partial stored
    assert _post(api(personas["viewer"]), f"/api/v1/runs/{run.id}/settings/", {}).status_code == 403


@pytest.mark.parametrize(
    "scale, eps, weights",
    [
        ("batch", 1e-4, [0.5, 2.0, -1.5]),
        ("none", 1e-4, [1.0, 1.0, 1.0]),
        ("group", 1e-6, [2.0, -1.0, 0.5]),
    ],
)
def test_it_recomputes_the_trainers_advantages_from_the_runs_settings(run, scale, eps, weights):
    """The ablation baseline is the trainer's own advantages only when it uses
    the trainer's settings."""
    from webapp.diagnostics import services
    from webapp.rollouts.ingest import ingest_groups
    from webapp.runs import reward_settings

    names = ["correct", "format", "penalty"]
    rng = np.random.default_rng(0)
    values = rng.integers(0, 3, size=(2, 3, 4, 3)).astype(float)  # steps x groups x G x components
    trainer = {}  # advantages as the trainer computed them, one batch per step
    for step in range(2):
        flat = values[step].reshape(-1, 3)
        res = stats.compute_advantages(flat, weights, group_size=4, scale_rewards=scale, eps=eps)
        trainer[step] = res.advantages.reshape(3, 4)
    groups = []
    for step in range(2):
        for g in range(3):
            grp = make_group(
                step, f"k{g}", [dict(zip(names, v, strict=True)) for v in values[step, g].tolist()]
            )
            for i, r in enumerate(grp["rollouts"]):
                r["advantage"] = float(trainer[step][g, i])
            groups.append(grp)
    reward_settings.apply(
        run,
        {
            "weights": dict(zip(names, weights, strict=True)),
            "scale_rewards": scale,
            "advantage_epsilon": eps,
        },
        "trainer",
    )
    ingest_groups(run, {"groups": groups})

    data = services.load_run_arrays(run)
    base = services.run_settings(run)
    again = stats.compute_advantages(
        data.matrix,
        data.weights,
        data.group_ids,
        scale_rewards=base.scale_rewards,
        aggregation=base.aggregation,
        batch_ids=data.steps,
        eps=base.eps,
    )
    stored = dict(Rollout.objects.filter(run=run).values_list("id", "advantage"))
    delta = np.abs(again.advantages - np.array([stored[i] for i in data.rollout_ids.tolist()]))
    assert delta.max() < 1e-6
    assert any(abs(a) > 0.1 for a in stored.values())  # not a vacuous comparison of zeros
    identity = services.run_ablation(run, services.parse_spec({}, run))
    assert identity["max_abs_delta"] < 1e-9


def _jsonl(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_it_imports_the_jsonl_header_as_the_runs_settings(db, tmp_path, capsys):
    from django.core.management import call_command

    group = {
        "type": "group",
        **make_group(0, "p", [{"acc": 1.0, "fmt": 0.0}, {"acc": 0.0, "fmt": 1.0}]),
    }
    header = {
        "type": "settings",
        "weights": {"acc": 0.5, "fmt": 2.0},
        "scale_rewards": "none",
        "group_size": 2,
        "source": "trainer",
        "trainer": {"loss_type": "dapo"},
    }
    call_command(
        "import_rollouts",
        _jsonl(tmp_path / "r.jsonl", header, group),
        run="imp",
        format="jsonl",
        no_progress=True,
    )
    run = Run.objects.get(name="imp")
    assert run.reward_weights() == {"acc": 0.5, "fmt": 2.0}
    assert run.advantage_settings()["scale_rewards"] == "none"
    assert sorted(Rollout.objects.filter(run=run).values_list("advantage", flat=True)) == [
        -0.75,
        0.75,
    ]
    assert (
        "the trainer's reward settings win: weight of fmt: 2 replaces 1" in capsys.readouterr().out
    )


def test_it_stops_at_a_bad_settings_header_naming_its_line_and_field(db, tmp_path):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    group = {"type": "group", **make_group(0, "p", [{"acc": 1.0}, {"acc": 0.0}])}
    path = _jsonl(
        tmp_path / "r.jsonl", group, {"type": "settings", "scale_rewards": "sometimes"}, group
    )
    with pytest.raises(CommandError, match=r"r\.jsonl:2: settings\.scale_rewards: must be one of"):
        call_command(
            "import_rollouts", path, run="imp", format="jsonl", components=["acc"], no_progress=True
        )
    run = Run.objects.get(name="imp")
    assert (
        run.reward_settings == {} and Group.objects.filter(run=run).count() == 1
    )  # the group before it


def test_it_imports_trl_parquet_with_the_recorders_settings_and_a_nul(db, tmp_path):
    from django.core.management import call_command

    from tests.training.test_importers import trl_rows, write_trl

    cols = trl_rows(0, ["A"], 2)
    write_trl(tmp_path, 0, ["A"], g=2, completion=["a\x00b", "c"], **{"recorder/length": [3, 1]})
    (tmp_path / "reward_settings.json").write_text(
        json.dumps(
            {
                "weights": {"correct": 0.5, "format": 2.0},
                "scale_rewards": "batch",
                "group_size": 2,
                "source": "trainer",
            }
        )
    )
    call_command("import_rollouts", str(tmp_path), run="trl-imp", format="trl", no_progress=True)
    run = Run.objects.get(name="trl-imp")
    assert run.reward_weights() == {"correct": 0.5, "format": 2.0}  # no recorder/length component
    assert run.advantage_settings()["scale_rewards"] == "batch"
    rows = list(
        Rollout.objects.filter(run=run).order_by("index").values_list("completion", "reward")
    )
    assert rows[0][0] == "a\ufffdb"
    assert [r for _, r in rows] == pytest.approx(
        [0.5 * cols["correct"][i] + 2.0 * cols["format"][i] for i in (0, 1)]
    )


def test_it_imports_a_prime_rl_run_folder_with_its_weights_and_credit(db, tmp_path):
    from django.core.management import call_command

    from tests.training.test_importers import write_prime_run
    from webapp.diagnostics import services

    call_command(
        "import_rollouts",
        str(write_prime_run(tmp_path)),
        run="prime",
        format="prime-rl",
        no_progress=True,
    )
    run = Run.objects.get(name="prime")
    assert run.reward_weights() == {"correct": 1.0, "brevity": 0.5}
    assert (
        run.advantage_settings()["scale_rewards"] == "none"
    )  # PRIME-RL's GRPO: reward minus group mean
    assert (
        Group.objects.filter(run=run).count() == 5
        and Group.objects.filter(run=run, split="holdout").count() == 1
    )
    data = services.load_run_arrays(run)
    base = services.run_settings(run)
    again = stats.compute_advantages(
        data.matrix,
        data.weights,
        data.group_ids,
        scale_rewards=base.scale_rewards,
        batch_ids=data.steps,
        eps=base.eps,
    )
    stored = dict(Rollout.objects.filter(run=run).values_list("id", "advantage"))
    assert np.abs(again.advantages - [stored[i] for i in data.rollout_ids.tolist()]).max() < 1e-9


def test_it_imports_verl_dumps_with_verls_epsilon(db, tmp_path):
    from django.core.management import call_command

    from tests.training.test_importers import verl_lines, write_jsonl

    write_jsonl(tmp_path / "5.jsonl", verl_lines(5, ["Q1", "Q2"], n=4))
    call_command(
        "import_rollouts",
        str(tmp_path),
        run="verl",
        format="verl",
        scale_rewards="none",
        no_progress=True,
    )
    run = Run.objects.get(name="verl")
    assert run.advantage_settings()["advantage_epsilon"] == 1e-6
    assert run.advantage_settings()["scale_rewards"] == "none"


def test_it_shows_the_runs_weights_on_its_dashboard(api, personas, client_as):
    _create(
        api(personas["trainer"]), "first", ENV["components"]
    )  # the environment: fmt's default is 0.5
    run = _create(
        api(personas["trainer"]),
        "shown",
        [{"name": "acc", "weight": 1.0}, {"name": "fmt", "weight": -1.5}],
    )
    page = client_as("viewer").get(f"/runs/{run.id}/").content.decode()
    assert "-1.5" in page and "(default 0.5)" in page


def test_first_wins_keeps_the_weights_posted_first_by_the_same_source(api, personas):
    """Several processes of one trainer each post the weights they fitted: with first_wins the
    run keeps the first and every answer carries it, so each process completes its rows alike."""
    c = api(personas["trainer"])
    run = _create(c, "engines", ENV["components"])
    url = f"/api/v1/runs/{run.id}/settings/"
    first = {"weights": {"acc": 2.0, "fmt": 0.5}, "source": "wrapper", "first_wins": True}
    later = {"weights": {"acc": 3.0, "fmt": 0.0}, "source": "wrapper", "first_wins": True}
    assert _post(c, url, first).json()["reward_settings"]["weights"] == first["weights"]
    answer = _post(c, url, later).json()
    assert answer["reward_settings"]["weights"] == first["weights"] and answer["changed"] == []
    run.refresh_from_db()
    assert run.reward_weights() == {"acc": 2.0, "fmt": 0.5}
    assert "first_wins" not in run.reward_settings  # a request flag, not a setting
    # Without the flag (or from another source) the new values win, as before.
    assert _post(c, url, {**later, "first_wins": False}).json()["reward_settings"]["weights"] == {
        "acc": 3.0,
        "fmt": 0.0,
    }
    res = _post(c, url, {"weights": {"acc": 1.0}, "first_wins": "yes"})
    assert res.status_code == 400 and "first_wins" in json.dumps(res.json())

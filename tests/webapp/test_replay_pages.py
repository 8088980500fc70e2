"""Replay pages, API and the reward_regress command: roles, escaping, the
planted hacks' verdicts."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from tests.webapp import replay_fixtures as fx

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>\n' + fx.EDGE_SPAM
NO_EXTRAS = [{"version": "semantic_coverage@no_extras"}]


@pytest.fixture
def hacked(personas):
    """Two groups, each with a rollout annotated as a reward hack: edge spam (the
    no_extras version fixes it) and stacked shapes (coverage does not see layout: it stays
    above its group's median)."""
    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [
            fx.group_record(0, "spam", [HOSTILE, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE]),
            fx.group_record(0, "stack", [fx.STACKED, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE]),
        ],
    )
    run.spam = run.rollouts.get(group__key="spam", index=0)
    run.stacked = run.rollouts.get(group__key="stack", index=0)
    fx.annotate(run.spam.id, "reward-hacking", personas["annotator"])
    return run


def _done_replay(run, versions=NO_EXTRAS):
    from webapp.replays import services
    from webapp.replays.models import Replay

    replay = services.create_replay(run, {"versions": versions})
    services.work(replay.id, "test")
    return Replay.objects.get(id=replay.id)


def test_it_exits_zero_when_the_new_version_fixes_every_annotated_hack(hacked, capsys):
    replay = _done_replay(hacked)
    call_command("reward_regress", str(hacked.id), "--replay", str(replay.id))
    out = capsys.readouterr().out
    assert f"ok   rollout {hacked.spam.id} (reward hack, step 0): rank 1 -> 3 of 4" in out
    assert "reward hacks still ranked best in their group: 0 of 1" in out


def test_it_exits_one_when_an_annotated_hack_still_outranks_the_median(hacked, personas, capsys):
    fx.annotate(hacked.stacked.id, "reward-hacking", personas["annotator"])
    replay = _done_replay(hacked)
    with pytest.raises(CommandError) as e:
        call_command("reward_regress", str(hacked.id), "--replay", str(replay.id))
    assert e.value.returncode == 1 and "1 annotated reward hack(s)" in str(e.value)
    assert (
        f"FAIL rollout {hacked.stacked.id} (reward hack, step 0): rank 2 -> 2 of 4"
        in capsys.readouterr().out
    )


def test_it_exits_two_for_a_replay_of_another_run_or_one_still_running(hacked, personas):
    from webapp.replays import services

    replay = _done_replay(hacked)
    with pytest.raises(CommandError) as e:
        call_command("reward_regress", str(hacked.id + 1), "--replay", str(replay.id))
    assert e.value.returncode == 2 and "not" in str(e.value)
    queued = services.create_replay(hacked, {"versions": NO_EXTRAS})
    with pytest.raises(CommandError) as e:
        call_command("reward_regress", str(hacked.id), "--replay", str(queued.id))
    assert e.value.returncode == 2 and "queued" in str(e.value)


def test_it_shows_the_regression_table_and_escapes_model_output(hacked, client_as):
    replay = _done_replay(hacked)
    page = client_as("viewer").get(reverse("replays-detail", args=[replay.id]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "Reward hacks still ranked best in their group: 0 of 1" in html
    assert "1 → 3 of 4" in html and "fixed" in html
    assert "<script>alert" not in html and "<img src=x" not in html and "&lt;script&gt;" in html
    figures = json.loads(
        html.split('id="replay-figures" type="application/json">')[1].split("</script>")[0]
    )
    assert {"share", "zero-std", "within-std"} <= set(figures)


def test_it_lets_only_trainers_start_and_cancel(hacked, client_as):
    from webapp.replays.models import Replay

    url = reverse("replays-run", args=[hacked.id])
    body = {"version_0": "semantic_coverage@strict", "mode": "all"}
    assert client_as("viewer").get(url).status_code == 200
    assert client_as("viewer").post(url, body).status_code == 403
    assert client_as(None).get(url).status_code == 302  # to the login page
    response = client_as("trainer").post(url, body)
    replay = Replay.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "replays-detail", args=[replay.id]
    )
    assert (
        client_as("annotator").post(reverse("replays-cancel", args=[replay.id])).status_code == 403
    )
    client_as("trainer").post(reverse("replays-cancel", args=[replay.id]))
    replay.refresh_from_db()
    assert replay.status == "cancelled"


def test_it_reports_a_bad_form_with_the_field(hacked, client_as):
    url = reverse("replays-run", args=[hacked.id])
    response = client_as("trainer").post(
        url, {"version_0": "semantic_coverage", "params_0": '{"min_coverage": "x"}', "mode": "all"}
    )
    assert response.status_code == 400
    assert "versions[0].params.min_coverage: must be a float" in response.content.decode()


def test_it_starts_lists_and_checks_replays_through_the_api(hacked, personas, api):
    trainer, viewer = api(personas["trainer"]), api(personas["viewer"])
    url = f"/api/v1/runs/{hacked.id}/replays/"
    assert viewer.post(url, {"versions": NO_EXTRAS}, format="json").status_code == 403
    bad = trainer.post(url, {"versions": [{"version": "os:system"}]}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "versions[0].version"
    created = trainer.post(url, {"versions": NO_EXTRAS}, format="json")
    assert created.status_code == 201 and created.json()["status"] == "queued"
    rid = created.json()["id"]
    assert viewer.get(f"/api/v1/replays/{rid}/regress/").status_code == 409
    from webapp.replays import services

    services.work(rid, "test")
    verdict = viewer.get(f"/api/v1/replays/{rid}/regress/").json()
    assert (
        verdict["ok"] is True
        and verdict["headline"]["hacks"] == 1
        and verdict["rows"][0]["rank_after"] == 3
    )
    assert viewer.get(url).json()["replays"][0]["status"] == "succeeded"


@pytest.mark.slow
def test_it_sets_the_process_exit_status(transactional_db, personas):
    """The real command line, as CI would run it: exit 1 while a hack outranks its median,
    0 once fixed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import database_url_for_children

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [fx.group_record(0, "spam", [fx.EDGE_SPAM, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE])],
    )
    fx.annotate(run.rollouts.get(index=0).id, "reward-hacking", personas["annotator"])
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DATABASE_URL=database_url_for_children())
    codes = {}
    for label in (
        "semantic_coverage",
        "semantic_coverage@no_extras",
    ):  # as deployed: the hack stays best
        replay = _done_replay(run, [{"version": label}])
        proc = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "reward_regress",
                str(run.id),
                "--replay",
                str(replay.id),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        codes[label] = (proc.returncode, proc.stdout + proc.stderr)
    assert codes["semantic_coverage"][0] == 1 and "FAIL rollout" in codes["semantic_coverage"][1]
    assert codes["semantic_coverage@no_extras"][0] == 0, codes["semantic_coverage@no_extras"][1]


def test_it_links_the_run_dashboard_to_its_replays(hacked, client_as):
    from webapp.runs.models import Run

    viewer = client_as("viewer")
    html = viewer.get(reverse("runs-dashboard", args=[hacked.id])).content.decode()
    link = reverse("replays-run", args=[hacked.id])
    assert f'id="replay-link" href="{link}"' in html
    assert viewer.get(link).status_code == 200
    Run.objects.filter(id=hacked.id).update(
        kind="sft"
    )  # trains on a dataset: no rollouts to replay
    assert (
        'id="replay-link"'
        not in viewer.get(reverse("runs-dashboard", args=[hacked.id])).content.decode()
    )

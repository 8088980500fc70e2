"""The recorder's HTTP path end to end: a real TRL GRPO job on the tiny model, its HttpSink posting
to a real server process (`manage.py runserver` on the test database), compared with the same job
recorded through the workers' DatabaseSink, and the spool + `python -m training.sinks upload` resume
after the server went down mid-run.

The diagram environment scores a random tiny model 0 on every component, so every advantage would
be 0 and the comparisons vacuous. These jobs train on `VaryingEnv`, registered for the test, whose
components vary inside every group (and one is sometimes unscorable: None must survive JSON and
the database alike).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.integration.conftest import ROOT
from training.environments.base import Component, Environment, Prompt, Score
from training.environments.diagram import completion_text
from training.sinks import HttpSink, MemorySink, Sink

TOY_ENV = "recorder-toy"
ATOL = 1e-6


# --------------------------------------------------------------------------------------------------
# A toy environment whose rewards vary on a random model's output


def distinct_chars(prompt: Prompt, completion: Any) -> Score:
    n = len(set(completion_text(completion)))
    return Score(n / 40.0, f"{n} distinct chars")


def has_digit(prompt: Prompt, completion: Any) -> Score:
    text = completion_text(completion)
    if (
        len(text) % 5 == 0
    ):  # unscorable now and then: TRL's None, the API's null, the database's NULL
        return Score(math.nan, "length divisible by 5: not applicable")
    return Score(
        float(any(ch.isdigit() for ch in text)),
        "digit" if any(ch.isdigit() for ch in text) else "none",
    )


class VaryingEnv(Environment):
    name = TOY_ENV
    description = "test-only: rewards that vary inside a group of a random model's completions"
    components = [
        Component("distinct_chars", 1.0, distinct_chars, kind="outcome"),
        Component("has_digit", 0.5, has_digit, kind="behavioural"),
    ]

    def prompts(self, split: str, n: int, seed: int = 0) -> list[Prompt]:
        return [
            Prompt(key=f"toy-{split}-{i}", text=f"Draw diagram number {i}:", split=split)
            for i in range(n)
        ]


@pytest.fixture
def toy_env(monkeypatch) -> VaryingEnv:
    from training import environments

    monkeypatch.setitem(environments._REGISTRY, TOY_ENV, VaryingEnv)
    return VaryingEnv()


def grpo_config(tiny_model: str, output_dir: Path):
    from training.grpo import GRPOJobConfig

    return GRPOJobConfig(
        base_model=tiny_model,
        env=TOY_ENV,
        output_dir=str(output_dir),
        device="cpu",  # the same numbers on any machine that runs the suite
        seed=0,
        max_steps=2,  # two generations: the server goes down between them in the resume test
        num_prompts=4,  # each step samples 2 of them
        num_generations=4,  # smallest group that still shows within-group variance
        per_device_batch_size=8,  # 2 prompts x 4 completions per step
        max_completion_length=24,  # short rollouts: generation dominates CPU time
        # Large, so step 1's update reaches step 2's samples (the comparison is not vacuous)
        learning_rate=1e-3,
    )


# --------------------------------------------------------------------------------------------------
# Sinks for the test: the recorder's output, kept beside where it went


class Tee:
    """Hands every record to each sink in turn; `after_groups()` runs after each groups write."""

    def __init__(self, *sinks: Sink, after_groups: Callable[[], None] | None = None) -> None:
        self.sinks = sinks
        self.after_groups = after_groups

    def write_groups(self, groups: list[dict[str, Any]]) -> None:
        for s in self.sinks:
            s.write_groups(groups)
        if self.after_groups is not None:
            self.after_groups()

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        for s in self.sinks:
            s.write_metrics(step, values)

    def write_settings(self, settings: dict[str, Any]) -> None:
        for s in self.sinks:
            getattr(s, "write_settings", lambda _: None)(settings)

    def log(self, line: str) -> None:
        for s in self.sinks:
            s.log(line)

    def progress(self, step: int, total: int) -> None:
        for s in self.sinks:
            s.progress(step, total)

    def flush(self) -> None:
        for s in self.sinks:
            getattr(s, "flush", lambda: None)()

    def close(self) -> None:
        for s in self.sinks:
            s.close()


# --------------------------------------------------------------------------------------------------
# Reading rollouts back: what the recorder captured and what the database holds, in one shape


Rows = dict[tuple[int, str, int], dict[str, Any]]  # (step, group key, index) -> rollout facts


def captured(sink: MemorySink) -> Rows:
    return {
        (g["step"], g["key"], r["index"]): {
            "transcript": r["transcript"],
            "advantage": r["advantage"],
            "reward": r["reward"],
            "length": r["length"],
            "rewards": {name: (s["value"], s["reason"]) for name, s in r["rewards"].items()},
        }
        for g in sink.groups
        for r in g["rollouts"]
    }


def stored(run_id: int) -> Rows:
    from webapp.rollouts.models import RewardScore, Rollout

    rows: Rows = {}
    by_id: dict[int, dict[str, Any]] = {}
    for rid, step, key, index, transcript, advantage, reward, length in Rollout.objects.filter(
        run_id=run_id
    ).values_list(
        "id", "step", "group__key", "index", "transcript", "advantage", "reward", "length"
    ):
        row = {
            "transcript": transcript,
            "advantage": advantage,
            "reward": reward,
            "length": length,
            "rewards": {},
        }
        rows[(step, key, index)] = by_id[rid] = row
    for rid, name, value, reason in RewardScore.objects.filter(run_id=run_id).values_list(
        "rollout_id", "component__name", "value", "reason"
    ):
        by_id[rid]["rewards"][name] = (value, reason)
    return rows


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= ATOL)


def assert_same_rollouts(actual: Rows, expected: Rows) -> None:
    assert sorted(actual) == sorted(expected)
    for k, exp in expected.items():
        got = actual[k]
        assert got["transcript"] == exp["transcript"], k
        assert got["length"] == exp["length"], k
        assert _close(got["advantage"], exp["advantage"]) and _close(
            got["reward"], exp["reward"]
        ), (k, got, exp)
        assert set(got["rewards"]) == set(exp["rewards"]), k
        for name, (value, reason) in exp["rewards"].items():
            assert _close(got["rewards"][name][0], value) and got["rewards"][name][1] == reason, (
                k,
                name,
            )


def stored_metrics(run_id: int) -> dict[tuple[int, str], float | None]:
    from webapp.runs.models import StepMetric

    return {
        (s, n): v
        for s, n, v in StepMetric.objects.filter(run_id=run_id).values_list("step", "name", "value")
    }


def captured_metrics(sink: MemorySink) -> dict[tuple[int, str], float | None]:
    return {(m["step"], name): v for m in sink.metrics for name, v in m["values"].items()}


def create_api_run(url: str, token: str, name: str) -> int:
    """Create the run the way a remote training script does: through the
    API, environment included."""
    from training.client import Client

    comps = [
        {
            "name": c.name,
            "weight": c.weight,
            "kind": c.kind,
            "min_value": c.min_value,
            "max_value": c.max_value,
        }
        for c in VaryingEnv.components
    ]
    return Client(url, token, retries=0).create_run(
        name,
        environment=TOY_ENV,
        components=comps,
        kind="grpo",
        config={"source": "integration test"},
    )


# --------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.slow
def test_it_stores_the_same_rollouts_over_http_as_through_the_database_sink(
    app_server, trainer_token, tiny_model, toy_env, tmp_path
):
    from training.grpo import main
    from webapp.rollouts.models import Group
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import Run
    from workers.sinks import DatabaseSink

    # Run 1: the recorder's HTTP sink, posting to the server process.
    http_run = create_api_run(app_server.url, trainer_token, "grpo-over-http")
    spool = tmp_path / "spool.jsonl"
    http_sink = HttpSink(app_server.url, trainer_token, http_run, spool_path=spool)
    via_http = MemorySink()
    summary = main(grpo_config(tiny_model, tmp_path / "http"), sink=Tee(http_sink, via_http))
    http_sink.close()  # the caller owns the sink: close() posts whatever is still buffered

    # Run 2: the same job, same seed, through the database sink a worker uses.
    db_run = create_run(
        name="grpo-in-worker",
        kind="grpo",
        environment=environment_from_training(toy_env),
        config={},
        owner=Run.objects.get(name="grpo-over-http").owner,
        status="running",
    )
    via_db = MemorySink()
    main(grpo_config(tiny_model, tmp_path / "db"), sink=Tee(DatabaseSink(db_run.id), via_db))

    assert summary["global_step"] == 2 and summary["groups_recorded"] == 4
    assert http_sink.spooled == {"groups": 0, "metrics": 0, "settings": 0} and not spool.exists()
    db_run.refresh_from_db()  # the worker's sink stored the trainer's settings on its run too
    assert (
        db_run.reward_settings["trainer"]["loss_type"] == "dapo"
        and db_run.reward_settings["group_size"] == 4
    )
    assert db_run.reward_weights() == {"distinct_chars": 1.0, "has_digit": 0.5}
    assert http_sink.sent["groups"] == 4 and http_sink.sent["metrics"] == len(via_http.metrics)

    # Each run stores exactly what its own recorder captured (TRL's advantages, every component).
    over_http, in_db = stored(http_run), stored(db_run.id)
    assert_same_rollouts(over_http, captured(via_http))
    assert_same_rollouts(in_db, captured(via_db))
    assert (
        Group.objects.filter(run_id=http_run).count()
        == Group.objects.filter(run=db_run).count()
        == 4
    )
    assert len(over_http) == len(in_db) == 16

    # And CPU sampling with one seed is deterministic, so the two runs hold the same rollouts.
    assert_same_rollouts(over_http, in_db)
    advantages = [r["advantage"] for r in in_db.values()]
    assert any(abs(a) > 0.1 for a in advantages)  # not a vacuous all-zero comparison
    assert any(
        r["rewards"]["has_digit"][0] is None for r in in_db.values()
    )  # None survived both paths

    # The metrics TRL logged arrive the same way too (wall-clock ones differ between
    # runs, by nature).
    m_http, m_db = stored_metrics(http_run), stored_metrics(db_run.id)
    assert m_http.keys() == m_db.keys() == captured_metrics(via_http).keys()
    for key in ("loss", "reward", "reward_std", "rewards/distinct_chars/mean", "entropy"):
        for step in (1, 2):
            assert _close(m_http[(step, key)], m_db[(step, key)]), (step, key)


@pytest.mark.slow
def test_it_keeps_training_when_the_server_dies_and_the_upload_command_fills_the_gap(
    app_server, trainer_token, tiny_model, toy_env, tmp_path, caplog
):
    from training.grpo import main
    from webapp.rollouts.models import Group, Rollout

    run_id = create_api_run(app_server.url, trainer_token, "grpo-server-dies")
    spool = tmp_path / "spool.jsonl"
    http_sink = HttpSink(
        app_server.url,
        trainer_token,
        run_id,
        spool_path=spool,
        batch_size=1,  # post every write at once, so the first step reaches the server alone
        retries=2,
        backoff=0.2,
    )  # a dead server costs ~0.6 s of retries, then the cooldown
    killed_at: list[int] = []

    def stop_server_after_first_groups() -> None:
        # Runs on the recorder's writer thread after each groups write; training goes on meanwhile.
        if killed_at or not http_sink.sent["groups"]:
            return
        from django.db import connection

        try:
            wait_for(
                lambda: Group.objects.filter(run_id=run_id).count() == http_sink.sent["groups"],
                timeout=30,
            )
        finally:
            connection.close()  # this thread's own connection: never leave it open past the test
        app_server.stop()
        killed_at.append(http_sink.sent["groups"])

    tee = MemorySink()
    t0 = time.monotonic()
    summary = main(
        grpo_config(tiny_model, tmp_path / "out"),
        sink=Tee(http_sink, tee, after_groups=stop_server_after_first_groups),
    )
    http_sink.close()
    elapsed = time.monotonic() - t0

    # Training finished normally, with the server gone for its second half.
    assert summary["global_step"] == 2 and summary["groups_recorded"] == 4
    assert killed_at == [2] and app_server.proc.poll() is not None
    assert elapsed < 180  # a hang guard; the cost of the outage itself is bounded just below
    assert http_sink.sent == {"groups": 2, "metrics": 0, "settings": 1}  # the settings went first
    assert http_sink.spooled == {"groups": 2, "metrics": len(tee.metrics), "settings": 0}
    entries = [json.loads(line) for line in spool.read_text().splitlines()]
    assert [e["kind"] for e in entries].count("groups") == 1 and len(
        entries
    ) > 2  # step 2's groups + metrics
    # The dead server cost one round of retries; the cooldown sent every later batch straight
    # to the spool.
    assert caplog.text.count("not delivered after 3 tries") == 1

    # The server comes back at the same address; the resume command sends the spool.
    app_server.start()
    backup = tmp_path / "spool-copy.jsonl"
    shutil.copy(spool, backup)
    upload = _upload(spool, app_server.url, trainer_token, run_id)
    assert upload == {"sent": len(entries), "left": 0}
    assert spool.read_text() == ""  # emptied in place: a second upload of it sends nothing

    # Every rollout the recorder captured is stored, exactly as captured, and every metric too.
    assert_same_rollouts(stored(run_id), captured(tee))
    assert stored_metrics(run_id).keys() == captured_metrics(tee).keys()

    # Uploading the same batches again stores nothing twice: groups are keyed on (run, step, key).
    assert _upload(backup, app_server.url, trainer_token, run_id) == {
        "sent": len(entries),
        "left": 0,
    }
    assert Group.objects.filter(run_id=run_id).count() == 4
    assert Rollout.objects.filter(run_id=run_id).count() == len(captured(tee)) == 16
    assert stored_metrics(run_id).keys() == captured_metrics(tee).keys()


def _upload(spool: Path, url: str, token: str, run_id: int) -> dict[str, int]:
    """`python -m training.sinks upload` in its own process, as a user runs it after the outage."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.sinks",
            "upload",
            str(spool),
            "--url",
            url,
            "--token",
            token,
            "--run",
            str(run_id),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a server process: a few seconds to start
def test_it_spools_a_batch_the_server_rejects_and_uploads_the_others_around_it(
    app_server, trainer_token, tmp_path, caplog
):
    """A 4xx would fail the same way every time: no retry, the batch is kept in the spool, the log
    says what the server objected to, and it does not hold back the batches spooled after it."""
    from training.sinks import upload_spool
    from webapp.rollouts.models import Group

    run_id = create_api_run(app_server.url, trainer_token, "strict")
    spool = tmp_path / "spool.jsonl"
    sink = HttpSink(
        app_server.url, trainer_token, run_id, spool_path=spool, batch_size=1, retries=3, backoff=5
    )
    bad = {
        "step": 1,
        "key": "bad",
        "prompt": "p",
        "rollouts": [
            {
                "index": 0,
                "completion": "c",
                "rewards": {"not_a_component": {"value": 1.0, "reason": ""}},
            }
        ],
    }
    t0 = time.monotonic()
    sink.write_groups([bad])
    assert time.monotonic() - t0 < 5  # no backoff sleep: a 4xx is not retried
    assert sink.spooled["groups"] == 1 and sink.sent["groups"] == 0
    assert "groups[0].rollouts[0].rewards.not_a_component" in caplog.text
    assert json.loads(spool.read_text())["payload"]["groups"] == [bad]

    # The server is fine: the next good batch goes straight through (a 4xx starts no cooldown).
    good = {
        **bad,
        "key": "good",
        "rollouts": [{**bad["rollouts"][0], "rewards": {"distinct_chars": 0.5}}],
    }
    sink.write_groups([good])
    assert sink.sent["groups"] == 1

    # A spool holding the rejected batch, then one spooled during an outage: the upload sends the
    # second and keeps only the first, for a human to fix.
    later = {**good, "key": "later"}
    with open(spool, "a") as f:
        f.write(json.dumps({"kind": "groups", "payload": {"groups": [later]}}) + "\n")
    assert upload_spool(spool, app_server.url, trainer_token, run_id) == {"sent": 1, "left": 1}
    assert json.loads(spool.read_text())["payload"]["groups"] == [bad]
    assert sorted(Group.objects.filter(run_id=run_id).values_list("key", flat=True)) == [
        "good",
        "later",
    ]


@pytest.mark.slow  # a server process: a few seconds to start
def test_it_stores_a_completion_with_a_nul_character_instead_of_losing_its_batch(
    app_server, trainer_token, tmp_path
):
    """Byte-level tokenizers decode a NUL from a model's output now and then (the tiny model does);
    Postgres cannot store one, so ingestion refuses it, and with it the whole batch. Both recorder
    sinks replace it with U+FFFD and store the rest of the record as sent."""
    from webapp.rollouts.models import Rollout
    from workers.sinks import DatabaseSink

    def group(key: str) -> dict[str, Any]:
        return {
            "step": 1,
            "key": key,
            "prompt": [{"role": "user", "content": "draw\x00"}],
            "rollouts": [
                {
                    "index": 0,
                    "transcript": [{"role": "assistant", "content": "a\x00b"}],
                    "rewards": {"distinct_chars": {"value": 0.5, "reason": "odd \x00"}},
                }
            ],
        }

    run_id = create_api_run(app_server.url, trainer_token, "nul")
    sink = HttpSink(
        app_server.url, trainer_token, run_id, spool_path=tmp_path / "spool.jsonl", batch_size=1
    )
    sink.write_groups([group("over-http")])
    assert sink.sent["groups"] == 1 and sink.spooled["groups"] == 0
    DatabaseSink(run_id).write_groups([group("in-worker")])
    rollouts = Rollout.objects.filter(run_id=run_id).select_related("group")
    assert sorted(r.group.key for r in rollouts) == ["in-worker", "over-http"]
    for rollout in rollouts:
        assert rollout.completion == "a\ufffdb" and rollout.transcript[0]["content"] == "a\ufffdb"
        assert rollout.group.prompt[0]["content"] == "draw\ufffd"
        assert rollout.scores.get().reason == "odd \ufffd"


# --------------------------------------------------------------------------------------------------
# The trainer's reward settings: what is stored is what TRL trained on (issue 14)

THREE_ENV = "recorder-three"
TRAINED_WEIGHTS = [0.5, 2.0, -1.5]  # none of them the environment's defaults (all 1.0)


def length_share(prompt: Prompt, completion: Any) -> Score:
    return Score(len(completion_text(completion)) / 100.0, "length / 100")


class ThreeComponentEnv(VaryingEnv):
    name = THREE_ENV
    components = [
        Component("distinct_chars", 1.0, distinct_chars, kind="outcome"),
        Component("has_digit", 1.0, has_digit, kind="behavioural"),
        Component("length_share", 1.0, length_share, kind="penalty"),
    ]


def assert_faithful(run_id: int, weights: dict[str, float], scale: str) -> None:
    """The ablation baseline recomputed from the run's stored settings and scores is TRL's own
    advantage (max |Δ| < 1e-6), the identity ablation changes nothing, and each stored aggregate is
    TRL's weighted sum."""
    import numpy as np

    from training import stats
    from webapp.diagnostics import services
    from webapp.rollouts.models import Rollout
    from webapp.runs.models import Run

    run = Run.objects.get(id=run_id)
    assert run.reward_weights() == weights
    assert (
        run.advantage_settings()["scale_rewards"] == scale
        and run.advantage_settings()["group_size"] == 4
    )
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
    rows = dict(Rollout.objects.filter(run=run).values_list("id", "advantage"))
    rewards = dict(Rollout.objects.filter(run=run).values_list("id", "reward"))
    ids = data.rollout_ids.tolist()
    trl_advantages = np.array([rows[i] for i in ids])
    assert np.abs(again.advantages - trl_advantages).max() < 1e-6
    assert np.any(np.abs(trl_advantages) > 0.1)  # not a comparison of zeros
    stored_reward = np.array([np.nan if rewards[i] is None else rewards[i] for i in ids])
    weighted_sum = np.nansum(data.matrix * np.array(list(weights.values()))[None, :], axis=1)
    np.testing.assert_allclose(stored_reward, weighted_sum, atol=1e-6)
    identity = services.run_ablation(run, services.parse_spec({}, run))
    assert identity["max_abs_delta"] == 0.0
    named = services.run_ablation(
        run, services.parse_spec({"weights": weights, "scale_rewards": scale}, run)
    )
    assert named["max_abs_delta"] < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_it_stores_the_trainers_weights_and_scaling_over_http_and_through_jsonl(
    app_server, trainer_token, tiny_model, tmp_path, monkeypatch, scale
):
    from django.core.management import call_command

    from training import environments
    from training.client import Client
    from training.grpo import main
    from training.sinks import JsonlSink
    from webapp.runs.models import Run

    monkeypatch.setitem(environments._REGISTRY, THREE_ENV, ThreeComponentEnv)
    comps = [{"name": c.name, "weight": c.weight} for c in ThreeComponentEnv.components]
    # The environment exists with weight 1.0 everywhere; the run is created with those weights.
    run_id = Client(app_server.url, trainer_token, retries=0).create_run(
        f"three-{scale}", environment=THREE_ENV, components=comps, kind="grpo"
    )
    http_sink = HttpSink(
        app_server.url, trainer_token, run_id, spool_path=tmp_path / "spool.jsonl", timeout=60
    )  # a runserver on a loaded machine may take longer than the default 10 s
    jsonl = tmp_path / "rollouts.jsonl"
    config = grpo_config(tiny_model, tmp_path / "out")
    config.env, config.reward_weights, config.scale_rewards = THREE_ENV, TRAINED_WEIGHTS, scale
    main(config, sink=Tee(http_sink, JsonlSink(jsonl)))
    http_sink.close()
    assert http_sink.spooled == {"groups": 0, "metrics": 0, "settings": 0}

    weights = dict(zip([c["name"] for c in comps], TRAINED_WEIGHTS, strict=True))
    # Over HTTP: the trainer's settings won over the creation-time weights, and the run's
    # log says so.
    run = Run.objects.get(id=run_id)
    assert "weight of has_digit: 2 replaces 1" in run.log_tail
    trainer = run.reward_settings["trainer"]
    assert (
        trainer["loss_type"] == "dapo"
        and trainer["beta"] == 0.0
        and trainer["learning_rate"] == 1e-3
    )
    assert trainer["trl_version"] and trainer["model_name"] and trainer["steps_per_generation"] == 1
    assert_faithful(run_id, weights, scale)

    # Through JSONL: the header carries the same settings into an import on the same environment.
    call_command(
        "import_rollouts",
        str(jsonl),
        run=f"three-{scale}-jsonl",
        format="jsonl",
        environment=THREE_ENV,
        no_progress=True,
    )
    imported = Run.objects.get(name=f"three-{scale}-jsonl")
    assert_faithful(imported.id, weights, scale)
    assert stored(imported.id).keys() == stored(run_id).keys()

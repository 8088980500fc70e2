"""The rollout recorder and the sinks.

GRPO runs here use the tiny offline model with shrunken arguments; each shrink says why. The reward
functions are toy ones chosen to *vary* inside a group, because a random model scores 0 on every
diagram component, and zero-variance groups would make every advantage 0 and the comparison vacuous.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from training.sinks import (
    BatchingSink,
    HttpSink,
    JsonlSink,
    MemorySink,
    read_jsonl_sink,
    upload_spool,
)

# --------------------------------------------------------------------------------------------------
# Sinks


def _group(step: int, key: str) -> dict:
    return {
        "step": step,
        "key": key,
        "prompt": "p",
        "split": "train",
        "rollouts": [
            {
                "index": 0,
                "completion": "c",
                "rewards": {"a": {"value": math.nan, "reason": "r"}},
                "advantage": 0.0,
                "length": 1,
                "truncated": False,
            }
        ],
    }


def test_it_writes_typed_jsonl_lines(tmp_path):
    sink = JsonlSink(tmp_path / "out.jsonl")
    sink.write_groups([_group(1, "k")])
    sink.write_metrics(1, {"loss": 0.5})
    sink.log("hello")
    sink.progress(1, 10)
    sink.close()
    data = read_jsonl_sink(tmp_path / "out.jsonl")
    assert data["groups"][0]["key"] == "k"
    assert (
        data["groups"][0]["rollouts"][0]["rewards"]["a"]["value"] is None
    )  # NaN never reaches JSON
    assert data["metrics"] == [{"step": 1, "values": {"loss": 0.5}}]
    assert data["logs"][0]["line"] == "hello"
    assert data["progress"] == [{"step": 1, "total": 10}]


def test_it_batches_writes_on_a_background_thread_and_survives_inner_errors():
    class Flaky(MemorySink):
        def write_metrics(self, step, values):
            if step == 2:
                raise RuntimeError("boom")
            super().write_metrics(step, values)

    inner = Flaky()
    sink = BatchingSink(inner)
    for step in range(1, 4):
        sink.write_metrics(step, {"loss": float(step)})
    sink.write_groups([_group(1, "k")])
    sink.flush()
    assert [m["step"] for m in inner.metrics] == [
        1,
        3,
    ]  # step 2 failed inside, and nothing raised out here
    sink.close()
    assert inner.closed and len(inner.groups) == 1


class _Api:
    """A stand-in for the web app's ingestion API: records each POST (path, auth header, body)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[tuple[str, str, dict]] = []
        self.fail_first = fail_first
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if api.fail_first > 0:
                    api.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                api.received.append((self.path, self.headers.get("Authorization"), body))
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_it_posts_batches_with_the_token_and_retries_5xx(tmp_path):
    api = _Api(fail_first=1)
    try:
        sink = HttpSink(
            api.url, "KEY", 7, spool_path=tmp_path / "spool.jsonl", batch_size=2, backoff=0.01
        )
        sink.write_groups([_group(1, "a")])
        assert api.received == []  # below batch_size: still buffered
        sink.write_groups([_group(1, "b")])
        sink.write_metrics(1, {"loss": 1.0})
        sink.close()
    finally:
        api.stop()
    paths = [p for p, _, _ in api.received]
    assert paths == ["/api/v1/runs/7/groups/", "/api/v1/runs/7/metrics/"]
    assert {auth for _, auth, _ in api.received} == {"Token KEY"}
    assert [g["key"] for g in api.received[0][2]["groups"]] == ["a", "b"]
    assert api.received[1][2] == {"metrics": [{"step": 1, "values": {"loss": 1.0}}]}
    assert not (tmp_path / "spool.jsonl").exists()


def test_it_spools_when_the_server_is_down_and_upload_resumes(tmp_path):
    api = _Api()
    url = api.url
    api.stop()  # nothing listens on that port now
    spool = tmp_path / "spool.jsonl"
    sink = HttpSink(
        url, "KEY", "run-1", spool_path=spool, batch_size=1, retries=1, backoff=0.01, timeout=1
    )
    sink.write_groups([_group(1, "a")])  # fails after a retry, then spools
    sink.write_groups([_group(2, "b")])  # the server is known down: straight to the spool
    sink.write_metrics(2, {"loss": 0.1})
    sink.close()
    assert sink.spooled == {"groups": 2, "metrics": 1, "settings": 0}
    assert sink.sent == {"groups": 0, "metrics": 0, "settings": 0}
    assert len(spool.read_text().splitlines()) == 3

    assert upload_spool(spool, url, "KEY", "run-1", retries=0, timeout=1) == {"sent": 0, "left": 3}

    api = _Api()
    try:
        result = upload_spool(spool, api.url, "KEY", "run-1")
    finally:
        api.stop()
    assert result == {"sent": 3, "left": 0}
    assert [b["groups"][0]["key"] for p, _, b in api.received if p.endswith("/groups/")] == [
        "a",
        "b",
    ]
    assert spool.read_text() == ""


# --------------------------------------------------------------------------------------------------
# Recorder on a real GRPOTrainer


def distinct_chars(prompts, completions, **kwargs):
    """Varies with every sample; returns (value, reason) pairs, which the recorder
    unpacks for TRL."""
    return [(len(set(c)) / 40.0, f"{len(set(c))} distinct chars") for c in completions]


def has_digit(prompts, completions, **kwargs):
    """None (not applicable) on every 4th row, so the recorder must carry TRL's None through."""
    return [
        None if i % 4 == 0 else float(any(ch.isdigit() for ch in c))
        for i, c in enumerate(completions)
    ]


def _grpo_trainer(tiny_model, tmp_path, callbacks=None, with_key=True, **overrides):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [
        {"prompt": f"Draw diagram number {i}:", **({"key": f"k{i}"} if with_key else {})}
        for i in range(8)
    ]
    overrides.setdefault("reward_weights", [1.0, 0.5])
    overrides.setdefault("max_steps", 3)  # 3 steps: several generations and logs, seconds on CPU
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=4,  # smallest group that still shows within-group variance
        per_device_train_batch_size=8,  # 2 prompts x 4 completions per step
        max_completion_length=16,  # short rollouts: generation dominates CPU time
        learning_rate=1e-3,  # large, so a 3-step run visibly moves the policy
        logging_steps=1,
        use_cpu=True,
        bf16=False,  # CPU: fp32 (TRL's default is bf16)
        # Tiny model: recomputation only costs time (TRL defaults it on)
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **overrides,
    )
    return GRPOTrainer(
        model=tiny_model,
        reward_funcs=[distinct_chars, has_digit],
        args=args,
        train_dataset=Dataset.from_list(rows),
        callbacks=callbacks,
    )


def _spy_on_advantages(trainer) -> list[list[float]]:
    """TRL's own advantages, straight from the output of
    `_generate_and_score_completions` (test only)."""
    seen: list[list[float]] = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        output = original(inputs)
        seen.append(output["advantages"].detach().cpu().tolist())
        return output

    trainer._generate_and_score_completions = spy
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_it_records_trls_own_advantages_rewards_and_metrics(tiny_model, tmp_path, grad_accum):
    from training.recorder import RolloutRecorder
    from training.stats import compute_advantages

    trainer = _grpo_trainer(tiny_model, tmp_path, gradient_accumulation_steps=grad_accum)
    trl_advantages = _spy_on_advantages(trainer)
    sink = MemorySink()
    RolloutRecorder.attach(trainer, sink)
    trainer.train()

    rows_per_step = (
        8 * grad_accum
    )  # one generation per optimizer step (steps_per_generation = grad_accum)
    steps = sorted({g["step"] for g in sink.groups})
    assert steps == [1, 2, 3] and len(trl_advantages) == 3
    for step, expected in zip(steps, trl_advantages, strict=True):
        groups = [g for g in sink.groups if g["step"] == step]
        rollouts = [r for g in groups for r in g["rollouts"]]
        assert len(groups) == rows_per_step // 4 and all(len(g["rollouts"]) == 4 for g in groups)
        assert [r["index"] for r in groups[0]["rollouts"]] == [0, 1, 2, 3]
        assert all(g["key"].startswith("k") for g in groups) and len(
            {g["key"] for g in groups}
        ) == len(groups)
        np.testing.assert_allclose([r["advantage"] for r in rollouts], expected, atol=1e-5)

        # Every component, with values and reasons; None passes through as None.
        for r in rollouts:
            assert set(r["rewards"]) == {"distinct_chars", "has_digit"}
            assert r["rewards"]["distinct_chars"]["reason"].endswith("distinct chars")
            assert 0 < r["length"] <= 16 and isinstance(r["truncated"], bool)
            assert isinstance(r["completion"], str)
        assert [r["rewards"]["has_digit"]["value"] is None for r in rollouts[:4]] == [
            True,
            False,
            False,
            False,
        ]

        # The logged per-step reward is the mean of the recorded aggregates.
        logged = next(
            m["values"] for m in sink.metrics if m["step"] == step and "reward" in m["values"]
        )
        assert np.mean([r["reward"] for r in rollouts]) == pytest.approx(logged["reward"], abs=1e-5)

        # And training.stats reproduces TRL from the recorded components (the
        # ingestion path's math).
        matrix = np.array(
            [
                [
                    np.nan if r["rewards"][n]["value"] is None else r["rewards"][n]["value"]
                    for n in ("distinct_chars", "has_digit")
                ]
                for r in rollouts
            ]
        )
        recomputed = compute_advantages(matrix, [1.0, 0.5], group_size=4)
        np.testing.assert_allclose(recomputed.advantages, expected, atol=1e-4)

    assert any(abs(a) > 0.1 for adv in trl_advantages for a in adv)  # the comparison is not vacuous
    keys = {k for m in sink.metrics for k in m["values"]}
    assert {
        "loss",
        "reward",
        "rewards/distinct_chars/mean",
        "rewards/has_digit/mean",
        "entropy",
    } <= keys


@pytest.mark.slow
def test_it_works_as_a_plain_callback_in_someone_elses_script(tiny_model, tmp_path):
    from training.recorder import RolloutRecorder

    path = tmp_path / "rollouts.jsonl"
    trainer = _grpo_trainer(
        tiny_model,
        tmp_path,
        callbacks=[RolloutRecorder(jsonl=str(path))],
        with_key=False,
        max_steps=2,
    )  # 2 steps: the one-liner only needs to be shown to record
    trl_advantages = _spy_on_advantages(trainer)
    trainer.train()

    data = read_jsonl_sink(path)
    assert [g["step"] for g in data["groups"]] == [1, 1, 2, 2]
    assert all(
        g["key"].startswith("p-") for g in data["groups"]
    )  # no key column: hash of the prompt
    recorded = [r["advantage"] for g in data["groups"] for r in g["rollouts"]]
    np.testing.assert_allclose(recorded, [a for adv in trl_advantages for a in adv], atol=1e-5)
    assert data["groups"][0]["rollouts"][0]["rewards"]["distinct_chars"]["reason"]
    assert {m["step"] for m in data["metrics"]} == {1, 2}


# --------------------------------------------------------------------------------------------------
# The trainer's settings, captured at train start


@pytest.mark.slow
def test_it_writes_the_trainers_settings_as_the_jsonl_header(tiny_model, tmp_path):
    from training.recorder import RolloutRecorder

    path = tmp_path / "rollouts.jsonl"
    trainer = _grpo_trainer(
        tiny_model,
        tmp_path,
        callbacks=[RolloutRecorder(jsonl=str(path))],
        max_steps=1,
        scale_rewards="batch",
        beta=0.04,
        loss_type="grpo",
    )
    trl_advantages = _spy_on_advantages(trainer)
    trainer.train()

    first = json.loads(path.read_text().splitlines()[0])
    assert first["type"] == "settings"  # before any group: an import applies it first
    settings = read_jsonl_sink(path)["settings"]
    assert len(settings) == 1
    s = settings[0]
    assert s["weights"] == {"distinct_chars": 1.0, "has_digit": 0.5}
    assert (s["scale_rewards"], s["aggregation"], s["group_size"], s["advantage_epsilon"]) == (
        "batch",
        "sum_then_normalize",
        4,
        1e-4,
    )
    import trl

    assert (
        s["trainer"]["trl_version"] == trl.__version__ and s["trainer"]["model_name"] == tiny_model
    )
    assert (s["trainer"]["loss_type"], s["trainer"]["beta"], s["trainer"]["learning_rate"]) == (
        "grpo",
        0.04,
        1e-3,
    )
    assert s["trainer"]["steps_per_generation"] == 1 and s["trainer"]["epsilon"] == 0.2

    # The header is enough to reproduce TRL's advantages from the recorded components.
    from training.stats import compute_advantages

    rollouts = [r for g in read_jsonl_sink(path)["groups"] for r in g["rollouts"]]
    names = list(s["weights"])
    matrix = np.array(
        [
            [
                np.nan if r["rewards"][n]["value"] is None else r["rewards"][n]["value"]
                for n in names
            ]
            for r in rollouts
        ]
    )
    again = compute_advantages(
        matrix,
        list(s["weights"].values()),
        group_size=s["group_size"],
        scale_rewards=s["scale_rewards"],
        eps=s["advantage_epsilon"],
    )
    np.testing.assert_allclose(again.advantages, trl_advantages[0], atol=1e-5)
    group_only = compute_advantages(matrix, list(s["weights"].values()), group_size=4)
    assert (
        np.abs(group_only.advantages - np.array(trl_advantages[0])).max() > 1e-3
    )  # the setting matters


@pytest.mark.slow  # builds a GRPOTrainer on the tiny model
def test_it_records_the_weights_as_given_not_trls_float32_copy(tiny_model, tmp_path):
    import torch

    from training.recorder import trainer_settings

    trainer = _grpo_trainer(tiny_model, tmp_path, reward_weights=[0.2, 0.35])
    assert trainer.reward_weights.tolist()[0] != 0.2  # TRL holds float32: 0.20000000298023224
    assert trainer_settings(trainer)["weights"] == {"distinct_chars": 0.2, "has_digit": 0.35}
    trainer.args.reward_weights = None  # ones filled in by TRL, or a list we cannot trust
    trainer.reward_weights = torch.tensor([0.2, 0.35], dtype=torch.float32)
    assert trainer_settings(trainer)["weights"] == {"distinct_chars": 0.2, "has_digit": 0.35}


def test_it_records_the_settings_it_can_read_and_names_the_others(caplog):
    from training.recorder import trainer_settings

    class OldTrainer:  # a trainer of another TRL release: no weights tensor, boolean scale_rewards
        reward_func_names = ["a", "b"]
        scale_rewards = False
        num_generations = 8
        loss_type = "grpo"

    with caplog.at_level("WARNING"):
        s = trainer_settings(OldTrainer())
    assert (
        s["scale_rewards"] == "none"
        and s["group_size"] == 8
        and s["aggregation"] == "sum_then_normalize"
    )
    assert "weights" not in s and s["trainer"]["loss_type"] == "grpo"
    assert "reward_weights" in s["trainer"]["unreadable"] and "beta" in s["trainer"]["unreadable"]
    assert "could not read the trainer's reward_weights" in caplog.text


def test_it_posts_settings_at_once_and_spools_them_when_the_server_is_down(tmp_path):
    api = _Api()
    try:
        sink = HttpSink(api.url, "KEY", 7, spool_path=tmp_path / "spool.jsonl")
        sink.write_settings({"weights": {"a": 0.5}, "scale_rewards": "none"})
    finally:
        api.stop()
    assert api.received == [
        ("/api/v1/runs/7/settings/", "Token KEY", {"weights": {"a": 0.5}, "scale_rewards": "none"})
    ]
    down = HttpSink(api.url, "KEY", 7, spool_path=tmp_path / "spool.jsonl", retries=0, timeout=1)
    down.write_settings({"scale_rewards": "batch"})
    assert down.spooled["settings"] == 1
    api = _Api()
    try:
        assert upload_spool(tmp_path / "spool.jsonl", api.url, "KEY", 7) == {"sent": 1, "left": 0}
    finally:
        api.stop()
    assert api.received[0][0] == "/api/v1/runs/7/settings/" and api.received[0][2] == {
        "scale_rewards": "batch"
    }

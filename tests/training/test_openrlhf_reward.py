"""training/openrlhf_reward.py, called exactly as OpenRLHF calls a `--remote_rm_url reward_func.py`.

Both call patterns are built from OpenRLHF's published code:
- since 0.9.1, `openrlhf/utils/agent.py` SingleTurnAgentExecutor: `generate_responses(prompt, label,
  num_samples)` runs `num_samples` executes concurrently in one vLLM engine's process; each decodes
  `prompt_token_ids + action_token_ids` with `skip_special_tokens=False` into `query` and calls
  `await asyncio.to_thread(reward_func, [query], [prompt], [label])`, then reads "rewards", "scores"
  and "extra_logs" from the result. `prompt` is the chat-templated prompt text.
- up to 0.9.0, `openrlhf/utils/remote_rm_utils.py` RemoteRewardModel: `ray.remote(reward_func)` on
  chunks of `micro_rollout_batch_size` of the expanded list, where each prompt appears
  `n_samples_per_prompt` times in a row. Ray pickles the function into worker processes; spawned
  processes stand in for Ray's workers here (Ray is not installed), pickling the same way.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import pickle
import random
import time
from typing import Any

import pytest

from training.client import ApiError
from training.openrlhf_reward import batch_to_groups, wrap_reward_func

TEMPLATE = (
    "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"  # what apply_chat_template gives
)
EOS = "<|im_end|>"  # decoded too: skip_special_tokens=False


class FakeClient:
    """Stands in for training.client.Client: records what would be posted; can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.posted: list[tuple[int, list[dict[str, Any]]]] = []
        self.created: list[dict[str, Any]] = []
        self.settings: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []

    def get_or_create_run(
        self, name: str, environment: str, components: list[str], **kw: Any
    ) -> tuple[int, bool]:
        self.created.append(
            {
                "name": name,
                "environment": environment,
                "components": components,
                "reward_settings": kw.get("reward_settings"),
            }
        )
        return 42, len(self.created) == 1

    def post_groups(self, run_id: int, groups: list[dict[str, Any]]) -> dict[str, int]:
        if self.fail:
            raise ApiError(None, [{"field": "", "error": "cannot reach the server"}], "POST", "/x")
        self.posted.append((run_id, groups))
        return {"groups": len(groups)}

    def post_settings(self, run_id: int, settings: dict[str, Any]) -> dict[str, Any]:
        self.settings.append(settings)
        return settings

    def post_metrics(self, run_id: int, metrics: list[dict[str, Any]]) -> dict[str, int]:
        self.metrics.extend(metrics)
        return {"metrics": len(metrics)}

    @property
    def groups(self) -> list[dict[str, Any]]:
        return [g for _, batch in self.posted for g in batch]


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
    """A custom reward function as OpenRLHF documents it: torch tensors, extra_logs per sample."""
    import torch

    answers = [
        q[len(p) :].removesuffix(EOS).strip() if q.startswith(p) else q
        for q, p in zip(queries, prompts, strict=True)
    ]
    correct = torch.tensor([float(a == lab) for a, lab in zip(answers, labels, strict=True)])
    return {
        "rewards": correct + 0.1,
        "scores": correct,
        "extra_logs": {
            "correct": correct,
            "length": torch.tensor([float(len(a)) for a in answers]),
            "batch_mean": correct.mean(),
        },
    }


def sample(question: str, answer: str) -> tuple[str, str]:
    """(query, prompt) as the executor builds them: the decoded prompt + response tokens,
    and the prompt."""
    prompt = TEMPLATE.format(q=question)
    return prompt + answer + EOS, prompt


async def engine(wrapped: Any, prompts: list[tuple[str, str, list[str]]]) -> list[Any]:
    """One vLLM engine: every sample of each prompt concurrently, the reward call in
    a thread each."""

    async def execute(question: str, label: str, answer: str) -> Any:
        await asyncio.sleep(random.uniform(0, 0.01))  # generation: samples finish in any order
        query, prompt = sample(question, answer)
        return await asyncio.to_thread(wrapped, [query], [prompt], [label])

    calls = [execute(q, label, a) for q, label, answers in prompts for a in answers]
    return await asyncio.gather(*calls)


ROUND = [("1+1?", "2", ["2", "3", "2", "11"]), ("2+2?", "4", ["4", "4", "5", "4"])]


# -------------------------------------------------------------------------------------- since 0.9.1


def test_it_assembles_concurrent_per_sample_calls_into_groups_of_n_samples_per_prompt():
    client = FakeClient()
    wrapped = wrap_reward_func(
        reward_func, client=client, run="orl", n_samples_per_prompt=4, step_gap=2.0
    )  # far above the spread of one round's calls, even under load
    results = asyncio.run(engine(wrapped, ROUND))
    assert all(
        set(r) == {"rewards", "scores", "extra_logs"} for r in results
    )  # unchanged for OpenRLHF
    wrapped.recorded.recorder.flush(timeout=10)
    assert client.groups == []  # held until the step is over: a prompt may still be drawn again
    wrapped.recorded.recorder.flush(timeout=10, partial=True)
    groups = sorted(client.groups, key=lambda g: g["prompt"])
    assert [(g["prompt"], g["step"], len(g["rollouts"])) for g in groups] == [
        (TEMPLATE.format(q="1+1?"), 1, 4),
        (TEMPLATE.format(q="2+2?"), 1, 4),
    ]
    first = groups[0]["rollouts"]
    assert sorted(r["completion"] for r in first) == sorted(a + EOS for a in ROUND[0][2])
    for r in first:
        right = r["completion"] == "2" + EOS
        assert r["reward"] == pytest.approx(1.1 if right else 0.1)
        assert r["rewards"] == {
            "correct": float(right),
            "length": float(len(r["completion"]) - len(EOS)),
            "batch_mean": float(right),  # a 0-d tensor of a one-sample call is that sample's
            "unexplained": pytest.approx(0.1),  # rewards = correct + 0.1: the constant
        }
        assert r["state"] == {"label": "2", "score": float(right)}
    # OpenRLHF's group_norm advantage: (r - mean) / (std + 1e-9), std Bessel-corrected as torch's.
    assert sorted(r["advantage"] for r in first) == pytest.approx(
        [-0.866025, -0.866025, 0.866025, 0.866025], rel=1e-5
    )
    assert client.created[0]["reward_settings"]["group_size"] == 4
    assert len({g["key"] for g in groups}) == 2

    time.sleep(2.5)  # OpenRLHF trains: the reward function sits idle longer than step_gap
    asyncio.run(engine(wrapped, ROUND))
    wrapped.recorded.recorder.flush(timeout=10, partial=True)
    assert sorted(g["step"] for g in client.groups) == [1, 1, 2, 2]
    wrapped.recorded.recorder.close()


def test_it_lets_the_trainer_exit_at_once_after_closing_the_recorder():
    """A recorder its owner closed is not flushed again at exit: the atexit flush used to wait 60 s
    for an upload thread that had already stopped (a trainer hung a minute per closed recorder)."""
    import subprocess
    import sys
    from pathlib import Path

    program = """
from training.openrlhf_reward import RewardRecorder
class Client:
    def post_groups(self, run_id, groups):
        return {"groups": len(groups)}
recorders = [RewardRecorder(Client(), 1, straggler_timeout=0.5) for _ in range(2)]
for r in recorders:
    r.close()
    r.close()  # idempotent
    r.flush(timeout=None)  # nothing to wait for once closed
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=root, timeout=50, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_it_delivers_in_the_callers_thread_once_closed():
    client = FakeClient()
    wrapped = wrap_reward_func(reward_func, client=client, run=3, n_samples_per_prompt=4)
    asyncio.run(engine(wrapped, ROUND))
    recorder = wrapped.recorded.recorder
    recorder.close()
    posted = len(client.groups)
    assert posted == 2
    asyncio.run(engine(wrapped, ROUND))  # a late call after close: nothing lost, nothing hangs
    assert len(client.groups) == posted + 2


def test_it_posts_a_straggling_group_after_the_timeout():
    client = FakeClient()
    wrapped = wrap_reward_func(
        reward_func, client=client, run="orl", n_samples_per_prompt=4, straggler_timeout=1.5
    )
    asyncio.run(
        engine(wrapped, [("1+1?", "2", ["2", "3", "2"])])
    )  # the fourth sample never comes back
    assert client.groups == []
    deadline = time.monotonic() + 10
    while not client.groups and time.monotonic() < deadline:
        time.sleep(0.05)  # the upload thread notices on its own: no further call is needed
    (group,) = client.groups
    assert len(group["rollouts"]) == 3 and [r["index"] for r in group["rollouts"]] == [0, 1, 2]
    wrapped.recorded.recorder.close()


def test_it_never_groups_a_prompt_drawn_twice_in_a_step_by_arrival_order():
    """OpenRLHF groups by each sample's index (experience_maker: rewards[indices], reshape(-1, n)),
    which the reward function never sees: two draws of one prompt on one engine interleave."""
    client = FakeClient()
    wrapped = wrap_reward_func(
        reward_func, client=client, run=7, n_samples_per_prompt=2, background=False
    )
    twice = [("1+1?", "2", ["2", "3"]), ("1+1?", "2", ["11", "2"]), ("2+2?", "4", ["4", "5"])]
    asyncio.run(engine(wrapped, twice))
    wrapped.recorded.recorder.flush(partial=True)
    assert [(g["prompt"], len(g["rollouts"])) for g in client.groups] == [
        (TEMPLATE.format(q="2+2?"), 2)
    ]
    assert client.posted[0][0] == 7 and client.created == []  # a run id: nothing to create
    assert wrapped.recorded.recorder.left_out == {1: 4}
    assert client.metrics == [{"step": 1, "values": {"recorder/ungroupable_samples": 4.0}}]


def test_it_spools_groups_it_cannot_deliver_and_never_raises(tmp_path):
    spool = tmp_path / "spool.jsonl"
    wrapped = wrap_reward_func(
        reward_func,
        client=FakeClient(fail=True),
        run=3,
        spool_path=spool,
        background=False,
        n_samples_per_prompt=2,
    )
    for answer in ("2", "3"):
        assert "rewards" in wrapped(*[[x] for x in sample("1+1?", answer)], ["2"])
    wrapped.recorded.recorder.flush(partial=True)  # the step is over
    entry = json.loads(spool.read_text().splitlines()[0])
    assert (
        entry["kind"] == "groups" and len(entry["payload"]["groups"][0]["rollouts"]) == 2
    )  # HttpSink's format
    assert wrapped.recorded.recorder.spooled == 1


def test_it_records_plain_per_sample_numbers_and_the_weights_of_extra_logs():
    """OpenRLHF >= 0.9.1 wraps each call's result itself (samples_generator: torch.tensor([value])),
    so plain numbers are valid: {"rewards": 1.0, "extra_logs": {"correct": 1.0}}. The weights of
    the extra_logs are whatever the function summed them with, not 1."""
    import torch

    def plain(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
        answer = queries[0][len(prompts[0]) :].removesuffix(EOS)
        correct = float(answer == labels[0])
        fmt = 1.0 if answer.isdigit() else 0.0
        return {
            "rewards": 2.0 * correct + 0.5 * fmt,
            "extra_logs": {"correct": correct, "format": torch.tensor(fmt)},  # a float, a 0-d
        }

    client = FakeClient()
    wrapped = wrap_reward_func(plain, client=client, run=9, n_samples_per_prompt=4)
    rounds = [
        (f"{k}+{k}?", str(2 * k), [str(2 * k), "x", str(2 * k + 1), "y"]) for k in range(1, 9)
    ]
    asyncio.run(engine(wrapped, rounds))
    wrapped.recorded.recorder.close()
    assert len(client.groups) == 8 and all(len(g["rollouts"]) == 4 for g in client.groups)
    rollouts = [r for g in client.groups for r in g["rollouts"]]
    assert {tuple(sorted(r["rewards"])) for r in rollouts} == {("correct", "format")}
    assert sorted({r["reward"] for r in rollouts}) == [0.0, 0.5, 2.5]
    (settings,) = client.settings
    assert settings["weights"] == {"correct": 2.0, "format": 0.5}
    assert settings["trainer"]["weights_note"].startswith("recovered: rewards = 2 x correct")


def test_it_completes_its_rows_with_the_weights_the_run_settled_on():
    """Another process posted its fit first: this process adopts the run's weights (the answer to
    its first_wins post) and redoes `unexplained`, so its rows sum to their reward under them."""
    from training.importers.weights import UNEXPLAINED

    class SettledClient(FakeClient):
        def post_settings(self, run_id: int, settings: dict[str, Any]) -> dict[str, Any]:
            self.settings.append(settings)
            return {"reward_settings": {"weights": {"correct": 0.5, UNEXPLAINED: 1.0}}}

    def plain(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
        correct = float(queries[0][len(prompts[0]) :].removesuffix(EOS) == labels[0])
        return {"rewards": 2.0 * correct, "extra_logs": {"correct": correct}}

    client = SettledClient()
    wrapped = wrap_reward_func(plain, client=client, run=9, n_samples_per_prompt=4)
    rounds = [(f"{k}+{k}?", str(2 * k), [str(2 * k), "x", str(2 * k + 1), "y"]) for k in range(9)]
    asyncio.run(engine(wrapped, rounds))
    wrapped.recorded.recorder.close()
    (posted,) = client.settings
    assert posted["first_wins"] is True and posted["weights"] == {"correct": 2.0}  # its own fit
    rollouts = [r for g in client.groups for r in g["rollouts"]]
    assert len(rollouts) == 36
    for r in rollouts:  # under the run's weights, not its own
        total = 0.5 * r["rewards"]["correct"] + r["rewards"][UNEXPLAINED]
        assert total == pytest.approx(r["reward"])
    assert {r["rewards"][UNEXPLAINED] for r in rollouts} == {0.0, 1.5}


def test_it_survives_a_reward_result_it_cannot_read(caplog):
    client = FakeClient()
    wrapped = wrap_reward_func(
        lambda q, p, lab: {"rewards": [1.0]}, client=client, run=1, background=False
    )
    queries, prompts = zip(*(sample("1+1?", a) for a in ("2", "3")), strict=True)
    assert wrapped(list(queries), list(prompts), ["2", "2"]) == {
        "rewards": [1.0]
    }  # wrong length: logged only
    assert client.posted == [] and "could not read this batch" in caplog.text


def test_it_takes_the_step_from_step_fn_when_given():
    client = FakeClient()
    steps = iter([5, 5])
    wrapped = wrap_reward_func(
        reward_func,
        client=client,
        run=1,
        background=False,
        n_samples_per_prompt=2,
        step_fn=lambda: next(steps),
    )
    for answer in ("2", "3"):
        wrapped(*[[x] for x in sample("1+1?", answer)], ["2"])
    wrapped.recorded.recorder.flush(partial=True)
    assert client.groups[0]["step"] == 5


# -------------------------------------------------------------------------------------- up to 0.9.0


def expanded(n: int) -> tuple[list[str], list[str], list[str]]:
    """The experience maker's expanded batch: each prompt n times in a row, as
    queries, prompts, labels."""
    rows = [sample(q, a) + (label,) for q, label, answers in ROUND for a in answers[:n]]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def test_it_assembles_ray_chunks_that_split_a_group():
    client = FakeClient()
    wrapped = wrap_reward_func(
        reward_func, client=client, run="orl", background=False, n_samples_per_prompt=4
    )
    queries, prompts, labels = expanded(4)
    for start in range(
        0, 8, 3
    ):  # micro_rollout_batch_size 3: the first prompt's group spans two calls
        result = wrapped(
            queries[start : start + 3], prompts[start : start + 3], labels[start : start + 3]
        )
        assert result["rewards"].shape == (len(queries[start : start + 3]),)
    wrapped.recorded.recorder.flush(partial=True)
    assert [len(g["rollouts"]) for g in client.groups] == [4, 4]


def test_it_groups_a_batch_call_by_prompt_when_the_group_size_is_unknown():
    groups = batch_to_groups(*expanded(2), reward_func(*expanded(2)), step=3, call_id="t")
    assert [(g["step"], len(g["rollouts"])) for g in groups] == [(3, 2), (3, 2)]


def test_it_is_a_function_ray_can_pickle_without_its_threads():
    import inspect

    import cloudpickle  # what Ray pickles a remote function with

    client = FakeClient()
    wrapped = wrap_reward_func(reward_func, client=client, run=1, n_samples_per_prompt=4)
    assert inspect.isfunction(
        wrapped
    )  # ray.remote accepts functions and classes, not callable objects
    wrapped(*expanded(4))
    copy = cloudpickle.loads(cloudpickle.dumps(wrapped))
    assert copy.recorded._recorder is None and wrapped.recorded._recorder is not None
    assert copy(*expanded(4))["rewards"].tolist() == pytest.approx(
        wrapped(*expanded(4))["rewards"].tolist()
    )
    copy.recorded.recorder.flush(timeout=10, partial=True)
    assert (
        copy.recorded.recorder.sent == 2
    )  # the copy's own recorder and thread delivered its groups
    assert copy.recorded.options["client"] is not client  # through its own copy of the client
    assert (
        pickle.loads(pickle.dumps(copy.recorded))._recorder is None
    )  # the state alone pickles plainly too
    wrapped.recorded.recorder.close()
    copy.recorded.recorder.close()


# ----------------------------------------------------------------------------------- many processes


def engine_process(pickled: bytes, prompts: list[tuple[str, str, list[str]]]) -> int:
    """A vLLM engine's process (since 0.9.1) or a Ray worker (up to 0.9.0): the
    wrapper arrives pickled."""
    import cloudpickle

    wrapped = cloudpickle.loads(pickled)
    asyncio.run(engine(wrapped, prompts))
    wrapped.recorded.recorder.close()
    return wrapped.recorded.recorder.sent


@pytest.mark.slow  # a live server and two spawned processes importing torch
def test_it_lands_many_processes_naming_one_run_in_one_run(live_server, transactional_db):
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from webapp.accounts.roles import set_role
    from webapp.rollouts.models import Group
    from webapp.runs.models import Run

    user = get_user_model().objects.create_user(username="engine-bot", password="x" * 12)
    set_role(user, "trainer")
    token = Token.objects.create(user=user).key
    wrapped = wrap_reward_func(
        reward_func, url=live_server.url, token=token, run="orl-engines", n_samples_per_prompt=4
    )
    work = [
        [ROUND[0], ("3+3?", "6", ["6", "6", "7", "6"])],
        [ROUND[1], ("4+4?", "8", ["8", "9", "9", "8"])],
    ]
    import cloudpickle

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        sent = pool.starmap(engine_process, [(cloudpickle.dumps(wrapped), w) for w in work])
    assert sent == [2, 2]
    run = Run.objects.get(name="orl-engines")  # one run, though two processes asked for it at once
    assert sorted(run.environment.components.values_list("name", flat=True)) == [
        "batch_mean",  # correct.mean() of a one-sample call: per sample
        "correct",
        "length",
        "unexplained",  # rewards = correct + 0.1: the constant 0.1
    ]
    # The fitted weights reproduce every reward OpenRLHF computed. Which weights: the first released
    # samples decide, and the two processes' order varies, so with few samples `length` can be
    # collinear with the others (a different exact fit); only the sum is determined.
    weights = run.reward_weights()
    from webapp.rollouts.models import RewardScore, Rollout

    for rollout in Rollout.objects.filter(run=run):
        scores = RewardScore.objects.filter(rollout=rollout).values_list("component__name", "value")
        total = sum(weights[name] * value for name, value in scores if value is not None)
        assert total == pytest.approx(rollout.reward, abs=1e-6)
    assert list(Group.objects.filter(run=run).values_list("size", flat=True)) == [4, 4, 4, 4]
    assert set(Group.objects.filter(run=run).values_list("step", flat=True)) == {1}
    assert (
        run.advantage_settings()["group_size"] == 4
        and run.advantage_settings()["advantage_epsilon"] == 1e-9
    )

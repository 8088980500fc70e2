"""training/demo_tokens.py: the demo story's token arrays follow the ingestion contract, and the
planted sampler drift is what the token diagnostics flag, at its step; without it, nothing."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from training import token_diagnostics as td
from training.demo_stories import story_groups
from training.demo_tokens import add_tokens
from training.environments import get_environment

STORY = {"steps": 30, "groups_per_step": 4, "G": 6, "saturate_at": 5}


@pytest.fixture(scope="module")
def groups():
    return story_groups(False, **STORY)


def weights():
    return {c.name: c.weight for c in get_environment("ask_to_code").components}


def step_stats(records) -> td.TokenSteps:
    by_step: dict[int, list] = {}
    for g in records:
        for r in g["rollouts"]:
            t = {k: np.asarray(v) for k, v in r["tokens"].items()}
            sums = td.rollout_sums(
                t["sampler_logprobs"],
                t["trainer_logprobs"],
                t["entropy"],
                t["loss_mask"],
                len(t["ids"]),
            )
            by_step.setdefault(g["step"], []).append(sums)
    return td.step_stats(by_step)


def test_the_tokens_follow_the_contract(groups):
    records = add_tokens(copy.deepcopy(groups[:8]), weights(), drift_step=None)
    for g in records:
        for r in g["rollouts"]:
            t, transcript = r["tokens"], r["transcript"]
            n = len(t["ids"])
            assert n and all(len(v) == n for v in t.values())
            assert max(t["sampler_logprobs"]) <= 0 and max(t["trainer_logprobs"]) <= 0
            for off, turn, m in zip(t["offsets"], t["turn"], t["loss_mask"], strict=True):
                msg = transcript[turn]
                assert 0 <= off < len(msg["content"])
                assert m == (msg["role"] == "assistant")  # tool and user turns out of the loss
            assert len(set(t["advantages"])) == 1  # GRPO's advantage on every token
            pairs = zip(t["sampler_logprobs"], t["trainer_logprobs"], t["loss_mask"], strict=True)
            assert all(m or s == tr for s, tr, m in pairs)  # never sampled: the trainer's


def test_the_planted_drift_is_flagged_at_its_step(groups):
    planted = add_tokens(copy.deepcopy(groups), weights(), drift_step=18)
    (f,) = td.diagnose_tokens(step_stats(planted))
    assert f.code == "token_mismatch" and f.onset_step == 18
    healthy = add_tokens(copy.deepcopy(groups), weights(), drift_step=None)
    assert td.diagnose_tokens(step_stats(healthy)) == []


@pytest.mark.slow
def test_the_demo_chains_grpo_stage_records_tokens(tiny_model, tmp_path):
    """The GRPO job the demo chain queues, on the tiny model with its steps shrunk (one step, two
    prompts, 8-token completions: enough to record), gives every rollout a token view's arrays."""
    from training import grpo
    from training.demo_chain import demo_chain_stages
    from training.sinks import MemorySink
    from training.token_capture import unpack

    stage = next(s for s in demo_chain_stages() if s.kind == "grpo")
    config = {
        **stage.config,
        "max_steps": 1,
        "num_prompts": 2,
        "max_completion_length": 8,
        "base_model": tiny_model,  # the chain trains the SFT model; any model records the same
        "output_dir": str(tmp_path / "grpo"),
    }
    sink = MemorySink()
    grpo.main(grpo.GRPOJobConfig.from_dict(config), sink=sink)
    rollouts = [r for g in sink.groups for r in g["rollouts"]]
    assert len(rollouts) == 16
    for r in rollouts:
        t = {k: unpack(v) for k, v in r["tokens"].items()}  # arrays travel as base64 binary
        n = len(t["ids"])
        assert n == r["length"] > 0 and {len(v) for v in t.values()} == {n}
        assert {"trainer_logprobs", "entropy", "loss_mask", "advantages", "text"} <= set(t)
        assert t["trainer_logprobs"].max() <= 0

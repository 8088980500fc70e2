"""webapp/runs/results.py: chains of runs in story order, an eval's figures from what ingestion
stored, the previous eval of a chain, and a teacher's kept/dropped counts."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import RewardScore, Rollout
from webapp.rollouts.services import create_run
from webapp.runs import results
from webapp.runs.models import Run


def _run(env, name, kind, parent=None, base="tiny:toy", **fields):
    r = create_run(
        name=name,
        kind=kind,
        environment=env,
        config={},
        base_model=base,
        parent=parent,
        status="succeeded",
    )
    for k, v in fields.items():
        setattr(r, k, v)
    r.save()
    return r


@pytest.fixture
def chain(env3):
    teacher = _run(env3, "teacher", "teacher")
    before = _run(env3, "eval before", "eval")
    sft = _run(env3, "sft", "sft", parent=teacher)
    after_sft = _run(env3, "eval sft", "eval", parent=sft, base=f"run:{sft.id}")
    grpo = _run(env3, "grpo", "grpo", parent=sft, base=f"run:{sft.id}")
    after_grpo = _run(env3, "eval grpo", "eval", parent=grpo, base=f"run:{grpo.id}")
    return [teacher, before, sft, after_sft, grpo, after_grpo]


def test_it_orders_a_chain_as_its_story_reads_with_the_eval_of_its_starting_model(chain, env3):
    teacher, before, sft, after_sft, grpo, after_grpo = chain
    stranger = _run(env3, "unrelated eval", "eval")  # queued after the chain: not its "before"
    stranger.created_at = timezone.now() + timedelta(hours=1)
    stranger.save()
    found = results.chains([*reversed(chain), stranger])
    story = next(c for c in found if teacher in c.runs)
    assert story.runs == [teacher, before, sft, after_sft, grpo, after_grpo]
    assert story.label == {
        before.id: "before SFT",
        after_sft.id: "after SFT",
        after_grpo.id: "after GRPO",
    }
    assert story.previous_eval(after_grpo) == after_sft and story.previous_eval(before) is None
    assert [c.runs for c in found if stranger in c.runs] == [[stranger]]
    assert results.chain_for(after_sft).runs == story.runs


def test_it_reads_an_evals_figures_from_its_stored_rollouts(chain):
    after_sft, after_grpo = chain[3], chain[5]
    rng = np.random.default_rng(0)

    def groups(p_correct: float) -> list[dict]:
        return [
            make_group(
                0,
                f"k{g}",
                [
                    {
                        "correct": float(rng.random() < p_correct),
                        "format": 1.0,
                        "penalty": -0.5 * float(rng.random() < 0.3),
                    }
                    for _ in range(4)
                ],
            )
            for g in range(6)
        ]

    ingest_groups(after_sft, {"groups": groups(0.3)})
    ingest_groups(after_grpo, {"groups": groups(0.7)})
    got = results.eval_results(after_grpo)
    rows = {r["name"]: r for r in got["rows"]}
    rewards = np.array(
        list(Rollout.objects.filter(run=after_grpo).values_list("reward", flat=True))
    )
    correct, penalty = (
        np.array(
            list(
                RewardScore.objects.filter(run=after_grpo, component__name=n).values_list(
                    "value", flat=True
                )
            )
        )
        for n in ("correct", "penalty")
    )
    prev = np.array(list(Rollout.objects.filter(run=after_sft).values_list("reward", flat=True)))
    assert rows["reward"]["mean"] == pytest.approx(rewards.mean())
    assert rows["reward"]["std"] == pytest.approx(rewards.std(ddof=1))
    assert rows["reward"]["n"] == 24
    assert rows["correct"]["pass_rate"] == pytest.approx((correct == 1.0).mean())
    assert rows["penalty"]["pass_rate"] == pytest.approx((penalty == 0.0).mean())  # max is 0
    assert rows["reward"]["vs_previous"] == pytest.approx(rewards.mean() - prev.mean())
    assert got["previous"] == after_sft and got["target"] == chain[4]
    assert got["target_note"] == "GRPO runs store no rollouts: no training figures to compare"
    assert [w["reward"] for w in got["worst"]] == sorted(rewards)[:5]


def test_it_says_what_a_teacher_kept_and_flags_reasons_it_did_not_record(env3):
    t = _run(env3, "t", "teacher", summary={"kept": 3, "rejected": 5, "keep_rate": 0.375})
    got = results.teacher_result(t)
    assert (got["kept"], got["total"], got["recorded"]) == (3, 8, False)
    t.summary["rejected_by"] = {"json_valid < 1": 4, "weighted score < 0.8": 2}
    assert results.teacher_result(t)["by"] == [("json_valid < 1", 4), ("weighted score < 0.8", 2)]
    assert results.teacher_result(_run(env3, "q", "teacher")) is None
    assert Run.objects.count() == 2

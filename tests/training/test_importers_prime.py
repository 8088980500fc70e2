"""The PRIME-RL reader on runs written as PRIME-RL's orchestrator writes them
(tests/training/prime_fixtures.py): `all` and `effective` combined into the groups PRIME-RL
sampled, with the steps, rewards and advantages it trained on."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.training.prime_fixtures import default_run
from tests.training.test_importers import items
from training.importers import open_reader
from training.importers.episodes import TOKENS_DROPPED


def by_name(run, groups) -> dict[str, dict]:
    """Stored group record by the fixture's group name (A, Z, B...)."""
    names = {f"g-{gid}": facts["name"] for gid, facts in run.truth.items()}
    return {names[g.record["key"]]: g.record for g in groups if g.record["key"] in names}


def trained_step(facts: dict) -> int:
    steps = [s for s in facts["trained_step"] if s is not None]
    return min(steps) if steps else facts["finished_in"]


def test_it_stores_the_groups_prime_rl_sampled_with_what_it_trained_on(tmp_path):
    run = default_run(tmp_path)
    reader = open_reader("prime-rl", tmp_path)
    groups, bad, _ = items(reader)
    assert bad == []
    stored = by_name(run, groups)
    assert sorted(stored) == sorted(f["name"] for f in run.truth.values())  # Z included
    for facts in run.truth.values():
        g = stored[facts["name"]]
        assert len(g["rollouts"]) == 4, facts["name"]  # the group PRIME-RL sampled
        assert g["step"] == trained_step(facts), facts["name"]
        assert [r["reward"] for r in g["rollouts"]] == pytest.approx(facts["rewards"], abs=1e-6)
        assert [r["advantage"] for r in g["rollouts"]] == pytest.approx(
            facts["advantages"], abs=1e-6
        ), facts["name"]
        assert [r["state"]["trained"] for r in g["rollouts"]] == [
            s is not None for s in facts["trained_step"]
        ]
    a = stored["A"]["rollouts"]  # rewards 1, 0, .5, .5: std 0.408, not 0.707 of the shipped two
    assert np.std([r["reward"] for r in a], ddof=1) == pytest.approx(0.4082, abs=1e-4)
    assert reader.notes().get("gaps") is None  # a full run with its config: nothing unknown
    assert reader.settings() == {
        "weights": {"correct": 1.0, "format": 0.5},
        "scale_rewards": "none",
        "group_size": 4,
        "trainer": {
            "algo": "grpo",
            "filter_zero_advantages": True,
            "batch_size": 8,
            "max_off_policy_steps": 8,
        },
    }


def test_it_counts_zero_std_groups_as_prime_rl_saw_them(tmp_path):
    run = default_run(tmp_path)
    groups, _, _ = items(open_reader("prime-rl", tmp_path))
    stored = by_name(run, groups)

    def zero_std(rewards: list) -> bool:
        scored = [r for r in rewards if r is not None]
        return max(scored) == min(scored)

    truth = [zero_std(f["rewards"]) for f in run.truth.values()]
    got = [
        zero_std([r["reward"] for r in stored[f["name"]]["rollouts"]]) for f in run.truth.values()
    ]
    assert got == truth and sum(got) == 1  # Z: absent from every effective file


def test_it_keeps_a_group_shipped_by_two_batches_as_one_group(tmp_path):
    run = default_run(tmp_path)
    groups, bad, _ = items(open_reader("prime-rl", tmp_path))
    keys = [g.record["key"] for g in groups]
    assert len(keys) == len(set(keys)) and bad == []
    f = by_name(run, groups)["F"]
    assert f["step"] == 3 and len(f["rollouts"]) == 4
    assert [r["state"]["trained_step"] for r in f["rollouts"]] == [3, 3, 4, 4]


def test_it_takes_the_step_that_trained_the_group_not_the_dispatch_step(tmp_path):
    run = default_run(tmp_path)
    stored = by_name(run, items(open_reader("prime-rl", tmp_path))[0])
    for name, step in (("B", 2), ("C", 2), ("E", 3)):
        assert stored[name]["step"] == step
        assert {r["state"]["dispatch_step"] for r in stored[name]["rollouts"]} == {1}
    assert stored["Z"]["step"] == 1  # never trained: the window in which PRIME-RL dropped it


def test_it_stores_an_episode_without_a_trace_beside_its_siblings(tmp_path):
    run = default_run(tmp_path)
    groups, bad, _ = items(open_reader("prime-rl", tmp_path))
    e = by_name(run, groups)["E"]["rollouts"]
    assert bad == [] and len(e) == 4
    assert e[1]["completion"] == "" and e[1]["reward"] is None and e[1]["advantage"] == 0.0
    assert e[1]["state"]["no_trace"] and "TimeoutError" in e[1]["state"]["errors"]
    # the errored trace: not scored by PRIME-RL (outside the GRPO mean), its scores kept aside
    assert e[3]["reward"] is None and e[3]["state"]["rewards_not_scored"] == {
        "correct": 1.0,
        "format": 0.0,
    }
    assert [r["advantage"] for r in e] == pytest.approx([0.5, 0.0, -0.5, 0.0])
    assert e[0]["transcript"][0]["tool_calls"][0]["name"] == "calc"
    assert [m["role"] for m in e[0]["transcript"]] == ["assistant", "tool", "assistant"]


def test_it_reads_the_eval_groups_as_holdout(tmp_path):
    default_run(tmp_path)
    groups, _, _ = items(open_reader("prime-rl", tmp_path))
    ev = [g.record for g in groups if g.record.get("split") == "holdout"]
    assert [(g["step"], len(g["rollouts"])) for g in ev] == [(2, 2)]


def copy_steps(src: Path, dst: Path, steps: list[int], subsets=("all", "effective")) -> Path:
    for s in steps:
        for kind in ("train", "eval"):
            for subset in subsets:
                f = src / "rollouts" / f"step_{s}" / kind / subset / "traces.jsonl"
                if f.exists():
                    out = dst / "rollouts" / f"step_{s}" / kind / subset / "traces.jsonl"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(f, out)
    shutil.copytree(src / "configs", dst / "configs", dirs_exist_ok=True)
    return dst


def test_it_does_not_store_the_partial_groups_of_a_later_half(tmp_path):
    run = default_run(tmp_path / "full")
    later = copy_steps(tmp_path / "full", tmp_path / "later", [4])
    reader = open_reader("prime-rl", later)
    groups, bad, _ = items(reader)
    stored = by_name(run, groups)
    assert sorted(stored) == ["G", "H"] and bad == []  # F's half in step 4 is not a group
    assert all(len(g["rollouts"]) == 4 for g in stored.values())
    assert reader.notes()["counts"]["incomplete_groups_not_stored"] == 1
    assert any("not stored: fewer episodes than the group size" in t for t in reader.gaps)


def test_it_flags_an_import_of_the_effective_files_alone(tmp_path):
    run = default_run(tmp_path / "full")
    only = copy_steps(tmp_path / "full", tmp_path / "eff", [1, 2, 3, 4], subsets=("effective",))
    reader = open_reader("prime-rl", only)
    groups, _, _ = items(reader)
    assert "Z" not in by_name(run, groups)
    assert any("only `effective` files were given" in t for t in reader.gaps)


def test_it_flags_what_is_unknown_without_the_config(tmp_path):
    run = default_run(tmp_path, config=False)
    reader = open_reader("prime-rl", tmp_path / "rollouts")
    groups, _, _ = items(reader)
    assert len(by_name(run, groups)["Z"]["rollouts"]) == 4
    gaps = " ".join(reader.gaps)
    assert "group size not in the files" in gaps and "train/calc-env: 4" in gaps
    assert "no configs/orchestrator.json" in gaps
    assert "assumes PRIME-RL's default GRPO" in gaps  # Z: no trained member to check against


def test_it_flags_untrained_advantages_it_cannot_know(tmp_path):
    """A length penalty shapes the advantages: the shipped ones are read, the zero-advantage
    members' cannot be derived from reward - mean (stored 0 and flagged)."""
    run = default_run(tmp_path)
    for f in (tmp_path / "rollouts").rglob("effective/traces.jsonl"):
        eps = [json.loads(x) for x in f.read_text().splitlines()]
        for ep in eps:
            for n in ep["traces"][0]["nodes"]:
                if "advantages" in n:
                    n["advantages"] = [a * 0.5 for a in n["advantages"]]
        f.write_text("".join(json.dumps(ep) + "\n" for ep in eps))
    reader = open_reader("prime-rl", tmp_path)
    a = by_name(run, items(reader)[0])["A"]["rollouts"]
    assert [r["advantage"] for r in a] == pytest.approx([0.25, -0.25, 0.0, 0.0])
    assert any("cannot be known from the files and is stored as 0" in t for t in reader.gaps)


def test_it_skips_the_group_of_a_truncated_last_line_whole(tmp_path):
    run = default_run(tmp_path)
    f = tmp_path / "rollouts" / "step_4" / "train" / "all" / "traces.jsonl"
    f.write_bytes(f.read_bytes()[:-200])  # the run was killed mid-write: H's last episode
    reader = open_reader("prime-rl", tmp_path)
    groups, bad, _ = items(reader)
    assert [b.line for b in bad] == [8] and "malformed JSON" in bad[0].message
    stored = by_name(run, groups)
    assert "H" not in stored and all(len(g["rollouts"]) == 4 for g in stored.values())
    assert reader.counts["incomplete_groups_not_stored"] == 1


# ---- per-token arrays (issue #27): the transcript's nodes (assistant 8, tool 3, assistant 5)

SAMPLER = [-0.03125 * (k + 1) for k in range(7)]
A_IDS = list(range(156, 164)) + list(range(121, 124)) + list(range(135, 140))  # fixture's nodes
A_MASK = [0] + [1] * 7 + [0] * 3 + [0] + [1] * 4  # role header, tool output: not trained
A_TURN = [0] * 8 + [1] * 3 + [2] * 5
A_SAMPLER = [0.0, *SAMPLER, 0.0, 0.0, 0.0, 0.0, *SAMPLER[:4]]


def test_it_emits_each_rollouts_token_arrays_with_the_advantages_prime_rl_shipped(tmp_path):
    run = default_run(tmp_path)
    reader = open_reader("prime-rl", tmp_path)
    a = by_name(run, items(reader)[0])["A"]["rollouts"]  # advantages .5, -.5 shipped; 0, 0 not
    for r, adv in zip(a, (0.5, -0.5, None, None), strict=True):
        want = {"ids": A_IDS, "loss_mask": A_MASK, "turn": A_TURN, "sampler_logprobs": A_SAMPLER}
        if adv is not None:  # the effective copy: one advantage per sampled token
            want["advantages"] = [adv * m for m in A_MASK]
        assert r["tokens"] == want
    # PRIME-RL's files carry no trainer log-probs, entropies or reference log-probs: none made up
    assert not {"trainer_logprobs", "entropy", "ref_logprobs"} & set(a[0]["tokens"])
    e = by_name(run, items(reader)[0])["E"]["rollouts"]
    assert "tokens" not in e[1] and e[3]["tokens"]["ids"] == A_IDS  # no trace; errored trace
    assert TOKENS_DROPPED not in reader.counts


def edit_episode(root: Path, subset: str, episode_id: str, edit) -> None:
    for f in (root / "rollouts").rglob(f"train/{subset}/traces.jsonl"):
        eps = [json.loads(x) for x in f.read_text().splitlines()]
        for ep in eps:
            if ep["id"] == episode_id:
                edit(ep["traces"][0]["nodes"])
        f.write_text("".join(json.dumps(ep) + "\n" for ep in eps))


def test_it_stores_a_rollout_with_malformed_token_arrays_without_its_tokens(tmp_path):
    run = default_run(tmp_path)
    edit_episode(tmp_path, "all", "ep-A-2", lambda n: n[4]["logprobs"].pop())  # 3 for 4 tokens
    edit_episode(tmp_path, "all", "ep-A-3", lambda n: n[2]["logprobs"].__setitem__(0, math.nan))
    edit_episode(tmp_path, "effective", "ep-A-0", lambda n: n[4]["mask"].pop())
    reader = open_reader("prime-rl", tmp_path)
    groups, bad, _ = items(reader)
    a = by_name(run, groups)["A"]["rollouts"]
    assert bad == [] and len(a) == 4 and [r["reward"] for r in a] == pytest.approx([1, 0, 0.5, 0.5])
    assert [("tokens" in r) for r in a] == [False, True, False, False]
    assert a[0]["state"]["tokens_not_stored"] == "nodes[4].mask: 4 values for 5 token_ids"
    assert a[2]["state"]["tokens_not_stored"] == "nodes[4].logprobs: 3 values for 4 sampled tokens"
    assert a[3]["state"]["tokens_not_stored"] == "nodes[2].logprobs[0]: nan is not a finite number"
    assert reader.counts[TOKENS_DROPPED] == 3
    assert any("stored without tokens" in g for g in reader.gaps)

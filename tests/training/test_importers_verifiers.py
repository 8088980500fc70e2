"""The verifiers reader on `prime eval` / `vf-eval` output built field by field from verifiers
a60a606ec: legacy `results.jsonl` + `metadata.json` (save_utils.state_to_output, save_outputs,
save_metadata; Rubric.score_group) and v1 `traces.jsonl` + `configs/eval.json`
(cli/output.py append_episode, EvalRunInfo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.training.prime_fixtures import trace_record
from tests.training.test_importers import items
from training.importers import episodes, open_reader
from training.importers.episodes import TOKENS_DROPPED

WEIGHTS = {"correct_answer": 1.0, "format_reward": 0.2, "num_turns": 0.0}


def results_row(ex: int, j: int) -> dict[str, Any]:
    """One state_to_output row of a tool-using env (MultiTurnEnv, rubric weights WEIGHTS: the
    third function is a weight-0 metric)."""
    metrics = {
        "correct_answer": float((ex + j) % 2),
        "format_reward": 0.5 * (j % 3),
        "num_turns": 2.0 + j,
    }
    tool_call = {
        "id": f"c{ex}{j}",
        "type": "function",
        "function": {"name": "search", "arguments": "{}"},
    }
    row = {
        "example_id": ex,
        "prompt": [
            {"role": "system", "content": "Answer with the tool."},
            {"role": "user", "content": f"Question {ex}"},
        ],
        "completion": [
            {"role": "assistant", "content": "", "tool_calls": [json.dumps(tool_call)]},
            {"role": "tool", "content": "result", "tool_call_id": f"c{ex}{j}"},
            {"role": "assistant", "content": f"Answer {ex}.{j}"},
        ],
        "answer": "42",
        "reward": sum(WEIGHTS[k] * v for k, v in metrics.items()),
        "error": None,
        "timing": {"generation_ms": 10.0, "scoring_ms": 1.0, "total_ms": 11.0},
        "is_completed": True,
        "is_truncated": j == 2,
        "stop_condition": "max_turns" if j == 2 else "no_tools",
        "metrics": metrics,
        "tool_defs": [{"name": "search"}],
        "token_usage": {"input_tokens": 30.0, "output_tokens": 12.0},
        **metrics,  # "flatten metrics to top-level keys (backwards compatibility)"
        "judge_notes": f"note {ex}",  # a state_columns entry
    }
    return row


def write_results(folder: Path, n_examples: int = 2, r: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [results_row(ex, j) for ex in range(n_examples) for j in range(r)]
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    meta = {
        "env_id": "tool-search",
        "env_args": {},
        "model": "qwen3-0.6b",
        "base_url": "http://localhost:8000/v1",
        "num_examples": n_examples,
        "rollouts_per_example": r,
        "sampling_args": {"max_tokens": 256},
        "time": 3.2,
        "avg_reward": sum(x["reward"] for x in rows) / len(rows),
        "avg_metrics": {},
        "state_columns": ["judge_notes"],
    }
    (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def test_it_reads_verifiers_results_grouped_by_example_with_recovered_weights(tmp_path):
    folder = write_results(tmp_path / "tool-search--qwen3")
    reader = open_reader("verifiers", tmp_path)
    groups, bad, _ = items(reader)
    assert bad == [] and [len(g.record["rollouts"]) for g in groups] == [3, 3]
    g = groups[1].record
    assert g["key"] == "tool-search--qwen3:ex-1" and g["split"] == "holdout"
    assert g["prompt"][1] == {"role": "user", "content": "Question 1"}
    r = g["rollouts"][2]
    assert r["transcript"][0]["tool_calls"][0]["function"]["name"] == "search"
    assert r["rewards"] == {"correct_answer": 1.0, "format_reward": 1.0, "num_turns": 4.0}
    assert r["reward"] == pytest.approx(1.2) and r["truncated"] is True
    rewards = [x["reward"] for x in g["rollouts"]]
    assert r["advantage"] == pytest.approx(r["reward"] - sum(rewards) / 3)  # score_group's
    assert r["state"]["columns"] == {"judge_notes": "note 1"} and r["state"]["answer"] == "42"
    settings = reader.settings()
    assert settings["group_size"] == 3
    assert settings["weights"] == pytest.approx(WEIGHTS)
    assert reader.notes().get("gaps") is None
    assert folder.exists()


def test_it_flags_weights_that_the_results_cannot_tell(tmp_path):
    folder = write_results(tmp_path / "run")
    rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    for x in rows:
        x["reward"] += 0.3 * (x["example_id"] == 1)  # a reward function missing from metrics
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    reader = open_reader("verifiers", folder)
    assert "weights" not in reader.settings()
    assert "the weights are unknown" in reader.gaps[0]


def v1_episode(task_n: int, j: int) -> dict[str, Any]:
    task = {
        "type": "QA",
        "data": {"question": f"Q{task_n}"},
        "key": f"k{task_n}",
        "hash": f"h{task_n}",
    }
    trace = trace_record(task, f"t{task_n}{j}", j, {"correct": float(j % 2), "format": 1.0})
    return {
        "id": f"e{task_n}{j}",
        "env": {"id": "calc-env"},
        "task": task,
        "run": {"type": "eval", "id": "r1", "name": "calc-env--m"},
        "ok": True,
        "errors": [],
        "traces": [trace],
    }


def test_it_reads_v1_traces_grouped_by_task(tmp_path):
    folder = tmp_path / "calc-env--m--abc"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "eval.json").write_text(json.dumps({"num_rollouts": 2, "model": "m"}))
    eps = [v1_episode(t, j) for j in range(2) for t in range(2)]
    (folder / "traces.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    reader = open_reader("verifiers", tmp_path)
    groups, bad, _ = items(reader)
    assert bad == [] and [g.record["key"] for g in groups] == [
        "calc-env--m--abc:t-k0",
        "calc-env--m--abc:t-k1",
    ]
    r = groups[0].record["rollouts"][1]
    assert r["reward"] == pytest.approx(1.0 + 0.5) and r["advantage"] == pytest.approx(0.5)
    assert reader.settings()["weights"] == {"correct": 1.0, "format": 0.5}
    assert reader.settings()["group_size"] == 2


# ---- per-token arrays (issue #27). The transcript's nodes: assistant (8 tokens, 7 sampled), tool
# (3), assistant (5, 4 sampled). Per-sampled-token node fields as verifiers' Trace/Branch spread
# them (v1/trace.py Branch.spread): logprobs, reference_logprobs, trainer_logprobs, entropies.

SAMPLED = (2, 4)  # the assistant nodes


def scored_nodes(trace: dict[str, Any]) -> None:
    """A trace whose sampled nodes also carry reference and trainer log-probs and entropies."""
    for i in SAMPLED:
        k = sum(trace["nodes"][i]["mask"])
        trace["nodes"][i]["reference_logprobs"] = [-0.5 - 0.0625 * j for j in range(k)]
        trace["nodes"][i]["trainer_logprobs"] = [-0.015625 * (j + 1) for j in range(k)]
        trace["nodes"][i]["entropies"] = [0.125 * (j + 1) for j in range(k)]


def write_v1(folder: Path, eps: list[dict[str, Any]]) -> Path:
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "eval.json").write_text(json.dumps({"num_rollouts": 2, "model": "m"}))
    (folder / "traces.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    return folder


def token_episodes() -> list[dict[str, Any]]:
    eps = [v1_episode(t, j) for j in range(2) for t in range(2)]
    scored_nodes(eps[0]["traces"][0])
    return eps


V_IDS = list(range(156, 164)) + list(range(121, 124)) + list(range(135, 140))
V_MASK = [0] + [1] * 7 + [0] * 3 + [0] + [1] * 4
V_TURN = [0] * 8 + [1] * 3 + [2] * 5


def spread(values: list[float]) -> list[float]:
    """7 + 4 per-sampled-token values on the transcript's 16 tokens: 0.0 where not sampled."""
    return [0.0, *values[:7], 0.0, 0.0, 0.0, 0.0, *values[:4]]


def test_it_emits_the_token_arrays_a_v1_trace_carries(tmp_path):
    write_v1(tmp_path / "calc-env--m--abc", token_episodes())
    reader = open_reader("verifiers", tmp_path)
    groups, bad, _ = items(reader)
    assert bad == []
    scored, plain = groups[0].record["rollouts"]  # task 0: episode e00 (scored), e01
    assert scored["tokens"] == {
        "ids": V_IDS,
        "loss_mask": V_MASK,
        "turn": V_TURN,
        "sampler_logprobs": spread([-0.03125 * (k + 1) for k in range(7)]),
        "trainer_logprobs": spread([-0.015625 * (k + 1) for k in range(7)]),
        "ref_logprobs": spread([-0.5 - 0.0625 * k for k in range(7)]),
        "entropy": spread([0.125 * (k + 1) for k in range(7)]),
    }  # an evaluation: no advantages in the file, none per token
    assert set(plain["tokens"]) == {"ids", "loss_mask", "turn", "sampler_logprobs"}
    assert "counts" not in reader.notes()


def test_it_stores_an_eval_rollout_whose_arrays_disagree_without_its_tokens(tmp_path):
    eps = token_episodes()  # eps[1]: e10, eps[3]: e11 (task 1)
    for e in (eps[1], eps[3]):
        scored_nodes(e["traces"][0])
    eps[1]["traces"][0]["nodes"][2]["reference_logprobs"][3] = 0.25  # a log-prob above 0
    eps[3]["traces"][0]["nodes"][4]["entropies"].pop()  # 3 entropies for 4 sampled tokens
    write_v1(tmp_path / "run", eps)
    reader = open_reader("verifiers", tmp_path)
    groups, bad, _ = items(reader)
    e10, e11 = groups[1].record["rollouts"]
    assert bad == [] and "tokens" not in e10 and "tokens" not in e11
    assert [e10["reward"], e11["reward"]] == pytest.approx([0.5, 1.5])  # stored all the same
    assert e10["state"]["tokens_not_stored"] == (
        "nodes[2].reference_logprobs[3]: 0.25 is out of range for a logprob"
    )
    assert e11["state"]["tokens_not_stored"] == "nodes[4].entropies: 3 values for 4 sampled tokens"
    assert reader.counts == {TOKENS_DROPPED: 2} and any("without tokens" in g for g in reader.gaps)
    assert "tokens" in groups[0].record["rollouts"][0]  # the other task's rollouts keep theirs


def test_it_leaves_out_the_tokens_of_a_trace_past_the_ingestions_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(episodes, "MAX_TOKENS", len(V_IDS) - 1)  # 262,144 by default
    write_v1(tmp_path / "run", token_episodes())
    reader = open_reader("verifiers", tmp_path)
    groups, bad, _ = items(reader)
    rollouts = [r for g in groups for r in g.record["rollouts"]]
    assert bad == [] and len(rollouts) == 4 and not any("tokens" in r for r in rollouts)
    assert rollouts[0]["state"]["tokens_not_stored"] == (
        "16 tokens; the ingestion's limit is 15 a rollout"
    )
    assert reader.counts == {TOKENS_DROPPED: 4}

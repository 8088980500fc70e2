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
from training.importers import open_reader

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

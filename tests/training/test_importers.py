"""The format readers on sample files built from each trainer's documented field names (no Django).

The sample writers here are reused by tests/webapp/test_import_command.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training import stats
from training.importers import BadRecord, GroupItem, MetricsItem, ReaderError, open_reader
from training.importers.base import stable_hash

# ----------------------------------------------------------------------------------- sample writers


def trl_rows(step: int, prompts: list[Any], g: int, seed: int = 0) -> dict[str, list[Any]]:
    """Columns exactly as TRL 1.16's GRPOTrainer.log writes them: step, prompt,
    completion, one column per reward function (here "correct" and "format"), the
    log_extra columns ("judge"), advantage."""
    rng = np.random.default_rng(seed + step)
    n = len(prompts) * g
    correct = rng.integers(0, 2, n).astype(float)
    fmt = rng.uniform(0, 1, n).round(3)
    adv = stats.compute_advantages(
        np.stack([correct, fmt], axis=1), [1.0, 1.0], group_size=g
    ).advantages
    return {
        "step": [step] * n,
        "prompt": [p for p in prompts for _ in range(g)],
        "completion": [f"answer {i} at {step}" for i in range(n)],
        "correct": correct.tolist(),
        "format": fmt.tolist(),
        "judge": [f"note {i}" for i in range(n)],
        "advantage": adv.tolist(),
    }


def write_trl(
    folder: Path, step: int, prompts: list[Any], g: int = 4, **override: list[Any]
) -> Path:
    cols = {**trl_rows(step, prompts, g), **override}
    path = folder / "completions" / f"completions_{step:05d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


def verl_lines(step: int, inputs: list[str], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Keys exactly as verl's _dump_generations writes them (input, output, gts, score, step) plus
    the reward function's extra info ("acc" numeric, "pred" a string), with the group rows
    interleaved the way balance_batch leaves them."""
    rng = np.random.default_rng(seed + step)
    rows = []
    for j in range(n):
        for i, inp in enumerate(inputs):
            acc = float(rng.integers(0, 2))
            rows.append(
                {
                    "input": inp,
                    "output": f"out {i}.{j}",
                    "gts": f"gt{i}",
                    "score": acc - 0.1 * j,
                    "step": step,
                    "acc": acc,
                    "pred": f"p{j}",
                }
            )
    return rows


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def prime_records(
    step: int, n_examples: int, g: int, *, advantages: bool = False
) -> list[dict[str, Any]]:
    recs = []
    for j in range(g):  # written as samples finish: examples interleaved
        for ex in range(n_examples):
            r = {
                "step": step,
                "problem_id": f"prob-{ex}",
                "prompt": f"Problem {ex}",
                "completion": f"sol {ex}.{j}",
                "reward": float((ex + j) % 2),
                "task_rewards": {"math": float(j % 2), "length": 0.1 * j},
                "task": "math",
            }
            if advantages:
                r["advantage"] = 0.5 - j
            recs.append(r)
    return recs


def byoo_episodes(
    step: int, n_groups: int, g: int, *, with_group_id: bool = True
) -> list[dict[str, Any]]:
    eps = []
    for k in range(g):
        for gi in range(n_groups):
            ep = {
                "episode_id": f"ep-{step}-{gi}-{k}",
                "step": step,
                "turns": [
                    {"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": f"task {gi}"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"type": "function", "function": {"name": "search", "arguments": "{}"}}
                        ],
                    },
                    {"role": "tool", "content": "results", "name": "search"},
                    {"role": "assistant", "content": f"done {gi}.{k}"},
                ],
                "aggregate_reward_score": float(k) / g,
                "sub_metrics": {"task_success": float(k % 2), "tool use": 0.5},
            }
            if with_group_id:
                ep["group_id"] = f"grp-{gi}"
            eps.append(ep)
    return eps


def items(reader) -> tuple[list[GroupItem], list[BadRecord], list[MetricsItem]]:
    out = list(reader.read())
    return (
        [i for i in out if isinstance(i, GroupItem)],
        [i for i in out if isinstance(i, BadRecord)],
        [i for i in out if isinstance(i, MetricsItem)],
    )


# ---------------------------------------------------------------------------------------------- TRL


def test_it_groups_trl_rows_by_consecutive_prompt(tmp_path):
    write_trl(tmp_path, 3, ["What is 2+2?", "Name a prime.", "What is 2+2?"], g=4)
    reader = open_reader("trl", tmp_path)
    groups, bad, _ = items(reader)
    assert bad == []
    assert [(g.record["step"], len(g.record["rollouts"])) for g in groups] == [(3, 4)] * 3
    # The same prompt drawn twice in the step is two groups with distinct, stable keys.
    k0, k1, k2 = (g.record["key"] for g in groups)
    assert k2 == f"{k0}#1" and k0 != k1
    cols = trl_rows(3, ["What is 2+2?", "Name a prime.", "What is 2+2?"], 4)
    r5 = groups[1].record["rollouts"][1]
    assert r5["completion"] == cols["completion"][5]
    assert r5["rewards"] == {"correct": cols["correct"][5], "format": cols["format"][5]}
    assert r5["advantage"] == pytest.approx(cols["advantage"][5])
    assert r5["state"] == {"extra": {"judge": "note 5"}}  # the log_extra column is not a component
    assert groups[1].rollout_lines == [5, 6, 7, 8]
    assert reader.sample_components() == ["correct", "format"]


def test_it_reads_conversational_trl_logs(tmp_path):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    completion = [{"role": "assistant", "content": "Hello"}]
    write_trl(
        tmp_path, 1, [prompt], g=2, completion=[completion, completion], correct=[float("nan"), 1.0]
    )
    (g,), bad, _ = items(open_reader("trl", tmp_path / "completions" / "completions_00001.parquet"))
    assert bad == []
    assert g.record["prompt"] == prompt
    assert g.record["rollouts"][0]["transcript"] == completion
    assert (
        g.record["rollouts"][0]["rewards"]["correct"] is None
    )  # a reward function's None, stored as NaN


def test_it_splits_trl_runs_by_group_size_and_rejects_a_remainder(tmp_path):
    write_trl(tmp_path, 0, ["A"], g=8)
    groups, bad, _ = items(open_reader("trl", tmp_path, group_size=4))
    assert [len(g.record["rollouts"]) for g in groups] == [4, 4] and bad == []
    groups, bad, _ = items(open_reader("trl", tmp_path, group_size=3))
    assert groups == [] and bad[0].records == 8 and "multiple of the group size 3" in bad[0].message


def test_it_drops_the_whole_trl_group_of_a_bad_row(tmp_path):
    cols = trl_rows(2, ["A", "B"], 4)
    cols["completion"][5] = None  # row 6, in the second group
    path = write_trl(tmp_path, 2, ["A", "B"], g=4, completion=cols["completion"])
    groups, bad, _ = items(open_reader("trl", path))
    assert [g.record["prompt"] for g in groups] == ["A"]
    assert (bad[0].line, bad[0].records) == (6, 1) and "completion" in bad[0].message
    assert (bad[1].line, bad[1].records) == (5, 3)  # the group's three good rows, dropped with it


def test_it_skips_a_trl_file_that_repeats_the_previous_generation_batch(tmp_path):
    cols = trl_rows(1, ["A"], 2)
    write_trl(tmp_path, 1, ["A"], g=2)
    write_trl(
        tmp_path, 2, ["A"], g=2, completion=cols["completion"]
    )  # same prompts and completions
    write_trl(tmp_path, 3, ["B"], g=2)
    reader = open_reader("trl", tmp_path)
    groups, _, _ = items(reader)
    assert [g.record["step"] for g in groups] == [1, 3]
    assert reader.duplicates == ["completions_00002.parquet"]


def test_it_uses_only_the_named_components(tmp_path):
    write_trl(tmp_path, 0, ["A"], g=2)
    (g,), _, _ = items(open_reader("trl", tmp_path, components=["correct"]))
    r = g.record["rollouts"][0]
    assert list(r["rewards"]) == ["correct"] and "format" in r["state"]["extra"]


def test_it_refuses_a_folder_without_trl_files(tmp_path):
    with pytest.raises(ReaderError, match="completions_<step>.parquet"):
        open_reader("trl", tmp_path).files()


# --------------------------------------------------------------------------------------------- verl


def test_it_groups_verl_rows_by_input_within_step_even_when_interleaved(tmp_path):
    write_jsonl(tmp_path / "rollouts" / "7.jsonl", verl_lines(7, ["Q1", "Q2", "Q3"], n=4))
    write_jsonl(tmp_path / "rollouts" / "10.jsonl", verl_lines(10, ["Q1"], n=4))
    reader = open_reader("verl", tmp_path / "rollouts")
    assert [f.name for f in reader.files()] == ["7.jsonl", "10.jsonl"]  # by step, not by string
    groups, bad, _ = items(reader)
    assert bad == []
    assert [(g.record["step"], g.record["prompt"], len(g.record["rollouts"])) for g in groups] == [
        (7, "Q1", 4),
        (7, "Q2", 4),
        (7, "Q3", 4),
        (10, "Q1", 4),
    ]
    q2 = groups[1]
    assert q2.rollout_lines == [2, 5, 8, 11]
    r = q2.record["rollouts"][3]
    # score = acc - 0.1 x j is no weighted sum of acc: the rest of it is its own component
    assert r["completion"] == "out 1.3" and list(r["rewards"]) == ["acc", "unexplained"]
    assert r["state"] == {"gts": "gt1", "extra": {"pred": "p3"}}
    scores = np.array([x["reward"] for x in q2.record["rollouts"]])
    expected = (scores - scores.mean()) / (
        scores.std(ddof=1) + 1e-6
    )  # verl's epsilon, not TRL's 1e-4
    assert [x["advantage"] for x in q2.record["rollouts"]] == pytest.approx(
        expected.tolist(), abs=1e-9
    )
    assert reader.sample_components() == ["acc", "unexplained"]
    settings = reader.settings()
    assert settings["weights"]["unexplained"] == 1.0 and settings["advantage_epsilon"] == 1e-6
    assert reader.notes()["weights"].startswith("unknown: score is not a weighted sum")


def test_it_groups_verl_rows_by_uid_and_stores_boolean_extras_as_0_or_1(tmp_path):
    """verl's math reward returns acc as a bool; a reward function may return the
    batch's uid too."""
    lines = verl_lines(3, ["Q1"], n=4)  # one prompt drawn twice in the step: two uids
    for j, line in enumerate(lines):
        line.update(acc=bool(j % 2), score=float(j % 2), uid=f"u{j // 2}")
    reader = open_reader(
        "verl", write_jsonl(tmp_path / "3.jsonl", lines), components=["acc"], scale_rewards="none"
    )  # norm_adv_by_std_in_grpo=False
    groups, bad, _ = items(reader)
    assert bad == [] and [(g.record["key"], len(g.record["rollouts"])) for g in groups] == [
        ("uid-u0", 2),
        ("uid-u1", 2),
    ]
    r0, r1 = groups[0].record["rollouts"]
    assert (r0["rewards"], r1["rewards"]) == ({"acc": 0.0}, {"acc": 1.0})
    mean = (r0["reward"] + r1["reward"]) / 2
    assert r1["advantage"] == pytest.approx(r1["reward"] - mean)  # no std: r - mean
    assert reader.settings()["scale_rewards"] == "none"


def test_it_gives_a_lone_verl_sample_verls_advantage(tmp_path):
    (line,) = verl_lines(2, ["Q1"], n=1)
    (g,), _, _ = items(
        open_reader("verl", write_jsonl(tmp_path / "2.jsonl", [dict(line, score=0.5)]))
    )
    assert g.record["rollouts"][0]["advantage"] == pytest.approx(
        0.5 / (1 + 1e-6)
    )  # mean 0, std 1 in verl


def test_it_reports_a_bad_verl_line_with_its_number_and_drops_its_group(tmp_path):
    lines: list[Any] = verl_lines(1, ["Q1", "Q2"], n=2)
    lines[2] = dict(lines[2], score="high")  # line 3: Q1's second sample
    lines.insert(1, "{not json")  # line 2: group unknown, reported alone
    path = write_jsonl(tmp_path / "1.jsonl", lines)
    groups, bad, _ = items(open_reader("verl", path))
    assert [g.record["prompt"] for g in groups] == ["Q2"]
    assert [(b.line, b.records) for b in bad] == [(2, 1), (4, 1), (1, 1)]
    assert "malformed JSON" in bad[0].message and "score: must be a number" in bad[1].message
    assert "line 4" in bad[2].message  # Q1's good line, dropped with the bad one


# ----------------------------------------------------------------------------------------- PRIME-RL


def test_it_groups_prime_rl_records_by_example_id(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", prime_records(5, n_examples=2, g=3, advantages=True))
    groups, bad, _ = items(open_reader("prime-rl", path))
    assert bad == []
    assert [(g.record["key"], len(g.record["rollouts"])) for g in groups] == [
        ("ex-prob-0", 3),
        ("ex-prob-1", 3),
    ]
    r = groups[1].record["rollouts"][2]
    assert r == {
        "index": 2,
        "completion": "sol 1.2",
        "reward": 1.0,
        "advantage": -1.5,
        "rewards": {"math": 0.0, "length": pytest.approx(0.2)},
        "state": {"task": "math"},
    }


def test_it_refuses_a_prime_rl_group_with_some_advantages_missing(tmp_path):
    recs = prime_records(0, n_examples=1, g=2, advantages=True)
    del recs[1]["advantage"]
    groups, bad, _ = items(open_reader("prime-rl", write_jsonl(tmp_path / "r.jsonl", recs)))
    assert groups == [] and bad[0].records == 2 and "give all or none" in bad[0].message


# --------------------------------------------------------------------------------------------- BYOO


def test_it_turns_byoo_episodes_into_transcript_groups(tmp_path):
    path = write_jsonl(tmp_path / "eps.jsonl", byoo_episodes(2, n_groups=2, g=3))
    reader = open_reader("byoo", path)
    groups, bad, _ = items(reader)
    assert bad == []
    assert [(g.record["key"], len(g.record["rollouts"])) for g in groups] == [
        ("g-grp-0", 3),
        ("g-grp-1", 3),
    ]
    g = groups[0].record
    # No prompt field: the turns before the first assistant turn are the prompt.
    assert [m["role"] for m in g["prompt"]] == ["system", "user"]
    r = g["rollouts"][1]
    assert [m["role"] for m in r["transcript"]] == ["assistant", "tool", "assistant"]
    assert r["transcript"][0]["tool_calls"][0]["function"]["name"] == "search"
    assert r["reward"] == pytest.approx(1 / 3)
    # names made acceptable, deterministically; k / g is no weighted sum of the sub-metrics
    assert list(r["rewards"]) == ["task_success", "tool_use", "unexplained"]
    assert (r["rewards"]["task_success"], r["rewards"]["tool_use"]) == (1.0, 0.5)
    weights = reader.settings()["weights"]
    assert sum(weights[k] * v for k, v in r["rewards"].items()) == pytest.approx(1 / 3)
    assert reader.notes()["weights"].startswith("unknown: aggregate_reward_score is not")
    assert r["state"] == {"episode_id": "ep-2-0-1"}
    assert reader.sample_components() == ["task_success", "tool_use", "unexplained"]


def test_it_groups_byoo_episodes_without_group_id_by_prompt(tmp_path):
    path = write_jsonl(
        tmp_path / "eps.jsonl", byoo_episodes(0, n_groups=3, g=2, with_group_id=False)
    )
    groups, _, _ = items(open_reader("byoo", path))
    assert [len(g.record["rollouts"]) for g in groups] == [2, 2, 2]
    assert all(g.record["key"].startswith("p-") for g in groups)


def test_it_names_the_bad_turn_of_a_byoo_episode(tmp_path):
    eps = byoo_episodes(0, n_groups=1, g=2)
    eps[1]["turns"][1]["role"] = "human"
    groups, bad, _ = items(open_reader("byoo", write_jsonl(tmp_path / "eps.jsonl", eps)))
    assert groups == []  # the other episode of its group goes with it
    assert bad[0].line == 2 and "turns[1].role" in bad[0].message
    assert (bad[1].line, bad[1].records) == (1, 1)


# -------------------------------------------------------------------------------------------- JSONL


def test_it_reads_ingestion_jsonl_and_the_jsonl_sink_format(tmp_path):
    group = {
        "step": 0,
        "key": "a",
        "prompt": "p",
        "rollouts": [{"index": 0, "completion": "x", "rewards": {"c": 1}}],
    }
    path = write_jsonl(
        tmp_path / "x.jsonl",
        [
            group,
            {"type": "group", **dict(group, key="b")},
            {"type": "metrics", "step": 0, "values": {"loss": 0.5}},
            {"type": "log", "line": "hello"},
            "",
            "[1, 2]",
        ],
    )
    reader = open_reader("jsonl", path)
    groups, bad, metrics = items(reader)
    assert [g.record["key"] for g in groups] == ["a", "b"] and "type" not in groups[1].record
    assert metrics[0].record == {"step": 0, "values": {"loss": 0.5}}
    assert [(b.line, b.message) for b in bad] == [(6, "must be a JSON object, got list")]
    assert reader.sample_components() == ["c"]


def test_it_streams_jsonl_instead_of_reading_the_file_first(tmp_path):
    group = {
        "step": 0,
        "key": "k",
        "prompt": "p",
        "rollouts": [{"index": 0, "completion": "x" * 1000}],
    }
    path = write_jsonl(tmp_path / "big.jsonl", [dict(group, key=f"k{i}") for i in range(500)])
    read = []
    it = open_reader("jsonl", path).read(read.append)
    next(it)
    assert sum(read) < path.stat().st_size / 100  # the first group came after reading one line


def test_it_reads_nan_as_not_scored():
    from training.importers.base import finite_or_none, parse_json_object

    obj = parse_json_object(b'{"score": NaN}')
    assert math.isnan(obj["score"]) and finite_or_none(obj["score"]) is None


def test_it_keeps_the_recorders_log_extra_columns_out_of_the_components(tmp_path):
    cols = trl_rows(0, ["A"], 2)
    write_trl(
        tmp_path,
        0,
        ["A"],
        g=2,
        **{
            "recorder/length": [12, 7],
            "recorder/truncated": [False, True],
            "reason/correct": ["right", "wrong"],
        },
    )
    reader = open_reader("trl", tmp_path)
    (g,), bad, _ = items(reader)
    assert bad == [] and reader.sample_components() == ["correct", "format"]
    r = g.record["rollouts"][1]
    assert (
        list(r["rewards"]) == ["correct", "format"] and r["state"]["extra"]["recorder/length"] == 7
    )
    assert "reward" not in r  # no weights known: the run's weights make the aggregate at ingestion
    weighted = open_reader("trl", tmp_path, weights={"correct": 2.0, "format": -0.5})
    (g,), _, _ = items(weighted)
    assert g.record["rollouts"][1]["reward"] == pytest.approx(
        2.0 * cols["correct"][1] - 0.5 * cols["format"][1]
    )


def test_it_cleans_trl_text_as_the_recorders_sink_does(tmp_path):
    from training.sinks import storable

    prompt = [{"role": "user", "content": "draw\x00 it"}]
    write_trl(
        tmp_path, 0, [prompt], g=2, completion=["a\x00b", "plain"]
    )  # parquet cannot hold a lone surrogate
    (g,), bad, _ = items(open_reader("trl", tmp_path))
    assert bad == []
    assert g.record["prompt"][0]["content"] == "draw\ufffd it"
    assert (
        [r["completion"] for r in g.record["rollouts"]]
        == [storable("a\x00b"), "plain"]
        == ["a\ufffdb", "plain"]
    )


def test_it_reads_the_recorders_settings_file_beside_the_completions(tmp_path):
    write_trl(
        tmp_path, 0, ["A", "B"], g=2, completion=[f"c{i}" for i in range(4)], prompt=["A"] * 4
    )
    (tmp_path / "reward_settings.json").write_text(
        json.dumps({"weights": {"correct": 3.0}, "group_size": 2, "scale_rewards": "batch"})
    )
    reader = open_reader("trl", tmp_path / "completions")
    groups, bad, _ = items(reader)
    assert bad == [] and [len(g.record["rollouts"]) for g in groups] == [
        2,
        2,
    ]  # one prompt drawn twice
    assert reader.sample_components() == [
        "correct"
    ]  # only the reward functions the trainer weighted
    assert reader.settings()["scale_rewards"] == "batch"
    (tmp_path / "reward_settings.json").write_text("[1, 2]")
    with pytest.raises(ReaderError, match="reward_settings.json: must be a JSON object"):
        open_reader("trl", tmp_path)


@pytest.mark.slow
def test_it_imports_a_real_trl_run_with_its_weights_groups_and_only_its_reward_functions(
    tiny_model, tmp_path
):
    """TRL's own completions parquet (log_completions) from a real GRPO run on the tiny model,
    with the recorder attached: its log_extra columns are in the parquet, and one prompt is drawn
    twice per step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from training.recorder import RolloutRecorder
    from training.sinks import MemorySink

    def distinct_chars(prompts, completions, **kwargs):
        return [len(set(c)) / 40.0 for c in completions]

    def has_digit(prompts, completions, **kwargs):
        return [
            None if i % 4 == 0 else float(any(ch.isdigit() for ch in c))
            for i, c in enumerate(completions)
        ]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=4,
        per_device_train_batch_size=8,  # 2 prompts x 4
        max_completion_length=12,
        learning_rate=1e-3,
        logging_steps=1,
        max_steps=2,  # 2 steps: 2 parquet files
        reward_weights=[2.0, -1.5],
        log_completions=True,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    same = [
        {"prompt": "Draw a diagram:"}
    ] * 8  # every step draws this prompt twice: 8 consecutive rows
    trainer = GRPOTrainer(
        model=tiny_model,
        reward_funcs=[distinct_chars, has_digit],
        args=args,
        train_dataset=Dataset.from_list(same),
    )
    sink = MemorySink()
    RolloutRecorder.attach(trainer, sink)
    trainer.train()

    reader = open_reader("trl", tmp_path / "out")
    assert set(pq.read_schema(reader.files()[0]).names) >= {"recorder/length", "distinct_chars"}
    groups, bad, _ = items(reader)
    assert bad == [] and reader.sample_components() == ["distinct_chars", "has_digit"]
    assert [len(g.record["rollouts"]) for g in groups] == [
        4
    ] * 4  # split by G from the settings file
    assert reader.settings()["weights"] == {"distinct_chars": 2.0, "has_digit": -1.5}
    recorded = {(g["step"], r["completion"]): r for g in sink.groups for r in g["rollouts"]}
    for g in groups:
        for r in g.record["rollouts"]:
            expected = recorded[(g.record["step"], r["completion"])]
            assert r["reward"] == pytest.approx(expected["reward"], abs=1e-6)  # TRL's weighted sum
            assert r["advantage"] == pytest.approx(expected["advantage"], abs=1e-6)
            assert set(r["rewards"]) == {"distinct_chars", "has_digit"}


# -------------------------------------------------------------------------------- PRIME-RL episodes


def prime_episode(
    step: int,
    group: str,
    j: int,
    *,
    kind: str = "train",
    advantages: float | None = None,
    ok: bool = True,
) -> dict[str, Any]:
    """One verifiers Episode.to_record() as PRIME-RL's FileMonitor writes it
    (verifiers/v1/episode.py, trace.py, graph.py; model_dump(mode="json", exclude_none=True): None
    fields are left out)."""
    task = {
        "type": "MathTask",
        "data": {"question": f"Q {group}", "answer": "4"},
        "key": f"task-{group}",
        "hash": stable_hash(group),
    }
    assistant = {
        "parent": 1,
        "message": {"role": "assistant", "content": f"answer {group}.{j}"},
        "sampled": True,
        "timestamp": 1.0,
        "token_ids": [5, 6, 7],
        "mask": [True, True, True],
        "is_content": [],
        "logprobs": [-0.1, -0.2, -0.3],
    }
    if advantages is not None:
        assistant["advantages"] = [advantages] * 3
    trace = {
        "version": 1,
        "id": f"tr-{group}-{j}",
        "verifiers": {"version": "0.2.0"},
        "task": task,
        "agent": {"config": {"id": "single-turn"}, "name": "agent", "trainable": True},
        "tools": [],
        "nodes": [
            {
                "message": {"role": "system", "content": "Be brief."},
                "sampled": False,
                "timestamp": 1.0,
                "token_ids": [1],
                "mask": [False],
                "is_content": [],
                "logprobs": [],
            },
            {
                "parent": 0,
                "message": {"role": "user", "content": [{"type": "text", "text": f"Q {group}"}]},
                "sampled": False,
                "timestamp": 1.0,
                "token_ids": [2, 3],
                "mask": [False, False],
                "is_content": [],
                "logprobs": [],
            },
            assistant,
        ],
        "calls": [],
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": {
            "correct": {"score": float(j % 2), "weight": 1.0},
            "brevity": {"score": 0.1 * j, "weight": 0.5},
        },
        "metrics": {"num_turns": 1.0},
        "info": {},
        "extra_usage": [],
        "is_completed": True,
        "ok": ok,
        "stop_condition": "completed",
        "errors": [],
        "timing": {
            "start": 1.0,
            "boot": {"start": 0.0, "end": 0.0},
            "setup": {"start": 0.0, "end": 0.0},
        },
    }
    return {
        "id": f"ep-{group}-{j}",
        "env": {"id": "math", "name": "math"},
        "task": task,
        "group": {"id": group},
        "run": {
            "type": "train",
            "id": "run-1",
            "work": {"type": kind, "step": step, "policy": {"start": step, "end": step}},
        },
        "ok": ok,
        "errors": [],
        "traces": [trace],
    }


def write_prime_run(root: Path) -> Path:
    for step in (1, 2):
        eps = [  # written as they finish; PRIME-RL's group ids are uuids, unique in a run
            prime_episode(step, f"{g}{step}", j) for j in range(3) for g in ("a", "b")
        ]
        write_jsonl(
            root / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl", eps
        )
        write_jsonl(root / "rollouts" / f"step_{step}" / "train" / "all" / "traces.jsonl", eps)
    write_jsonl(
        root / "rollouts" / "step_2" / "eval" / "all" / "traces.jsonl",
        [prime_episode(2, "e", j, kind="eval") for j in range(2)],
    )
    return root


def test_it_reads_prime_rl_traces_files_recursively_grouped_by_group_id(tmp_path):
    reader = open_reader("prime-rl", write_prime_run(tmp_path))
    groups, bad, _ = items(reader)
    assert bad == []
    assert [
        (
            g.record["step"],
            g.record["key"],
            len(g.record["rollouts"]),
            g.record.get("split", "train"),
        )
        for g in groups
    ] == [
        (1, "g-a1", 3, "train"),
        (1, "g-b1", 3, "train"),
        (2, "g-e", 2, "holdout"),
        (2, "g-a2", 3, "train"),
        (2, "g-b2", 3, "train"),
    ]
    assert reader.duplicates == []  # all and effective: one set of episodes, combined
    g = groups[0].record
    assert g["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q a1"},
    ]
    r = g["rollouts"][1]
    assert r["transcript"] == [{"role": "assistant", "content": "answer a1.1"}]
    assert r["rewards"] == {"correct": 1.0, "brevity": pytest.approx(0.1)}
    assert r["reward"] == pytest.approx(
        1.0 + 0.5 * 0.1
    )  # the trace's reward: sum of score x weight
    rewards = [x["reward"] for x in g["rollouts"]]
    assert r["advantage"] == pytest.approx(
        r["reward"] - sum(rewards) / 3
    )  # PRIME-RL GRPO: r - group mean
    assert r["state"]["stop_condition"] == "completed" and r["state"]["metrics"] == {
        "num_turns": 1.0
    }
    assert reader.settings() == {
        "weights": {"correct": 1.0, "brevity": 0.5},
        "scale_rewards": "none",
    }


def test_it_takes_prime_rl_token_advantages_and_keeps_an_episode_without_traces(tmp_path):
    eps = [prime_episode(3, "a", j, advantages=0.25 * j) for j in range(2)]
    failed = prime_episode(3, "b", 0, ok=False)
    failed["traces"], failed["errors"] = (
        [],
        [{"type": "TimeoutError", "message": "sandbox timed out"}],
    )
    failed["group"] = {"id": "a"}
    path = write_jsonl(tmp_path / "traces.jsonl", [*eps, failed])
    groups, bad, _ = items(open_reader("prime-rl", path))
    rollouts = groups[0].record["rollouts"]
    assert bad == [] and [r["advantage"] for r in rollouts] == [0.0, 0.25, 0.0]
    assert rollouts[2]["state"]["errors"] == "TimeoutError: sandbox timed out"


def rft_record(sample_id: str, question: str, answer: str, accuracy: float) -> dict[str, Any]:
    """A reward Lambda's sample (id, messages, reference_answer) joined with its output, field for
    field as the Bedrock / Nova RFT template writes it: {id, aggregate_reward_score, metrics_list:
    [{name, value, type}]}."""
    return {
        "id": sample_id,
        "messages": [
            {"role": "system", "content": "Answer."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ],
        "reference_answer": {"answer": "4"},
        "aggregate_reward_score": 0.7 * accuracy + 0.3,
        "metrics_list": [
            {"name": "accuracy", "value": accuracy, "type": "Reward"},
            {"name": "policy_compliance", "value": 1.0, "type": "Metric"},
            {"name": "exact", "value": accuracy == 1.0, "type": "Metric"},
        ],
    }


def test_it_reads_byoo_metrics_list_as_components(tmp_path):
    recs = [
        rft_record(f"s{i}", "2+2?", a, acc)
        for i, (a, acc) in enumerate([("4", 1.0), ("5", 0.0), ("4", 1.0)])
    ]
    reader = open_reader("byoo", write_jsonl(tmp_path / "rft.jsonl", recs))
    (g,), bad, _ = items(reader)
    names = ["accuracy", "policy_compliance", "exact", "unexplained"]
    assert bad == [] and reader.sample_components() == names
    r = g.record["rollouts"][1]
    # 3 episodes cannot tell the weights of 3 metrics: the whole aggregate is 'unexplained'
    assert r["rewards"] == {
        **dict.fromkeys(names[:3], 0.0),
        "policy_compliance": 1.0,
        "unexplained": pytest.approx(0.3),
    }
    assert reader.notes()["weights"].startswith("unknown: 3 rows are too few")
    assert r["reward"] == pytest.approx(0.3) and r["transcript"] == [
        {"role": "assistant", "content": "5"}
    ]
    assert r["state"]["episode_id"] == "s1" and r["state"]["metric_types"]["accuracy"] == "Reward"
    assert g.record["prompt"][1] == {"role": "user", "content": "2+2?"}


def test_it_names_messages_for_a_reward_output_without_its_sample(tmp_path):
    out = {k: v for k, v in rft_record("s0", "2+2?", "4", 1.0).items() if k != "messages"}
    _, bad, _ = items(open_reader("byoo", write_jsonl(tmp_path / "rft.jsonl", [out])))
    assert bad[0].line == 1 and bad[0].message.startswith("messages: is required")


def test_a_verl_import_says_its_file_carries_no_tokens(tmp_path):
    """verl's _dump_generations writes decoded text, score and reward extras, never a token
    array: a flagged gap in the import's notes, not silence."""
    reader = open_reader("verl", write_jsonl(tmp_path / "1.jsonl", verl_lines(1, ["Q1"], n=2)))
    groups, bad, _ = items(reader)
    assert bad == [] and all("tokens" not in r for g in groups for r in g.record["rollouts"])
    (gap,) = reader.notes()["gaps"]
    assert gap.startswith("tokens: none") and "rollout_log_probs" in gap

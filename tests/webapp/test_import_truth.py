"""What the trainer trained on, and nothing invented: verl dumps and TRL completion logs imported
without the recorder, checked against the numbers the trainer itself used (issue 25).

The verl files are built the way `RayPPOTrainer._log_rollout_data` / `_dump_generations`
(verl/trainer/ppo/ray_trainer.py, b178a3cd5) writes them: the batch is repeated `rollout.n` times
(interleave=True), reordered by `_balance_batch`, scored by a reward manager that appends every key
of a dict result (its "score" included) to reward_extra_info, and dumped one `json.dumps(entry,
ensure_ascii=False)` per line with keys input, output, gts, score, step, then every
reward_extra_info key whose list has one value per sample.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.webapp.test_import_command import run_import
from training import stats
from training.importers.base import RecordError, parse_json_object
from webapp.rollouts.arrays import load_run_arrays
from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

Score = Callable[[int, int, np.random.Generator], Any]  # (prompt, sample, rng) -> compute_score


def verl_dump(
    folder: Path, step: int, prompts: list[str], n: int, score: Score, *, seed: int = 0
) -> Path:
    """One `<step>.jsonl` as verl writes it; `prompts` may repeat (a prompt drawn twice)."""
    rng = np.random.default_rng(seed + step)
    samples = [(p, i, j) for i, p in enumerate(prompts) for j in range(n)]  # repeat, interleave
    order = rng.permutation(len(samples))  # _balance_batch reorders the whole batch
    samples = [samples[k] for k in order]
    extra: dict[str, list[Any]] = {}
    scores = []
    for _, i, j in samples:
        result = score(i, j, rng)
        if isinstance(result, dict):  # naive reward manager: every key, "score" too
            for key, value in result.items():
                extra.setdefault(key, []).append(value)
            scores.append(result["score"])
        else:
            scores.append(result)
    base: dict[str, list[Any]] = {
        "input": [p for p, _, _ in samples],
        "output": [f"response {i}.{j}" for _, i, j in samples],
        "gts": [f"answer {i}" for _, i, _ in samples],
        "score": scores,
        "step": [step] * len(samples),
    }
    for key, values in extra.items():
        if len(values) == len(samples):
            base[key] = values
    lines = [
        json.dumps({k: v[i] for k, v in base.items()}, ensure_ascii=False)
        for i in range(len(samples))
    ]
    path = folder / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def acc_and_format(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
    """A reward function whose score is acc + 0.2 x format (not weight 1 for both)."""
    acc = bool(rng.integers(0, 2))
    fmt = float(rng.integers(0, 6)) / 5
    return {"score": float(acc) + 0.2 * fmt, "acc": acc, "format": fmt, "pred": f"p{j}"}


def stored(run: Run) -> list[Rollout]:
    return list(Rollout.objects.filter(run=run).order_by("id"))


def replayed_advantages(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(what an unchanged ablation recomputes, what is stored), row for row."""
    data = load_run_arrays(run)
    settings = run.advantage_settings()
    result = stats.compute_advantages(
        data.matrix,
        [c.weight for c in data.components],
        data.group_ids,
        scale_rewards=settings["scale_rewards"],
        aggregation=settings["aggregation"],
        batch_ids=data.steps,
        eps=settings["advantage_epsilon"],
    )
    by_id = dict(Rollout.objects.filter(run=run).values_list("id", "advantage"))
    return result.advantages, np.array([by_id[i] for i in data.rollout_ids.tolist()])


# --------------------------------------------------------------------------------------------- verl


def test_it_keeps_a_null_or_nan_verl_score_missing(tmp_path):
    def score(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
        missing = {(0, 1): None, (1, 2): float("nan")}  # json.dumps writes NaN for nan
        s = missing.get((i, j), 0.7 * (j % 2))
        return {"score": s, "acc": 0.7 * (j % 2)}

    verl_dump(tmp_path, 1, ["Q0", "Q1"], 4, score)
    run_import(tmp_path, "verl", run="verl-null")
    run = Run.objects.get(name="verl-null")
    missing = [r for r in stored(run) if r.completion in ("response 0.1", "response 1.2")]
    assert [r.reward for r in missing] == [None, None]  # not 0.7 = acc x an assumed weight 1


def test_a_verl_import_flags_that_its_dump_has_no_tokens(tmp_path):
    verl_dump(tmp_path, 1, ["Q0"], 2, acc_and_format)
    out, _ = run_import(tmp_path, "verl", run="verl-tokens")
    (gap,) = Run.objects.get(name="verl-tokens").summary["import"]["gaps"]
    assert gap.startswith("tokens: none") and f"not known from the files: {gap}" in out


def test_it_recovers_verl_weights_so_an_unchanged_ablation_reproduces_the_trainer(tmp_path):
    for step in (1, 2):
        verl_dump(tmp_path, step, ["Q0", "Q1", "Q2"], 4, acc_and_format)
    out, _ = run_import(tmp_path, "verl", run="verl-w")
    run = Run.objects.get(name="verl-w")
    assert run.reward_weights() == {"acc": 1.0, "format": 0.2}
    assert run.summary["import"]["weights"].startswith("recovered: score = 1 x acc + 0.2 x format")
    assert "weights: recovered" in out
    recomputed, trained = replayed_advantages(run)
    assert np.abs(recomputed - trained).max() < 1e-9


def test_it_keeps_what_no_weighted_sum_explains_as_its_own_component(tmp_path):
    def judged(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
        base = acc_and_format(i, j, rng)  # plus a judge's score the function did not log
        return {**base, "score": base["score"] + float(rng.uniform(0, 0.5))}

    def math_dapo(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
        acc = bool(rng.integers(0, 2))  # verl's math_dapo: score 1.0 or -1.0, acc a bool
        return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": "x"}

    verl_dump(tmp_path / "judged", 1, ["Q0", "Q1", "Q2"], 4, judged)
    verl_dump(tmp_path / "dapo", 1, ["Q0", "Q1", "Q2"], 4, math_dapo)
    run_import(tmp_path / "judged", "verl", run="verl-judged")
    run_import(tmp_path / "dapo", "verl", run="verl-dapo")
    for name, note in (("verl-judged", "unknown: score is not"), ("verl-dapo", "recovered")):
        run = Run.objects.get(name=name)
        assert run.summary["import"]["weights"].startswith(note)
        assert run.reward_weights()["unexplained"] == 1.0
        recomputed, trained = replayed_advantages(run)
        assert np.abs(recomputed - trained).max() < 1e-9  # the sum is what verl trained on
    dapo = Run.objects.get(name="verl-dapo")
    assert dapo.reward_weights() == {"acc": 2.0, "unexplained": 1.0}
    unexplained = {r.scores.get(component__name="unexplained").value for r in stored(dapo)}
    assert unexplained == {-1.0}  # a constant: it moves no advantage


def test_it_leaves_out_a_prompt_drawn_twice_in_a_step_without_a_uid(tmp_path):
    path = verl_dump(tmp_path, 3, ["Q0", "Q1", "Q0"], 4, acc_and_format)
    for args, name in (((), "twice"), (("--group-size", "4"), "twice-g4")):
        out, err = run_import(path, "verl", *args, run=name)
        run = Run.objects.get(name=name)
        assert list(Group.objects.filter(run=run).values_list("prompt", "size")) == [("Q1", 4)]
        summary = run.summary["import"]
        assert summary["left_out_records"] == 8 and summary["flags"]["ungroupable_rows"] == 8
        assert "Q0" not in err and "8 rows share this prompt, 2 groups of 4" in err
        assert "8 left out (grouping unknown)" in out


def test_it_splits_a_prompt_drawn_twice_by_the_uid_the_rows_carry(tmp_path):
    def with_uid(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
        return {**acc_and_format(i, j, rng), "uid": f"u{i}"}  # returned by the reward function

    verl_dump(tmp_path, 3, ["Q0", "Q1", "Q0"], 4, with_uid)
    run_import(tmp_path, "verl", run="uid")
    sizes = Group.objects.filter(run__name="uid").values_list("prompt", "size")
    assert sorted(sizes) == [("Q0", 4), ("Q0", 4), ("Q1", 4)]


def dapo_dump(folder: Path, step: int, *, dict_result: bool) -> list[float]:
    """verl's DAPO reward manager (verl/workers/reward_manager/dapo.py) with overlong_buffer enabled
    and logged: reward = score + overlong_reward, overlong_reward = min(-exceed / buffer_len x
    factor, 0). A dict result (math_dapo: score +-1, acc a bool, pred) puts its keys in
    reward_extra_info, whose "score" replaces the dumped one (token_level_scores summed); a number
    goes to reward_extra_info["acc"]. Returns what verl trained on, in dump order."""
    rng = np.random.default_rng(step)
    max_len, buffer_len, factor = 64, 16, 1.0
    rows, trained = [], []
    for i in range(4):
        for _ in range(4):
            right = bool(rng.integers(0, 2))
            length = int(rng.integers(20, max_len + 1))
            overlong = min(-(length - (max_len - buffer_len)) / buffer_len * factor, 0)
            score = (1.0 if right else -1.0) if dict_result else float(right)
            extra = {"score": score, "acc": right, "pred": "x"} if dict_result else {"acc": score}
            reward = score + overlong
            trained.append(reward)
            row = {
                "input": f"Q{i}",
                "output": "y" * length,
                "gts": "4",
                "score": reward,  # token_level_scores.sum(-1)
                "step": step,
                **extra,  # a dict result's "score" replaces the one above
                "overlong_reward": overlong,
                "overlong": overlong < 0,
            }
            rows.append(json.dumps(row, ensure_ascii=False))
    path = folder / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return trained


def test_it_imports_what_verls_dapo_manager_trained_on_with_its_overlong_penalty(tmp_path):
    for dict_result in (True, False):
        name = f"dapo-{dict_result}"
        trained = dapo_dump(tmp_path / name, 1, dict_result=dict_result)
        run_import(tmp_path / name, "verl", run=name)
        run = Run.objects.get(name=name)
        rewards = [r.reward for r in stored(run)]
        assert sorted(rewards) == pytest.approx(sorted(trained), abs=1e-12), name
        recomputed, kept = replayed_advantages(run)
        assert np.abs(recomputed - kept).max() < 1e-9
    penalised = [
        r for r in stored(Run.objects.get(name="dapo-True")) if r.state.get("score_before_overlong")
    ]
    assert penalised and all(r.reward < r.state["score_before_overlong"] for r in penalised)


# ------------------------------------------------------------------------------------ every format


def test_it_drops_the_group_of_a_truncated_last_line_whole(tmp_path):
    path = verl_dump(tmp_path, 2, ["Q0", "Q1", "Q2"], 4, acc_and_format)
    text = path.read_text(encoding="utf-8")
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    lost = json.loads(last)["input"]
    path.write_text(text[: len(text) - len(last) // 2 - 1], encoding="utf-8")  # a killed writer
    out, err = run_import(path, "verl", "--on-error", "skip", run="cut")
    prompts = set(Group.objects.filter(run__name="cut").values_list("prompt", flat=True))
    assert prompts == {"Q0", "Q1", "Q2"} - {lost}  # not 3 of its 4 rollouts, recomputed
    assert "dropped whole: 3 of 4 rollouts" in err and "imported 2 groups" in out


def test_it_cleans_a_nul_in_model_output_and_says_how_many(tmp_path):
    def score(i: int, j: int, rng: np.random.Generator) -> dict[str, Any]:
        return {"score": float(j % 2), "acc": float(j % 2)}

    path = verl_dump(tmp_path, 1, ["Q0"], 4, score)
    lines = path.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[0])
    lines[0] = json.dumps({**row, "output": row["output"] + "\x00tail"}, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, _ = run_import(path, "verl", run="nul")
    run = Run.objects.get(name="nul")
    texts = [r.completion for r in stored(run)]
    assert any(t.endswith("\ufffdtail") for t in texts)
    assert run.summary["import"]["flags"]["nul_cleaned"] == 1
    assert "nul_cleaned: 1 strings held a NUL" in out


def test_it_names_a_json_error_without_a_doubled_word():
    with pytest.raises(RecordError) as e:
        parse_json_object(b'{"input": "unterminated')
    assert "at at" not in str(e.value)
    assert str(e.value) == "malformed JSON: Unterminated string starting at column 11"


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


# ---------------------------------------------------------------------------------------------- TRL


def trl_completions(folder: Path, step: int, prompts: list[str], g: int, weights: list[float]):
    """completions/completions_<step:05d>.parquet as TRL 1.16's GRPOTrainer.log writes it without
    the recorder: step, prompt, completion, one column per reward function, advantage (TRL's,
    from the weighted sum with `weights`). A prompt listed twice in a row was drawn twice by
    RepeatSampler: 2 x G consecutive rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(step)
    n = len(prompts) * g
    funcs = {
        "correct": rng.integers(0, 2, n).astype(float),
        "format": rng.uniform(0, 1, n).round(2),
        "length": rng.uniform(0, 1, n).round(2),
    }
    matrix = np.stack(list(funcs.values()), axis=1)
    advantages = stats.compute_advantages(matrix, weights, group_size=g).advantages
    table = {
        "step": [step] * n,
        "prompt": [p for p in prompts for _ in range(g)],
        "completion": [f"completion {k}" for k in range(n)],
        **{name: col.tolist() for name, col in funcs.items()},
        "advantage": advantages.tolist(),
    }
    path = folder / "completions" / f"completions_{step:05d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table), path)
    return matrix @ np.array(weights), advantages


def test_it_groups_trl_parquet_by_the_group_size_its_rows_show(tmp_path):
    prompts = [f"P{k}" for k in range(17)]
    prompts.insert(5, "P4")  # P4 drawn twice in a row: 8 consecutive rows
    totals, _ = trl_completions(tmp_path, 3, prompts, 4, [0.5, 2.0, -1.5])
    out, _ = run_import(tmp_path, "trl", run="trl-18")
    run = Run.objects.get(name="trl-18")
    assert Group.objects.filter(run=run).count() == 18  # TRL trained on 18 groups of 4, not 17
    assert set(Group.objects.filter(run=run).values_list("size", flat=True)) == {4}
    # No weights anywhere: the run says the aggregate is not TRL's
    assert run.summary["import"]["weights"].startswith("unknown: TRL's completions parquet")
    assert run.summary["import"]["flags"]["assumed_weights_rows"] == 72
    assert "72 aggregate rewards assume weight 1" in out


def test_it_stores_trls_aggregate_with_the_weights_the_user_gives(tmp_path):
    prompts = [f"P{k}" for k in range(6)]
    totals, advantages = trl_completions(tmp_path, 1, prompts, 4, [0.5, 2.0, -1.5])
    run_import(tmp_path, "trl", "--weights", "correct=0.5,format=2,length=-1.5", run="trl-w")
    run = Run.objects.get(name="trl-w")
    rewards = [r.reward for r in stored(run)]
    assert rewards == pytest.approx(totals.tolist(), abs=1e-12)
    assert run.summary["import"]["weights"] == "TRL's reward_weights, from given (--weights)"
    recomputed, trained = replayed_advantages(run)
    assert np.abs(recomputed - trained).max() < 1e-6


# -------------------------------------------------------------------------- one run, one answer


def test_it_keeps_a_recorded_runs_weights_in_one_place(api, personas, client_as):
    """A recorder's run: created through the API as HttpSink creates it (config and components,
    weights not given), then the trainer's settings arrive (TRL's reward_weights). Every reader -
    the run, its config, a launched twin's job config, the dashboard's resolved config - gives
    the trainer's weights, and no 1.0 left anywhere."""
    from webapp.runs import launch

    c = api(personas["trainer"])
    body = {
        "name": "recorded",
        "kind": "grpo",
        "config": {"source": "RolloutRecorder", "learning_rate": 1e-5},
        "environment": {"name": "rec-env", "components": [{"name": "acc"}, {"name": "fmt"}]},
    }
    created = c.post("/api/v1/runs/", data=json.dumps(body), content_type="application/json")
    run_id = created.json()["id"]
    trained = {"weights": {"acc": 2.0, "fmt": -0.5}, "scale_rewards": "group", "source": "trainer"}
    url = f"/api/v1/runs/{run_id}/settings/"
    res = c.post(url, data=json.dumps(trained), content_type="application/json")
    assert res.status_code in (200, 201), res.content
    run = Run.objects.get(id=run_id)
    assert "reward_weights" not in run.config
    assert run.reward_weights() == {"acc": 2.0, "fmt": -0.5}
    Run.objects.filter(id=run.id).update(status=Run.Status.SUCCEEDED)
    run.refresh_from_db()
    twin = launch.twin_of(run, name="twin")  # what ablation and replay twins train with
    assert twin.reward_weights() == {"acc": 2.0, "fmt": -0.5}
    page = client_as("trainer").get(f"/runs/{run_id}/")
    resolved = page.context["config_json"]
    assert '"acc": 2.0' in resolved and '"acc": 1.0' not in resolved


def test_it_moves_a_launched_jobs_weights_into_the_reward_settings(env3, personas):
    from webapp.rollouts.services import create_run

    run = create_run(
        name="launched",
        kind="grpo",
        environment=env3,
        config={"reward_weights": {"format": 0.0}, "max_steps": 3},
        owner=personas["trainer"],
    )
    run.refresh_from_db()
    assert run.config == {"max_steps": 3}
    assert run.reward_settings["weights"] == {"format": 0.0}
    assert run.reward_weights() == {"correct": 1.0, "format": 0.0, "penalty": 0.2}


def test_it_migrates_a_stored_configs_weights_into_the_reward_settings(run):
    import importlib

    from django.apps import apps

    migration = importlib.import_module(
        "webapp.runs.migrations.0005_reward_weights_in_reward_settings"
    )
    Run.objects.filter(id=run.id).update(  # a row written before: weights in its config
        config={"reward_weights": {"format": 0.3, "penalty": 0.1}, "max_steps": 2},
        reward_settings={"weights": {"penalty": 0.9}, "source": "trainer"},
    )
    migration._settle(apps, None)
    run.refresh_from_db()
    assert run.config == {"max_steps": 2}
    assert run.reward_settings["weights"] == {"format": 0.3, "penalty": 0.9}  # the trainer's win
    assert run.reward_settings["source"] == "trainer"


def test_it_cleans_a_nul_in_an_ingestion_jsonl_file_too(tmp_path):
    record = {
        "step": 0,
        "key": "k",
        "prompt": "p",
        "rollouts": [
            {"index": 0, "completion": "a\x00b", "rewards": {"acc": 1.0}},
            {"index": 1, "completion": "c", "rewards": {"acc": 0.0}},
        ],
    }
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    out, _ = run_import(path, "jsonl", run="nul-jsonl")
    run = Run.objects.get(name="nul-jsonl")
    assert sorted(r.completion for r in stored(run)) == ["a\ufffdb", "c"]
    assert run.summary["import"]["flags"] == {"nul_cleaned": 1}


def test_it_recovers_the_sub_metric_weights_of_byoo_episodes(tmp_path):
    rng = np.random.default_rng(5)
    episodes = []
    for gi in range(6):
        for k in range(4):
            success, tools = float(rng.integers(0, 2)), float(rng.integers(0, 4)) / 4
            episodes.append(
                {
                    "episode_id": f"e{gi}.{k}",
                    "group_id": f"g{gi}",
                    "turns": [
                        {"role": "user", "content": f"task {gi}"},
                        {"role": "assistant", "content": f"done {k}"},
                    ],
                    "aggregate_reward_score": 0.5 * success + 0.25 * tools,
                    "sub_metrics": {"success": success, "tools": tools},
                }
            )
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes), encoding="utf-8")
    run_import(path, "byoo", run="byoo-w")
    run = Run.objects.get(name="byoo-w")
    assert run.reward_weights() == {"success": 0.5, "tools": 0.25}
    recomputed, trained = replayed_advantages(run)
    assert np.abs(recomputed - trained).max() < 1e-9


def test_it_keeps_an_explicit_null_reward_missing_and_computes_an_absent_one(api, personas):
    from webapp.rollouts.services import recompute_run_stats

    c = api(personas["trainer"])
    body = {"name": "nulls", "environment": {"name": "n-env", "components": [{"name": "acc"}]}}
    run_id = c.post("/api/v1/runs/", data=json.dumps(body), content_type="application/json")
    run_id = run_id.json()["id"]
    rollouts = [
        {"index": 0, "completion": "a", "rewards": {"acc": 0.7}, "reward": None},
        {"index": 1, "completion": "b", "rewards": {"acc": 0.2}},
        {"index": 2, "completion": "c", "rewards": {"acc": 0.9}},
    ]
    group = {"step": 0, "key": "k", "prompt": "p", "rollouts": rollouts}
    res = c.post(
        f"/api/v1/runs/{run_id}/groups/",
        data=json.dumps({"groups": [group]}),
        content_type="application/json",
    )
    assert res.status_code == 201, res.content
    run = Run.objects.get(id=run_id)
    assert [r.reward for r in stored(run)] == [None, 0.2, 0.9]
    advantages = [r.advantage for r in stored(run)]
    assert advantages[0] == 0.0 and advantages[1] == pytest.approx(-advantages[2])
    recompute_run_stats(run)  # the repair path keeps it missing too
    assert Group.objects.get(run=run).reward_mean == pytest.approx(0.55)

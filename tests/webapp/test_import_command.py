"""`manage.py import_rollouts`: every format into the database, bad records, skip
vs stop, batches."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from tests.training.test_importers import (
    byoo_episodes,
    prime_records,
    trl_rows,
    verl_lines,
    write_jsonl,
    write_trl,
)
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, Rollout
from webapp.runs.models import Run, StepMetric

pytestmark = pytest.mark.django_db


def run_import(path, fmt: str, *args: str, run: str = "imp") -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "import_rollouts",
        str(path),
        "--run",
        run,
        "--format",
        fmt,
        "--no-progress",
        *args,
        stdout=out,
        stderr=err,
    )
    return out.getvalue(), err.getvalue()


def run_import_failing(
    path, fmt: str, *args: str, run: str = "imp"
) -> tuple[str, str, CommandError]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as e:
        call_command(
            "import_rollouts",
            str(path),
            "--run",
            run,
            "--format",
            fmt,
            "--no-progress",
            *args,
            stdout=out,
            stderr=err,
        )
    return out.getvalue(), err.getvalue(), e.value


def group(step: int, key: str, values: list[dict], **extra) -> dict:
    return {
        "step": step,
        "key": key,
        "prompt": f"prompt {key}",
        "rollouts": [
            {"index": i, "completion": f"c{i}", "rewards": v} for i, v in enumerate(values)
        ],
        **extra,
    }


def std(xs) -> float:
    return float(np.std(np.asarray(xs, dtype=float), ddof=1))


# ------------------------------------------------------------------------------------------ formats


def test_it_imports_trl_completion_logs_with_their_stds_and_advantages(tmp_path):
    write_trl(tmp_path, 1, ["A", "B"], g=4)
    write_trl(tmp_path, 2, ["A", "C"], g=4)
    out, _ = run_import(tmp_path, "trl", run="trl-run")
    assert out.strip().endswith("imported 4 groups, 16 rollouts (0 skipped records)")
    run = Run.objects.get(name="trl-run")
    assert (run.kind, run.status) == ("import", "succeeded")
    assert list(
        RewardComponent.objects.filter(environment=run.environment).values_list("name", flat=True)
    ) == ["correct", "format"]
    assert "consecutive rows (TRL log_completions" in run.config["import"]["grouping"]
    assert run.summary["import"]["groups"] == 4 and run.summary["import"]["format"] == "trl"
    cols = trl_rows(2, ["A", "C"], 4)
    g = Group.objects.get(run=run, step=2, prompt="C")
    total = np.array(cols["correct"][4:]) + np.array(
        cols["format"][4:]
    )  # TRL's default weights are 1
    assert g.reward_std == pytest.approx(std(total))
    assert GroupComponentStat.objects.get(group=g, component__name="format").std == pytest.approx(
        std(cols["format"][4:])
    )
    assert list(g.rollouts.order_by("index").values_list("advantage", flat=True)) == pytest.approx(
        cols["advantage"][4:]
    )  # TRL's own advantages are kept


def test_it_imports_verl_dumps_with_score_as_the_reward(tmp_path):
    rows = verl_lines(3, ["Q1", "Q2"], n=4)
    write_jsonl(tmp_path / "3.jsonl", rows)
    out, _ = run_import(tmp_path, "verl", run="verl-run")
    assert "imported 2 groups, 8 rollouts (0 skipped records)" in out
    run = Run.objects.get(name="verl-run")
    assert "identical input within step" in run.summary["import"]["grouping"]
    g = Group.objects.get(run=run, prompt="Q2")
    assert g.reward_std == pytest.approx(std([r["score"] for r in rows if r["input"] == "Q2"]))
    assert GroupComponentStat.objects.get(group=g, component__name="acc").mean == pytest.approx(
        np.mean([r["acc"] for r in rows if r["input"] == "Q2"])
    )
    assert Rollout.objects.filter(group=g, index=0).get().state["gts"] == "gt1"


def test_it_imports_prime_rl_records(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", prime_records(4, n_examples=3, g=2))
    out, _ = run_import(path, "prime-rl", run="prime")
    assert "imported 3 groups, 6 rollouts" in out
    run = Run.objects.get(name="prime")
    assert sorted(run.environment.components.values_list("name", flat=True)) == ["length", "math"]
    g = Group.objects.get(run=run, key="ex-prob-1")
    assert g.reward_std == pytest.approx(std([1.0, 0.0]))


def test_it_imports_byoo_episodes_as_transcripts(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", byoo_episodes(0, n_groups=2, g=4))
    out, _ = run_import(
        path,
        "byoo",
        run="byoo",
    )
    assert "imported 2 groups, 8 rollouts" in out
    g = Group.objects.get(run__name="byoo", key="g-grp-1")
    assert g.reward_std == pytest.approx(std([0, 0.25, 0.5, 0.75]))
    r = Rollout.objects.get(group=g, index=3)
    assert (
        r.reward == pytest.approx(0.75)
        and r.completion == "done 1.3"
        and r.transcript[1]["role"] == "tool"
    )
    assert GroupComponentStat.objects.get(
        group=g, component__name="task_success"
    ).std == pytest.approx(std([0, 1, 0, 1]))


def test_it_imports_a_jsonl_sink_file_with_its_metrics(tmp_path):
    path = write_jsonl(
        tmp_path / "sink.jsonl",
        [
            {"type": "group", **group(0, "a", [{"correct": 1}, {"correct": 0}])},
            {"type": "metrics", "step": 0, "values": {"loss": 0.25, "kl": 0.01}},
            {"type": "progress", "step": 0, "total": 10},
        ],
    )
    out, _ = run_import(path, "jsonl", run="sink")
    assert "imported 1 groups, 2 rollouts (0 skipped records)" in out
    assert dict(StepMetric.objects.filter(run__name="sink").values_list("name", "value")) == {
        "loss": 0.25,
        "kl": 0.01,
    }


def test_it_imports_into_an_existing_run_and_is_idempotent(tmp_path, run):
    path = write_jsonl(tmp_path / "g.jsonl", [group(0, "a", [{"correct": 1}, {"correct": 0}])])
    run_import(path, "jsonl", run="toy-run")
    out, _ = run_import(path, "jsonl", run="toy-run")
    assert "1 groups were already stored" in out and "imported 0 groups, 0 rollouts" in out
    assert Group.objects.filter(run=run).count() == 1
    run.refresh_from_db()
    assert run.status == "running"  # an API-fed run is not finished by an import into it


def test_it_adds_components_first_seen_mid_file(tmp_path):
    lines = [group(i, f"k{i}", [{"a": 1.0}, {"a": 0.0}]) for i in range(3)]
    lines.append(group(3, "late", [{"a": 1.0, "b": 0.5}, {"a": 0.0, "b": 0.1}]))
    out, _ = run_import(
        write_jsonl(tmp_path / "g.jsonl", lines), "jsonl", "--batch-groups", "2", run="grow"
    )
    assert "imported 4 groups" in out
    run = Run.objects.get(name="grow")
    assert list(run.environment.components.values_list("name", flat=True)) == ["a", "b"]


# -------------------------------------------------------------------------------------- bad records


def test_it_reports_an_ingestion_error_with_the_file_line_and_field(tmp_path):
    lines = [group(0, "a", [{"c": 1}]), group(0, "b", [{"c": 1}]), group(0, "c", [{"c": 1}])]
    lines[1]["rollouts"][0] = {"index": 0, "transcript": [{"role": "robot", "content": "x"}]}
    path = write_jsonl(tmp_path / "g.jsonl", lines)
    out, err = run_import(path, "jsonl", "--on-error", "skip", run="bad")
    assert f"{path}:2: transcript[0].role: must be one of" in err
    assert "imported 2 groups, 2 rollouts (1 skipped records)" in out
    assert sorted(Group.objects.filter(run__name="bad").values_list("key", flat=True)) == ["a", "c"]


def test_it_stops_at_the_first_bad_record_keeping_what_came_before(tmp_path):
    lines = [json.dumps(group(0, k, [{"c": 1}])) for k in "abcde"]
    lines[3] = '{"step": 0, "key": "d", '  # truncated line 4
    path = write_jsonl(tmp_path / "g.jsonl", lines)
    out, err, e = run_import_failing(path, "jsonl", "--batch-groups", "2", run="stop")
    assert f"{path}:4: malformed JSON" in str(e) and f"{path}:4" in err
    assert sorted(Group.objects.filter(run__name="stop").values_list("key", flat=True)) == [
        "a",
        "b",
        "c",
    ]
    assert "imported 3 groups, 3 rollouts (1 skipped records)" in out
    run = Run.objects.get(name="stop")
    assert run.status == "failed" and "g.jsonl:4" in run.summary["import"]["stopped"]
    assert "g.jsonl:4: malformed JSON" in run.error and "run the same import again" in run.error


def test_it_resumes_a_stopped_import_when_the_same_import_runs_again(tmp_path):
    lines = [json.dumps(group(0, k, [{"c": 1}])) for k in "abcde"]
    good = lines[3]
    lines[3] = '{"step": 0, "key": "d", '
    path = write_jsonl(tmp_path / "g.jsonl", lines)
    run_import_failing(path, "jsonl", run="resume")
    lines[3] = good
    out, _ = run_import(write_jsonl(path, lines), "jsonl", run="resume")
    assert "3 groups were already stored" in out and "imported 2 groups" in out
    run = Run.objects.get(name="resume")
    assert (
        run.status == "succeeded" and run.error == "" and Group.objects.filter(run=run).count() == 5
    )


def test_it_stops_on_an_invalid_group_mid_batch_storing_the_groups_before_it(tmp_path):
    lines = [group(0, k, [{"c": 1}]) for k in "abcde"]
    lines[3]["rollouts"][0]["rewards"] = {"c": "high"}
    path = write_jsonl(tmp_path / "g.jsonl", lines)
    _, _, e = run_import_failing(
        path, "jsonl", "--batch-groups", "10", "--components", "c", run="stop2"
    )
    assert f"{path}:4: rewards.c: must be a finite number" in str(e)
    assert sorted(Group.objects.filter(run__name="stop2").values_list("key", flat=True)) == [
        "a",
        "b",
        "c",
    ]


def test_it_never_stores_half_a_verl_group(tmp_path):
    rows = verl_lines(0, ["Q1", "Q2", "Q3"], n=3)
    rows[4] = dict(rows[4], output=None)  # Q2's second sample
    path = write_jsonl(tmp_path / "0.jsonl", rows)
    out, err = run_import(path, "verl", "--on-error", "skip", run="half")
    assert f"{path}:5: output: is required" in err
    assert sorted(Group.objects.filter(run__name="half").values_list("prompt_text", flat=True)) == [
        "Q1",
        "Q3",
    ]
    assert "imported 2 groups, 6 rollouts (3 skipped records)" in out
    _, _, e = run_import_failing(path, "verl", run="half-stop")
    assert (
        Group.objects.filter(run__name="half-stop").count() == 0
    )  # a grouped file is whole before it is stored


def test_it_drops_the_trl_group_of_a_bad_row(tmp_path):
    cols = trl_rows(0, ["A", "B", "C"], 2)
    cols["completion"][3] = None
    write_trl(tmp_path, 0, ["A", "B", "C"], g=2, completion=cols["completion"])
    out, err = run_import(tmp_path, "trl", "--on-error", "skip", run="trl-bad")
    assert "completions_00000.parquet:4: completion: is required" in err
    assert sorted(
        Group.objects.filter(run__name="trl-bad").values_list("prompt_text", flat=True)
    ) == ["A", "C"]
    assert "imported 2 groups, 4 rollouts (2 skipped records)" in out


def test_it_refuses_a_missing_file_before_creating_a_run(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run_import(tmp_path / "nope.jsonl", "jsonl", run="none")
    assert not Run.objects.filter(name="none").exists()


def test_it_refuses_another_environment_for_an_existing_run(tmp_path, run):
    path = write_jsonl(tmp_path / "g.jsonl", [group(0, "a", [{"correct": 1}])])
    with pytest.raises(CommandError, match="already uses environment 'toy'"):
        run_import(path, "jsonl", "--environment", "other", run="toy-run")

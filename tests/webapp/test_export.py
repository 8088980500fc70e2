"""`manage.py export_rollouts` and webapp/rollouts/exporters.py: JSONL round trip,
HF folder, filters."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import make_group
from webapp.rollouts.exporters import GroupFilter, iter_group_records
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, GroupComponentStat, RewardScore, Rollout
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def filled(run):
    """Five groups over steps 0..4, one holdout, with reasons, a transcript with a tool call, a
    state, an unscorable value and a trainer-given advantage."""
    groups = [
        make_group(
            s,
            f"k{s}",
            [
                {"correct": 1.0, "format": 0.5 * s},
                {"correct": 0.0, "format": 0.2},
                {"correct": None, "penalty": -1.0},
            ],
        )
        for s in range(5)
    ]
    groups[1]["split"] = "holdout"
    groups[2]["rollouts"][0]["rewards"]["correct"] = {"value": 1.0, "reason": "matches 42"}
    groups[3]["rollouts"][1] = {
        "index": 1,
        "transcript": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "1", "function": {"name": "f"}}],
            },
            {"role": "tool", "content": "ok", "name": "f"},
            {"role": "assistant", "content": "done"},
        ],
        "rewards": {"correct": 1.0},
        "truncated": True,
        "finish_reason": "length",
        "state": {"canvas": [1, 2]},
    }
    for i, r in enumerate(groups[4]["rollouts"]):
        r["advantage"] = 0.5 - i
    groups[0]["prompt"] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    ingest_groups(run, {"groups": groups})
    return run


def export(*args: str) -> str:
    out = io.StringIO()
    call_command("export_rollouts", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def snapshot(run: Run) -> list[tuple]:
    """Everything a group carries, comparable across runs (no ids)."""
    out = []
    for g in Group.objects.filter(run=run).order_by("step", "key"):
        rollouts = [
            (
                r.index,
                r.transcript,
                r.completion,
                r.reward,
                r.advantage,
                r.length,
                r.truncated,
                r.finish_reason,
                r.state,
                r.split,
                sorted(
                    RewardScore.objects.filter(rollout=r).values_list(
                        "component__name", "value", "reason"
                    )
                ),
            )
            for r in Rollout.objects.filter(group=g).order_by("index")
        ]
        stats = sorted(
            GroupComponentStat.objects.filter(group=g).values_list(
                "component__name", "count", "mean", "std", "min", "max", "zero_std"
            )
        )
        out.append(
            (
                g.step,
                g.key,
                g.prompt,
                g.split,
                g.size,
                g.reward_mean,
                g.reward_std,
                g.zero_std,
                g.all_unscorable,
                rollouts,
                stats,
            )
        )
    return out


def test_it_round_trips_a_run_through_jsonl_export_and_import(filled, tmp_path):
    path = tmp_path / "out.jsonl"
    export("--run", "toy-run", "--out", str(path))
    assert len(path.read_text().splitlines()) == 5
    out = io.StringIO()
    call_command(
        "import_rollouts",
        str(path),
        "--run",
        "copy",
        "--format",
        "jsonl",
        "--environment",
        "toy",
        "--no-progress",
        stdout=out,
        stderr=io.StringIO(),
    )
    assert "imported 5 groups, 15 rollouts (0 skipped records)" in out.getvalue()
    assert snapshot(Run.objects.get(name="copy")) == snapshot(filled)


def test_it_streams_groups_in_id_order_across_chunks(filled):
    keys = [g["key"] for g in iter_group_records(filled, chunk=2)]
    assert keys == ["k0", "k1", "k2", "k3", "k4"]
    rec = next(g for g in iter_group_records(filled, chunk=2) if g["key"] == "k2")
    assert rec["rollouts"][0]["rewards"]["correct"] == {"value": 1.0, "reason": "matches 42"}
    assert rec["rollouts"][2]["rewards"] == {"correct": None, "penalty": -1.0}


def test_it_filters_the_export_by_step_and_split(filled):
    lines = export("--run", "toy-run", "--step-min", "1", "--step-max", "3").splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["k1", "k2", "k3"]
    lines = export("--run", "toy-run", "--split", "holdout").splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["k1"]
    assert [
        g["key"] for g in iter_group_records(filled, GroupFilter(split="train", step_min=3))
    ] == ["k3", "k4"]


def test_it_writes_a_folder_that_datasets_loads(filled, tmp_path):
    import datasets

    out = export("--run", "toy-run", "--format", "hf", "--out", str(tmp_path / "hf"))
    assert "exported 15 rollouts" in out
    ds = datasets.load_dataset(
        str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.num_rows == 15
    assert {
        "prompt",
        "completion",
        "transcript",
        "reward",
        "advantage",
        "rewards/correct",
        "rewards/format",
        "rewards/penalty",
        "group_reward_std",
    } <= set(ds.column_names)
    row = ds.filter(lambda r: r["group_key"] == "k3" and r["index"] == 1)[0]
    assert json.loads(row["transcript"])[1] == {"role": "tool", "content": "ok", "name": "f"}
    assert (
        row["completion"] == "done" and row["truncated"] is True and row["rewards/format"] is None
    )
    first = ds.filter(lambda r: r["group_key"] == "k0")[0]
    assert json.loads(first["prompt_messages"])[1] == {"role": "user", "content": "u"}
    assert first["rewards/correct"] == 1.0


def test_it_sorts_hf_rows_like_the_explorer(filled, tmp_path):
    import datasets

    export(
        "--run",
        "toy-run",
        "--format",
        "hf",
        "--out",
        str(tmp_path / "hf"),
        "--sort",
        "format",
        "--order",
        "asc",
        "--step-min",
        "1",
    )
    ds = datasets.load_dataset(
        str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "cache")
    )
    values = list(ds["rewards/format"])
    assert (
        values == sorted(values) and len(values) == 7
    )  # rollouts of steps 1..4 that have a format score


def test_it_writes_no_hf_folder_when_nothing_matches(run, tmp_path):
    with pytest.raises(CommandError, match="no rollouts match"):
        export("--run", "toy-run", "--format", "hf", "--out", str(tmp_path / "hf"))
    assert not list((tmp_path / "hf").rglob("*.parquet"))


def test_it_refuses_to_sort_a_jsonl_export_and_names_bad_options(filled, tmp_path):
    with pytest.raises(CommandError, match="--sort"):
        export("--run", "toy-run", "--sort", "reward")
    with pytest.raises(CommandError, match="--sort: must be one of"):
        export("--run", "toy-run", "--format", "hf", "--out", str(tmp_path / "x"), "--sort", "nope")
    with pytest.raises(CommandError, match="no run named"):
        export("--run", "missing")

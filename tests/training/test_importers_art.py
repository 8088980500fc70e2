"""The ART reader on trajectory-group Parquet files written field by field as ART's
`write_trajectory_groups_parquet` writes them (format 2: art/utils/trajectory_logging.py; format 1:
the earlier materialized-columns writer), at `<model>/trajectories/<split>/<step:04d>.parquet`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.training.test_importers import items
from training.importers import open_reader

MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.string()),
        ("tool_call_id", pa.string()),
        ("trainable", pa.bool_()),
    ]
)
V2 = pa.schema(
    [
        ("format_version", pa.int16()),
        ("group_index", pa.int64()),
        ("trajectory_index", pa.int64()),
        ("group_json", pa.large_string()),
        ("trajectory_json", pa.large_string()),
        ("group_metadata", pa.string()),
        ("group_metrics", pa.string()),
        ("group_logs", pa.list_(pa.string())),
        ("reward", pa.float64()),
        ("metrics", pa.string()),
        ("metadata", pa.string()),
        ("tools", pa.string()),
        ("logs", pa.list_(pa.string())),
        ("messages", pa.list_(MESSAGE)),
    ],
    metadata={b"art.trajectory_parquet.version": b"2"},
)


def compact(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def trajectory(g: int, t: int, reward: float) -> dict[str, Any]:
    """Trajectory.model_dump(mode="json", exclude={messages_and_choices, additional_histories},
    exclude_computed_fields=True) plus messages_and_choices (Choices as Choice dumps)."""
    call = {
        "id": f"call_{g}{t}",
        "type": "function",
        "function": {"name": "move", "arguments": "{}"},
    }
    return {
        "exchanges": {"chat_completions": [], "completions": [], "responses": [], "messages": []},
        "messages_and_choices": [
            {"role": "system", "content": "You play 2048."},
            {"role": "user", "content": f"Board {g}"},
            {
                "finish_reason": "tool_calls",
                "index": 0,
                "logprobs": None,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            },
            {"role": "tool", "content": "moved", "tool_call_id": f"call_{g}{t}"},
            {
                "finish_reason": "stop",
                "index": 0,
                "logprobs": None,
                "message": {"role": "assistant", "content": f"done {t}", "refusal": None},
            },
        ],
        "tools": [{"type": "function", "function": {"name": "move"}}],
        "reward": reward,
        "initial_policy_version": 3,
        "final_policy_version": 3,
        "metrics": {"max_tile": 64.0 * (t + 1), "won": t == 1, "duration": 1.5},
        "metadata": {"game_id": f"game-{g}"},
        "logs": [f"log {g}.{t}"],
    }


def flat(item: dict[str, Any]) -> dict[str, Any]:
    """_flatten_message: a Choice is trainable, its tool calls a JSON string."""
    choice = "finish_reason" in item
    m = item["message"] if choice else item
    return {
        "role": m.get("role"),
        "content": m.get("content"),
        "tool_calls": json.dumps(m["tool_calls"]) if m.get("tool_calls") else None,
        "tool_call_id": None if choice else m.get("tool_call_id"),
        "trainable": choice,
    }


def write_v2(path: Path, groups: list[list[float]], *, empty_group: bool = False) -> Path:
    rows = []
    for gi, rewards in enumerate(groups):
        group = {"exceptions": [], "metadata": {"scenario": gi}, "metrics": {}, "logs": []}
        common = {
            "format_version": 2,
            "group_index": gi,
            "group_json": compact(group),
            "group_metadata": compact(group["metadata"]),
            "group_metrics": None,
            "group_logs": None,
        }
        for ti, r in enumerate(rewards):
            data = trajectory(gi, ti, r)
            rows.append(
                {
                    **common,
                    "trajectory_index": ti,
                    "trajectory_json": compact(data),
                    "reward": r,
                    "metrics": compact(data["metrics"]),
                    "metadata": compact(data["metadata"]),
                    "tools": compact(data["tools"]),
                    "logs": data["logs"],
                    "messages": [flat(m) for m in data["messages_and_choices"]],
                }
            )
    if empty_group:
        gi = len(groups)
        rows.append(
            {
                "format_version": 2,
                "group_index": gi,
                "trajectory_index": None,
                "group_json": compact({"exceptions": [{"type": "E"}], "metadata": {}}),
                "trajectory_json": None,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=V2), path, compression="zstd")
    return path


def art_advantages(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_it_reads_art_trajectory_groups_with_arts_advantages(tmp_path):
    model = tmp_path / "proj" / "models" / "agent-1"
    write_v2(
        model / "trajectories" / "train" / "0003.parquet",
        [[1.0, 0.0, 0.5], [2.0, 2.0]],
        empty_group=True,
    )
    write_v2(model / "trajectories" / "val" / "0003.parquet", [[0.25, 0.75]])
    reader = open_reader("art", model)
    groups, bad, _ = items(reader)
    assert bad == []
    assert [
        (g.record["step"], g.record["key"], g.record.get("split", "train")) for g in groups
    ] == [
        (3, "train-g0", "train"),
        (3, "train-g1", "train"),
        (3, "val-g0", "holdout"),
    ]
    g = groups[0].record
    assert g["prompt"] == [
        {"role": "system", "content": "You play 2048."},
        {"role": "user", "content": "Board 0"},
    ]
    r = g["rollouts"][1]
    assert [m["role"] for m in r["transcript"]] == ["assistant", "tool", "assistant"]
    assert r["transcript"][0]["tool_calls"][0]["function"]["name"] == "move"
    assert r["rewards"] == {"max_tile": 128.0, "won": 1.0, "duration": 1.5}
    assert r["reward"] == 0.0 and r["state"]["metadata"] == {"game_id": "game-0"}
    assert [x["advantage"] for x in g["rollouts"]] == pytest.approx(art_advantages([1.0, 0.0, 0.5]))
    assert [x["advantage"] for x in groups[1].record["rollouts"]] == [0.0, 0.0]
    notes = reader.notes()
    assert notes["counts"]["groups without trajectories (every rollout raised)"] == 1
    assert any("scale_rewards is not in the files" in gap for gap in notes["gaps"])


def test_it_reads_the_trajectory_json_when_the_messages_column_is_null(tmp_path):
    path = write_v2(tmp_path / "trajectories" / "train" / "0000.parquet", [[1.0, 0.0]])
    table = pq.read_table(path).to_pylist()
    for row in table:
        row["messages"] = None  # content ART could not flatten (images): trajectory_json only
    pq.write_table(pa.Table.from_pylist(table, schema=V2), path)
    groups, bad, _ = items(open_reader("art", path))
    r = groups[0].record["rollouts"][0]
    assert bad == [] and r["transcript"][-1] == {"role": "assistant", "content": "done 0"}


def test_it_reads_the_earlier_format_without_trajectory_json(tmp_path):
    rows = [
        {
            "group_index": 0,
            "group_metadata": None,
            "group_metrics": None,
            "group_logs": None,
            "reward": r,
            "metrics": compact({"score": r}),
            "metadata": None,
            "tools": None,
            "logs": None,
            "messages": [flat(m) for m in trajectory(0, t, r)["messages_and_choices"]],
        }
        for t, r in enumerate([1.0, 0.0])
    ]
    schema = pa.schema(
        [
            f
            for f in V2
            if f.name not in ("format_version", "trajectory_index", "group_json", "trajectory_json")
        ]
    )
    path = tmp_path / "0007.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    groups, bad, _ = items(open_reader("art", path, scale_rewards="none"))
    assert bad == [] and groups[0].record["step"] == 7
    assert [x["advantage"] for x in groups[0].record["rollouts"]] == [0.5, -0.5]

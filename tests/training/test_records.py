"""training/records.py: the typed rollout record, its JSON round trip and its field errors."""

from __future__ import annotations

import math

import pytest

from training import stats
from training.records import (
    ABSENT,
    GroupRecord,
    InvalidRecord,
    RolloutRecord,
    Score,
    parse_batch,
)


def _group(**changes):
    rollouts = [
        RolloutRecord(
            index=0,
            completion="yes",
            rewards={"correct": Score(1.0, "matched"), "format": 0.5},
            advantage=0.7,
            reward=1.2,
            length=3,
            truncated=False,
            finish_reason="stop",
            state={"canvas": [1, 2]},
            tokens={"ids": [1, 2, 3]},
        ),
        RolloutRecord(
            index=1,
            transcript=[
                {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]},
                {"role": "tool", "content": "42", "name": "f"},
                {"role": "assistant", "content": "42"},
            ],
            rewards={"correct": None},
            advantage=-0.7,
            reward=None,
            parse_error="no answer tag",
        ),
    ]
    fields = {"step": 3, "key": "p1", "prompt": "2+2?", "split": "holdout", "rollouts": rollouts}
    return GroupRecord(**{**fields, **changes})


def test_it_round_trips_through_json():
    g = _group()
    data = g.to_json()
    assert data["rollouts"][0]["rewards"] == {
        "correct": {"value": 1.0, "reason": "matched"},
        "format": 0.5,
    }
    assert data["rollouts"][1]["reward"] is None and "length" not in data["rollouts"][1]
    again = GroupRecord.from_json(data)
    assert again.to_json() == data
    assert again.rollouts[0].rewards["correct"] == Score(1.0, "matched")


def test_it_leaves_out_what_was_not_given():
    r = RolloutRecord(index=0, completion="a", rewards={})
    assert r.reward is ABSENT
    assert r.to_json() == {"index": 0, "completion": "a", "rewards": {}}
    g = GroupRecord(step=0, key="k", prompt="p", rollouts=[r])
    assert list(g.to_json()) == ["step", "key", "prompt", "rollouts"]


def test_it_is_frozen():
    r = RolloutRecord(index=0, completion="a", rewards={})
    with pytest.raises(AttributeError):
        r.index = 2  # type: ignore[misc]


ROLLOUT_ERRORS = [
    ({"index": -1}, "index"),
    ({"index": True}, "index"),
    ({"completion": 3}, "completion"),
    ({"rewards": {"correct": "high"}}, "rewards.correct"),
    ({"rewards": {"correct": math.nan}}, "rewards.correct"),
    ({"rewards": {"correct": {"value": 1, "why": "x"}}}, "rewards.correct"),
    ({"rewards": {"correct": {"value": 1, "reason": 2}}}, "rewards.correct.reason"),
    ({"rewards": {"correct": {"value": "x", "reason": ""}}}, "rewards.correct.value"),
    ({"rewards": [1]}, "rewards"),
    ({"advantage": math.inf}, "advantage"),
    ({"reward": "1"}, "reward"),
    ({"length": -2}, "length"),
    ({"truncated": "no"}, "truncated"),
    ({"finish_reason": 5}, "finish_reason"),
    ({"parse_error": ["x"]}, "parse_error"),
    ({"state": [1]}, "state"),
    ({"tokens": [1]}, "tokens"),
    ({"colour": "red"}, "colour"),
]


@pytest.mark.parametrize(("change", "field"), ROLLOUT_ERRORS)
def test_every_bad_rollout_field_names_its_path(change, field):
    data = _group().to_json()
    data["rollouts"][0] = {**data["rollouts"][0], **change}
    with pytest.raises(InvalidRecord) as e:
        parse_batch({"groups": [_group(key="a").to_json(), data]})
    assert e.value.path == f"groups[1].rollouts[0].{field}"


TRANSCRIPT_ERRORS = [
    ([], "transcript"),
    (["hi"], "transcript[0]"),
    ([{"role": "robot", "content": "x"}], "transcript[0].role"),
    ([{"role": "assistant", "content": 1}], "transcript[0].content"),
    ([{"role": "assistant", "content": "", "tool_calls": {}}], "transcript[0].tool_calls"),
    ([{"role": "tool", "content": "", "name": 1}], "transcript[0].name"),
]


@pytest.mark.parametrize(("transcript", "field"), TRANSCRIPT_ERRORS)
def test_every_bad_message_names_its_path(transcript, field):
    with pytest.raises(InvalidRecord) as e:
        RolloutRecord(index=0, transcript=transcript, rewards={})
    assert e.value.path == field


def test_a_missing_index_or_rollout_list_is_named():
    with pytest.raises(InvalidRecord) as e:
        RolloutRecord.from_json({"completion": "a"})
    assert e.value.path == "index"
    with pytest.raises(InvalidRecord) as e:
        GroupRecord(step=0, key="k", prompt="p", rollouts=None)  # type: ignore[arg-type]
    assert e.value.path == "rollouts"


def test_a_rollout_needs_exactly_one_of_completion_and_transcript():
    with pytest.raises(InvalidRecord) as e:
        RolloutRecord(index=0, rewards={})
    assert e.value.path == "" and "exactly one" in e.value.message
    with pytest.raises(InvalidRecord):
        RolloutRecord(index=0, completion="a", transcript=[{"role": "user"}], rewards={})


GROUP_ERRORS = [
    ({"step": -1}, "step"),
    ({"key": ""}, "key"),
    ({"key": "k" * 301}, "key"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [{"role": "x", "content": "p"}]}, "prompt[0].role"),
    ({"split": "test"}, "split"),
    ({"rollouts": []}, "rollouts"),
    ({"extra": 1}, "extra"),
]


@pytest.mark.parametrize(("change", "field"), GROUP_ERRORS)
def test_every_bad_group_field_names_its_path(change, field):
    data = {**_group().to_json(), **change}
    with pytest.raises(InvalidRecord) as e:
        parse_batch({"groups": [data]})
    assert e.value.path == f"groups[0].{field}"


def test_a_group_refuses_duplicate_indexes_and_partial_advantages():
    a = RolloutRecord(index=0, completion="a", rewards={}, advantage=1.0)
    b = RolloutRecord(index=0, completion="b", rewards={})
    with pytest.raises(InvalidRecord) as e:
        GroupRecord(step=0, key="k", prompt="p", rollouts=[a, b])
    assert e.value.path == "rollouts[1].index"
    with pytest.raises(InvalidRecord) as e:
        GroupRecord(
            step=0,
            key="k",
            prompt="p",
            rollouts=[a, RolloutRecord(index=1, completion="b", rewards={})],
        )
    assert e.value.path == "rollouts"


def test_a_batch_refuses_the_same_group_twice():
    g = _group().to_json()
    with pytest.raises(InvalidRecord) as e:
        parse_batch({"groups": [g, g]})
    assert e.value.path == "groups[1].key"
    with pytest.raises(InvalidRecord) as e:
        parse_batch({"groups": {}})
    assert e.value.path == "groups"


def test_weighted_reward_is_trls_nan_sum():
    assert stats.weighted_reward({"a": 1.0, "b": None, "c": math.nan}, {"a": 2.0, "b": 1.0}) == 2.0
    assert stats.weighted_reward({"a": 1, "z": 3.0}, {"a": 0.5}) == 0.5  # no weight: counts 0
    assert stats.weighted_reward({"a": None}, {"a": 1.0}) is None
    assert stats.weighted_reward({}, {}) is None

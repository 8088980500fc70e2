"""The ingestion service: validation, all-or-nothing, idempotency, stats and advantages."""

import math

import numpy as np
import pytest

from tests.conftest import make_group
from training import stats
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, GroupComponentStat, RewardScore, Rollout


def _counts():
    return (
        Group.objects.count(),
        Rollout.objects.count(),
        RewardScore.objects.count(),
        GroupComponentStat.objects.count(),
    )


def test_it_stores_groups_rollouts_scores_and_stats(run):
    body = {
        "groups": [
            make_group(
                0,
                "p1",
                [
                    {"correct": 1, "format": 1},
                    {"correct": 0, "format": 1},
                    {"correct": 1, "format": 1},
                    {"correct": 0, "format": 1},
                ],
            )
        ]
    }
    res = ingest_groups(run, body)
    assert (res.groups, res.rollouts) == (1, 4)
    g = Group.objects.get()
    assert g.size == 4 and not g.zero_std
    fmt = GroupComponentStat.objects.get(component__name="format")
    assert fmt.std == 0 and fmt.zero_std and fmt.mean == 1
    cor = GroupComponentStat.objects.get(component__name="correct")
    assert cor.std == pytest.approx(math.sqrt(1 / 3))
    assert not GroupComponentStat.objects.filter(component__name="penalty").exists()  # never scored


def test_it_packs_each_groups_scores_in_the_documented_layout(run):
    ingest_groups(
        run, {"groups": [make_group(3, "p", [{"correct": 1, "format": None}, {"penalty": -0.5}])]}
    )
    g = Group.objects.get()
    comps = {c.name: c.id for c in run.environment.components.all()}
    assert g.packed_components == f"{comps['correct']},{comps['format']},{comps['penalty']}"
    rec = np.frombuffer(
        bytes(g.packed_scores), dtype=[("id", "<i8"), ("length", "<f8"), ("values", "<f8", (3,))]
    )
    assert rec["id"].tolist() == list(
        Rollout.objects.order_by("index").values_list("id", flat=True)
    )
    assert rec["length"].tolist() == [10.0, 11.0]
    assert np.array_equal(
        rec["values"], [[1, np.nan, np.nan], [np.nan, np.nan, -0.5]], equal_nan=True
    )


def test_it_stores_no_blob_of_a_batch_that_fails(run, monkeypatch):
    from webapp.rollouts import ingest

    def boom(*args):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(ingest, "upsert_step_stats", boom)  # the last write of the transaction
    with pytest.raises(RuntimeError):
        ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 1}])]})
    assert _counts() == (0, 0, 0, 0)


def test_it_computes_advantages_with_the_trl_formula_when_absent(run):
    vals = [{"correct": 1, "format": 0}, {"correct": 0, "format": 1}, {"correct": 1, "format": 1}]
    ingest_groups(run, {"groups": [make_group(0, "p", vals)]})
    got = list(Rollout.objects.order_by("index").values_list("advantage", "reward"))
    expected = stats.compute_advantages(
        [[1, 0, math.nan], [0, 1, math.nan], [1, 1, math.nan]], [1.0, 0.5, 0.2], group_size=3
    )
    assert [a for a, _ in got] == pytest.approx(expected.advantages.tolist())
    assert [r for _, r in got] == pytest.approx([1.0, 0.5, 1.5])


def test_it_keeps_advantages_the_trainer_sent(run):
    g = make_group(0, "p", [{"correct": 1}, {"correct": 0}])
    g["rollouts"][0]["advantage"], g["rollouts"][1]["advantage"] = 0.25, -0.25
    ingest_groups(run, {"groups": [g]})
    assert sorted(Rollout.objects.values_list("advantage", flat=True)) == [-0.25, 0.25]


def test_it_is_idempotent_on_step_and_key(run):
    body = {
        "groups": [
            make_group(0, "a", [{"correct": 1}, {"correct": 0}]),
            make_group(1, "a", [{"correct": 1}, {"correct": 1}]),
        ]
    }
    ingest_groups(run, body)
    before = _counts()
    res = ingest_groups(run, body)
    assert res.groups == 0 and res.skipped_groups == 2
    assert _counts() == before


@pytest.mark.parametrize(
    "mutate, field",
    [
        (
            lambda b: b["groups"][1]["rollouts"][0]["rewards"].update(unknown=1.0),
            "groups[1].rollouts[0].rewards.unknown",
        ),
        (
            lambda b: b["groups"][1]["rollouts"][0]["rewards"].update(correct="high"),
            "groups[1].rollouts[0].rewards.correct",
        ),
        (
            lambda b: b["groups"][1]["rollouts"][0]["rewards"].update(correct=float("inf")),
            "groups[1].rollouts[0].rewards.correct",
        ),
        (lambda b: b["groups"][1]["rollouts"][1].update(index=0), "groups[1].rollouts[1].index"),
        (lambda b: b["groups"][1].update(step=-1), "groups[1].step"),
        (lambda b: b["groups"][1].update(split="test"), "groups[1].split"),
        (lambda b: b["groups"][1]["rollouts"][0].pop("completion"), "groups[1].rollouts[0]"),
        (
            lambda b: b["groups"][1]["rollouts"][0].update(
                transcript=[{"role": "robot", "content": "x"}]
            ),
            "groups[1].rollouts[0]",
        ),
        (
            lambda b: b["groups"][1]["rollouts"].extend([b["groups"][1]["rollouts"][0]] * 1030),
            "groups[1].rollouts",
        ),
        (lambda b: b["groups"].append(dict(b["groups"][0])), "groups[2].key"),
    ],
)
def test_it_rejects_bad_input_naming_the_field_and_stores_nothing(run, mutate, field):
    body = {
        "groups": [
            make_group(0, "good", [{"correct": 1}, {"correct": 0}]),
            make_group(0, "bad", [{"correct": 1}, {"correct": 0}]),
        ]
    }
    mutate(body)
    with pytest.raises(FieldError) as e:
        ingest_groups(run, body)
    assert any(err["field"].startswith(field) for err in e.value.errors), e.value.errors
    assert _counts() == (0, 0, 0, 0)


def test_it_accepts_multi_turn_transcripts_and_null_scores(run):
    transcript = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"name": "run", "arguments": {"x": 1}}],
        },
        {"role": "tool", "name": "run", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]
    g = {
        "step": 2,
        "key": "k",
        "prompt": [{"role": "user", "content": "hi"}],
        "rollouts": [
            {"index": 0, "transcript": transcript, "rewards": {"correct": None}},
            {
                "index": 1,
                "transcript": transcript,
                "rewards": {"correct": {"value": 1.0, "reason": "ok"}},
            },
        ],
    }
    ingest_groups(run, {"groups": [g]})
    r0, r1 = Rollout.objects.order_by("index")
    assert r0.completion == "done" and r0.reward is None and r0.advantage == 0.0
    assert RewardScore.objects.get(rollout=r1).reason == "ok"
    assert Group.objects.get().prompt_text.startswith("user: hi")


def test_it_keeps_per_step_sufficient_statistics_across_batches_and_recompute(run):
    import numpy as np

    from webapp.rollouts.models import StepStat
    from webapp.rollouts.services import recompute_run_stats
    from webapp.runs.queries import dashboard_data

    rng = np.random.default_rng(3)
    values = rng.integers(0, 3, size=(6, 4)) / 2.0
    values[0] = 1.0  # one zero-std group
    groups = [
        make_group(
            step, f"k{g}", [{"correct": float(v), "format": 1.0} for v in values[step * 3 + g]]
        )
        for step in range(2)
        for g in range(3)
    ]
    ingest_groups(run, {"groups": groups[:2]})  # two batches touch step 0: the sums must add up
    ingest_groups(run, {"groups": groups[2:]})

    def check():
        data = dashboard_data(run)
        correct = next(c for c in data.components if c.name == "correct")
        for step in (0, 1):
            v = values[step * 3 : (step + 1) * 3].ravel()
            assert correct.mean[step] == pytest.approx(v.mean())
            assert correct.batch_std[step] == pytest.approx(v.std(ddof=1))
            stds = values[step * 3 : (step + 1) * 3].std(axis=1, ddof=1)
            assert correct.within_std[step] == pytest.approx(stds.mean())
            assert correct.zero_std_frac[step] == pytest.approx((stds == 0).mean())
        fmt = next(c for c in data.components if c.name == "format")
        assert fmt.zero_std_frac == [1.0, 1.0] and fmt.batch_std == [0.0, 0.0]
        agg = values + 0.5  # reward = correct * 1.0 + format * 0.5
        assert data.reward.mean == pytest.approx([agg[:3].mean(), agg[3:].mean()])
        assert data.n_rollouts == 24 and data.n_groups == 6

    check()
    before = sorted(StepStat.objects.values_list("step", "component_id", "n_values", "sum_values"))
    recompute_run_stats(run)
    after = sorted(StepStat.objects.values_list("step", "component_id", "n_values", "sum_values"))
    assert [r[:3] for r in after] == [r[:3] for r in before]
    assert [r[3] for r in after] == pytest.approx([r[3] for r in before])
    check()


def test_it_stores_absurdly_large_rewards_without_breaking_the_step_statistics(run):
    from webapp.runs.queries import dashboard_data

    big = [{"correct": 1e308, "format": 1.0}, {"correct": -1e308, "format": 0.0}]
    ingest_groups(run, {"groups": [make_group(0, "a", big)]})
    ingest_groups(
        run, {"groups": [make_group(0, "b", big)]}
    )  # adding two huge sums must not overflow
    data = dashboard_data(run)
    correct = next(c for c in data.components if c.name == "correct")
    assert correct.mean == [None] and correct.batch_std == [
        None
    ]  # meaningless at this size: missing
    fmt = next(c for c in data.components if c.name == "format")
    assert fmt.mean == [0.5]


def _derived(run):
    """Everything recompute_run_stats rebuilds, keyed without ids."""
    from webapp.rollouts.models import StepStat

    groups = sorted(
        Group.objects.filter(run=run).values_list(
            "step", "key", "reward_mean", "reward_std", "zero_std", "all_unscorable"
        )
    )
    comp_stats = sorted(
        GroupComponentStat.objects.filter(run=run).values_list(
            "group__key",
            "component__name",
            "step",
            "count",
            "mean",
            "std",
            "min",
            "max",
            "zero_std",
        )
    )
    steps = sorted(
        StepStat.objects.filter(run=run).values_list(
            "step",
            "component_id",
            "n_groups",
            "n_zero_std",
            "n_group_std",
            "n_rollouts",
            "n_values",
        )
    )
    return groups, comp_stats, steps


def test_it_recomputes_exactly_what_ingestion_stored(run):
    from webapp.rollouts.models import StepStat
    from webapp.rollouts.services import recompute_run_stats

    rng = np.random.default_rng(5)
    groups = []
    for g in range(8):
        values = [
            {name: float(v) for name, v in zip(("correct", "format"), row, strict=True) if v >= 0}
            for row in rng.integers(-1, 3, size=(int(rng.integers(1, 6)), 2))
        ]
        groups.append(make_group(g % 3, f"k{g}", values))
    ingest_groups(run, {"groups": groups})
    stored = _derived(run)
    GroupComponentStat.objects.all().delete()
    StepStat.objects.all().delete()
    Group.objects.update(reward_mean=None, reward_std=None, zero_std=False, all_unscorable=False)

    assert recompute_run_stats(run) == {"groups": 8, "rollouts": Rollout.objects.count()}
    assert _derived(run) == stored


def test_it_never_reuses_the_ids_of_deleted_rows(run):
    ingest_groups(run, {"groups": [make_group(0, "a", [{"correct": 1}, {"correct": 0}])]})
    first = (Group.objects.get().id, max(Rollout.objects.values_list("id", flat=True)))
    Group.objects.all().delete()
    ingest_groups(run, {"groups": [make_group(0, "a", [{"correct": 1}])]})
    again = Group.objects.get()
    assert again.id > first[0] and again.rollouts.get().id > first[1]
    assert _counts() == (1, 1, 1, 1)

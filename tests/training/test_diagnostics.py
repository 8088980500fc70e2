"""training/diagnostics.py and training/ablation.py: health numbers, every detector on a
planted case and on a healthy run, and the ablation recomputation on hand-computable cases.
Pure numpy: no database."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from training import ablation as abl
from training import diagnostics as dg
from training import stats

C = dg.ComponentInfo
HEALTHY_COMPONENTS = [
    C("correct", 1.0, "outcome", 0.0, 1.0),
    C("format", 0.5, "behavioural", 0.0, 1.0),
    C("penalty", 0.2, "penalty", -1.0, 0.0),
]


def synth(
    components, gen, steps: int = 20, groups: int = 12, G: int = 8, seed: int = 0
) -> dg.RunArrays:
    """A run of steps x groups x G rollouts; gen(rng, step, G) -> (values (G, K), lengths (G,))."""
    rng = np.random.default_rng(seed)
    mats, lens, gids, stps = [], [], [], []
    for s in range(steps):
        for g in range(groups):
            v, ln = gen(rng, s, G)
            mats.append(v)
            lens.append(ln)
            gids.append(np.full(G, 1000 + s * groups + g))
            stps.append(np.full(G, s))
    n = steps * groups * G
    return dg.RunArrays(
        components=list(components),
        matrix=np.vstack(mats).astype(float),
        group_ids=np.concatenate(gids),
        steps=np.concatenate(stps),
        lengths=np.concatenate(lens).astype(float),
        rollout_ids=np.arange(1, n + 1),
    )


def healthy_gen(rng, step, G):
    p = 0.3 + 0.3 * step / 20 + rng.uniform(-0.1, 0.1)
    correct = (rng.random(G) < p).astype(float)
    fmt = (rng.random(G) < 0.8).astype(float)
    pen = -rng.uniform(0, 0.3, G)
    return np.column_stack([correct, fmt, pen]), rng.integers(50, 150, G)


def healthy() -> dg.RunArrays:
    return synth(HEALTHY_COMPONENTS, healthy_gen)


def healthy_metrics():
    rng = np.random.default_rng(1)
    s = np.arange(40)
    clip = np.zeros(40)
    clip[7] = 0.002  # clip ratios sit at 0 for whole runs; one tiny blip is not a spike
    return {
        "kl": (s, 0.02 + rng.normal(0, 0.002, 40)),
        "grad_norm": (s, 1.0 + rng.normal(0, 0.1, 40)),
        "clip_ratio/region_mean": (s, 0.01 + rng.normal(0, 0.001, 40)),
        "clip_ratio/low_min": (s, clip),
        "loss": (s, rng.normal(0, 5, 40)),
    }


def codes(d: dg.Diagnosis) -> list[str]:
    return [f.code for f in d.findings]


# ---------------------------------------------------------------- health numbers


def test_it_reports_a_healthy_run_without_findings() -> None:
    d = dg.diagnose(healthy(), metrics=healthy_metrics(), bad_case_ids=lambda: [])
    assert codes(d) == []
    h = d.health.by_name()
    assert (
        0.2 < h["correct"].share < 1.0 and abs(sum(c.share for c in d.health.components) - 1) < 1e-9
    )
    assert h["format"].zero_std_frac < 0.5


def test_it_gives_a_heavy_constant_component_a_share_near_zero() -> None:
    comps = [C("correct", 1.0, "outcome", 0, 1), C("always", 10.0, "process", 0, 1)]

    def gen(rng, step, G):
        return np.column_stack([(rng.random(G) < 0.5), np.full(G, 0.5)]).astype(
            float
        ), rng.integers(1, 9, G)

    h = dg.component_health(synth(comps, gen)).by_name()
    assert h["always"].share == pytest.approx(0.0, abs=1e-12)
    assert h["correct"].share == pytest.approx(1.0)
    assert h["always"].zero_std_frac == 1.0


def test_it_computes_shares_from_weights_variances_and_covariances() -> None:
    # One group, two components: a = [0, 1, 0, 1], b = [0, 1, 1, 0]; cov(a,b) = 0, var equal.
    x = np.array([[0, 0], [1, 1], [0, 1], [1, 0]], dtype=float)
    data = dg.RunArrays(
        [C("a", 2.0), C("b", 1.0)], x, np.zeros(4, int), np.zeros(4, int), np.arange(4.0)
    )
    h = dg.component_health(data)
    assert [c.share for c in h.components] == pytest.approx([4 / 5, 1 / 5])  # w^2 var / sum w^2 var


def test_it_measures_saturation_and_unreachability_against_the_declared_range() -> None:
    comps = [C("c", 1.0, "outcome", 0.0, 1.0)]
    x = np.array([[1.0], [1.0], [0.0], [0.5]])
    h = dg.component_health(dg.RunArrays(comps, x, np.array([0, 0, 1, 1]), np.zeros(4, int)))
    assert (h.components[0].at_max, h.components[0].at_min) == (0.5, 0.25)
    # Undeclared range: the observed one.
    h2 = dg.component_health(
        dg.RunArrays(
            [C("c", 1.0)],
            np.array([[2.0], [3.0], [3.0], [2.5]]),
            np.array([0, 0, 1, 1]),
            np.zeros(4, int),
        )
    )
    assert (h2.components[0].at_max, h2.components[0].at_min) == (0.5, 0.25)


def test_it_correlates_components_and_length_within_groups() -> None:
    # Between groups length and reward move together; inside each group they are opposed.
    x = np.array([[1.0], [0.0], [11.0], [10.0]])
    lengths = np.array([1.0, 2.0, 11.0, 12.0])
    h = dg.component_health(
        dg.RunArrays([C("c", 1.0)], x, np.array([0, 0, 1, 1]), np.zeros(4, int), lengths)
    )
    assert h.components[0].corr_length == pytest.approx(-1.0)
    assert h.corr_labels == ["c", "length", "reward"]


# ---------------------------------------------------------------- detectors


def test_it_detects_a_dead_component() -> None:
    comps = [*HEALTHY_COMPONENTS, C("steps", 3.0, "process", 0.0, 1.0)]

    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        return np.column_stack([v, np.full(G, 0.5)]), ln

    d = dg.diagnose(synth(comps, gen))
    assert codes(d) == ["dead_component"]
    f = d.findings[0]
    assert f.component == "steps" and f.severity == "critical" and "no advantage" in f.title


def test_it_detects_an_unreachable_outcome() -> None:
    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        v[:, 0] = (rng.random(G) < 0.005).astype(float)
        return v, ln

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    assert "unreachable_reward" in codes(d)
    f = next(f for f in d.findings if f.code == "unreachable_reward")
    assert f.component == "correct" and "SFT" in f.fix and "partial credit" in f.fix
    assert "dead_component" not in codes(d)  # explained by the finding above, not repeated


def test_it_detects_a_saturated_behavioural_component() -> None:
    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        v[:, 1] = 1.0
        return v, ln

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    assert codes(d) == ["saturation"]
    f = d.findings[0]
    assert f.component == "format" and "still varies" in f.title and "Lower the weight" in f.fix


def test_it_detects_trivial_outputs() -> None:
    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        v[:, 0] = 0.2  # the same partial credit for every completion
        v[:, 1] = 1.0
        return v, ln

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    assert "trivial_outputs" in codes(d) and d.findings[0].code == "trivial_outputs"


def test_it_detects_valid_outputs_that_ignore_the_prompt() -> None:
    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        v[:, 0] = (rng.random(G) < 0.08).astype(float)
        v[:, 1] = (rng.random(G) < 0.95).astype(float)
        return v, ln

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    assert codes(d) == ["ignores_prompt"]


def test_it_detects_length_hacking() -> None:
    def gen(rng, step, G):
        v, _ = healthy_gen(rng, step, G)
        lengths = rng.integers(50, 100, G) + 20 * step
        v[:, 0] = np.clip((lengths - lengths.min()) / 60 + rng.normal(0, 0.05, G), 0, 1)
        return v, lengths

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    assert codes(d) == ["length_hacking"]
    assert d.findings[0].sort == "length" and d.findings[0].component == "correct"


def test_it_does_not_call_length_hacking_when_length_is_flat() -> None:
    def gen(rng, step, G):
        v, _ = healthy_gen(rng, step, G)
        lengths = rng.integers(50, 100, G)
        v[:, 0] = np.clip((lengths - 50) / 50, 0, 1)
        return v, lengths

    assert "length_hacking" not in codes(dg.diagnose(synth(HEALTHY_COMPONENTS, gen)))


def test_it_detects_aggregation_collapse_and_what_normalise_then_sum_would_do() -> None:
    comps = [C("a", 1.0, "outcome", 0, 1), C("b", 1.0, "outcome", 0, 1)]

    def gen(rng, step, G):
        a = (rng.random(G) < 0.5).astype(float)
        b = np.where(rng.random(G) < 0.7, 1 - a, a)  # mostly one or the other: [1,0] and [0,1] tie
        return np.column_stack([a, b]), rng.integers(50, 150, G)

    data = synth(comps, gen)
    d = dg.diagnose(data)
    assert "aggregation_collapse" in codes(d)
    c = d.collapse
    assert c["frac"] > 0.5 and 0.0 <= c["resolved_frac"] <= 1.0
    assert dg.diagnose(data, aggregation="normalize_then_sum").collapse == {}


def test_it_counts_collapse_on_a_hand_made_group() -> None:
    # Group 0: [1,0] and [0,1] both sum to 1 -> collapsed; [1,1] differs. Group 1:
    # all distinct sums.
    x = np.array([[1, 0], [0, 1], [1, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
    data = dg.RunArrays(
        [C("a", 1.0), C("b", 1.0)], x, np.array([0, 0, 0, 1, 1, 1]), np.zeros(6, int)
    )
    c = dg.aggregation_collapse(data)
    assert (c["groups"], c["collapsed"], c["frac"]) == (2, 1, 0.5)
    assert c["rollouts_frac"] == pytest.approx(2 / 6)


def test_it_detects_metric_spikes_and_divergence() -> None:
    m = healthy_metrics()
    s, v = m["kl"]
    v = v.copy()
    v[25] = 0.9
    m["kl"] = (s, v)
    d = dg.diagnose(healthy(), metrics=m)
    assert codes(d) == ["unstable"]
    assert d.findings[0].evidence["first_step"] == 25
    gn = m["grad_norm"][1].copy()
    gn[30] = np.nan
    m["train/grad_norm"] = (s, gn)
    crit = [f for f in dg.diagnose(healthy(), metrics=m).findings if f.severity == "critical"]
    assert crit and "non-finite" in crit[0].title


def test_it_flags_high_reward_rollouts_that_annotators_marked_bad() -> None:
    data = healthy()
    r = data.rewards()
    top = data.rollout_ids[r >= np.quantile(r, 0.8)]
    d = dg.diagnose(data, bad_case_ids=lambda: top[: len(top) // 2].tolist())
    assert codes(d) == ["reward_vs_quality"]
    assert d.findings[0].evidence["share"] == pytest.approx(0.5, abs=0.02)
    # With the annotated set as denominator, and too few annotations: nothing is said.
    few = dg.diagnose(
        data, bad_case_ids=lambda: top[:3].tolist(), annotated_ids=lambda: top[:5].tolist()
    )
    assert codes(few) == []


def test_it_serialises_the_diagnosis_to_json() -> None:
    import json

    d = dg.diagnose(healthy())
    json.dumps(d.as_dict(), allow_nan=False)


# ---------------------------------------------------------------- ablation


def small_case() -> dg.RunArrays:
    # Two groups of 4; 'const' is the same inside each group (weight 5); 'correct' varies.
    x = np.array([[1, 1], [0, 1], [1, 1], [0, 1], [1, 0], [1, 0], [0, 0], [0, 0]], dtype=float)
    return dg.RunArrays(
        [C("correct", 1.0, "outcome"), C("const", 5.0, "behavioural")],
        x,
        np.array([7, 7, 7, 7, 9, 9, 9, 9]),
        np.array([0, 0, 0, 0, 1, 1, 1, 1]),
    )


def test_it_finds_no_signal_when_dropping_a_constant_component() -> None:
    r = abl.ablate(small_case(), abl.AblationSpec(drop=("const",)))
    assert r["mean_abs_delta"] == pytest.approx(0.0, abs=1e-12)
    assert (r["sign_flip_frac"], r["best_changed_frac"], r["zero_std_change"]) == (0.0, 0.0, 0.0)
    assert r["verdict"]["level"] == "no_signal"
    assert abl.NO_SIGNAL in r["verdict"]["text"] and "'const'" in r["verdict"]["text"]
    assert r["weights"] == {"correct": 1.0}


def test_it_measures_what_dropping_the_only_varying_component_does() -> None:
    r = abl.ablate(small_case(), abl.AblationSpec(drop=("correct",)))
    a = 0.5 / (math.sqrt(1 / 3) + stats.EPS)  # group of [1,0,1,0]: |A| for every rollout
    assert r["mean_abs_delta"] == pytest.approx(a)
    assert (r["zero_std_before"], r["zero_std_after"]) == (0.0, 1.0)
    assert r["signal_lost_frac"] == 1.0 and r["sign_flip_frac"] == 0.0
    assert r["verdict"]["level"] == "strong"
    assert {g["group_id"] for g in r["top_groups"]} == {7, 9}


def test_it_counts_sign_flips_best_changes_and_spearman() -> None:
    # One group; re-weighting b from 0.1 to 3 reverses the order of a and b.
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    data = dg.RunArrays([C("a", 1.0), C("b", 0.1)], x, np.zeros(3, int), np.zeros(3, int))
    r = abl.ablate(data, abl.AblationSpec(weights={"b": 3.0}))
    # Rewards 1, 0.1, 0.55 -> 1, 3, 2: the first two swap signs; the middle sits at the
    # mean both times.
    assert r["sign_flip_frac"] == 1.0
    assert r["best_changed_frac"] == 1.0
    assert r["spearman_mean"] == pytest.approx(-1.0)


def test_it_tells_a_different_best_from_a_tie_each_over_the_groups_with_a_unique_best() -> None:
    # Group 0: a separates; dropping it leaves b, whose best is another rollout (different best).
    # Group 1: only a separates; dropping it ties every rollout (now tied, not a new winner).
    # Group 2: a tie for the best before: not counted in either denominator.
    x = np.array(
        [[1, 0], [0, 1], [0, 0], [1, 0], [0, 0], [0, 0], [1, 1], [1, 1], [0, 0]], dtype=float
    )
    data = dg.RunArrays([C("a", 1.0), C("b", 0.5)], x, np.repeat([0, 1, 2], 3), np.zeros(9, int))
    r = abl.ablate(data, abl.AblationSpec(drop=("a",)))
    assert (r["unique_best_groups"], r["best_different"], r["best_tied"]) == (2, 1, 1)
    assert (r["best_different_frac"], r["best_tied_frac"]) == (0.5, 0.5)
    assert "a different best in 1 of 2 groups with a unique best" in r["verdict"]["text"]
    assert "1 of 2 now tied" in r["verdict"]["text"]


def test_it_recomputes_with_the_ingestion_function_for_every_aggregation() -> None:
    data = healthy()
    for scale in ("group", "batch", "none"):
        for agg in ("sum_then_normalize", "normalize_then_sum"):
            spec = abl.AblationSpec(scale_rewards=scale, aggregation=agg)
            r = abl.ablate(data, spec, abl.Baseline(scale, agg))
            assert r["mean_abs_delta"] == pytest.approx(0.0, abs=1e-12), (scale, agg)
    r = abl.ablate(data, abl.AblationSpec(aggregation="normalize_then_sum"))
    assert r["mean_abs_delta"] > 0.01


def test_it_ranks_ties_by_their_average_like_scipy() -> None:
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(50), 6)
    a, b = rng.integers(0, 3, 300).astype(float), rng.integers(0, 3, 300).astype(float)
    rho = abl.group_spearman(a, b, g, 50)
    for i in range(50):
        sl = slice(6 * i, 6 * i + 6)
        if np.ptp(a[sl]) == 0 or np.ptp(b[sl]) == 0:
            assert math.isnan(rho[i])
        else:
            assert rho[i] == pytest.approx(sps.spearmanr(a[sl], b[sl]).statistic)


def test_it_matches_the_python_loop_baseline() -> None:
    data = healthy()
    rows = list(zip(data.group_ids.tolist(), data.matrix.tolist(), strict=True))
    loop = abl.python_loop_advantages(rows, data.weights.tolist())
    vec = stats.compute_advantages(
        data.matrix, data.weights, data.group_ids, batch_ids=data.steps
    ).advantages
    assert np.allclose(loop, vec)


def test_it_gives_the_same_spearman_on_the_regular_fast_path() -> None:
    rng = np.random.default_rng(5)
    g = rng.permutation(np.repeat(np.arange(300), 8))  # rows in any order
    a, b = rng.integers(0, 4, g.size).astype(float), rng.integers(0, 4, g.size).astype(float)
    a[::17] = np.nan
    blocks = dg.regular_blocks(g, 300)
    assert blocks is not None and blocks[1] == 8
    fast, slow = abl.group_spearman(a, b, g, 300, blocks), abl.group_spearman(a, b, g, 300)
    assert np.allclose(fast, slow, equal_nan=True)
    assert dg.regular_blocks(np.array([0, 0, 1]), 2) is None


def test_it_counts_collapse_the_same_on_ragged_and_regular_groups() -> None:
    rng = np.random.default_rng(9)
    x = rng.integers(0, 2, (400, 2)).astype(float)
    comps = [C("a", 1.0), C("b", 1.0)]
    regular = dg.RunArrays(comps, x, np.repeat(np.arange(50), 8), np.zeros(400, int))
    ragged_ids = np.repeat(np.arange(50), 8)
    ragged_ids[-1] = 999  # one singleton group breaks the equal-size layout
    ragged = dg.RunArrays(comps, x, ragged_ids, np.zeros(400, int))
    assert dg.regular_blocks(*dg.dense_ids(ragged.group_ids)) is None
    a, b = dg.aggregation_collapse(regular), dg.aggregation_collapse(ragged)
    assert a["groups"] == 50 and b["groups"] == 50  # the singleton has one vector: not counted
    assert a["collapsed"] - b["collapsed"] in (0, 1)
    # Row-level: the last rollout moved out of group 49, so at most that group's rollouts differ.
    assert abs(a["rollouts_frac"] - b["rollouts_frac"]) <= 8 / 400


def test_it_ranks_large_groups_on_the_sorting_path_too() -> None:
    rng = np.random.default_rng(6)
    g = np.repeat(np.arange(40), 20)  # G > 16: per-row sort instead of G^2 comparisons
    a, b = rng.integers(0, 5, g.size).astype(float), rng.integers(0, 5, g.size).astype(float)
    fast = abl.group_spearman(a, b, g, 40, dg.regular_blocks(g, 40))
    assert np.allclose(fast, abl.group_spearman(a, b, g, 40), equal_nan=True)


def test_it_gives_the_same_ablation_whatever_the_row_order() -> None:
    data = healthy()
    perm = np.random.default_rng(2).permutation(data.n)
    shuffled = data.select(perm)
    spec = abl.AblationSpec(drop=("format",), weights={"correct": 3.0})
    a, b = abl.ablate(data, spec), abl.ablate(shuffled, spec)
    for key in (
        "mean_abs_delta",
        "sign_flip_frac",
        "best_changed_frac",
        "spearman_mean",
        "zero_std_after",
    ):
        assert a[key] == pytest.approx(b[key], abs=1e-12), key
    assert [t["group_id"] for t in a["top_groups"]] == [t["group_id"] for t in b["top_groups"]]


# ----------------------------------------------------------- over time: onsets, collapse, kind-free


def ask_to_code_like(
    steps: int = 40, onset: int = 5, kinds: bool = True, groups: int = 8
) -> dg.RunArrays:
    """The issue's case: 'asked_before_coding' (behavioural, 0.6) at its maximum in every group from
    step `onset`, while 'correctness' (outcome, 1.0) stays sparse and varying."""
    comps = [
        C("correctness", 1.0, "outcome" if kinds else "", 0, 1),
        C("asked_before_coding", 0.6, "behavioural" if kinds else "", 0, 1),
    ]

    def gen(rng, step, G):
        ask = (
            np.ones(G) if step >= onset else (rng.random(G) < 0.05).astype(float)
        )  # rarely asked before
        return np.column_stack([(rng.random(G) < 0.25), ask]).astype(float), rng.integers(20, 80, G)

    return synth(comps, gen, steps=steps, groups=groups, G=6)


def finding(d: dg.Diagnosis, code: str, component: str | None = None) -> dg.Finding:
    return next(
        f for f in d.findings if f.code == code and (component is None or f.component == component)
    )


def test_it_dates_a_saturation_that_the_whole_window_numbers_hide() -> None:
    data = ask_to_code_like(onset=5)
    whole = dg.component_health(data).by_name()["asked_before_coding"]
    assert 0.85 < whole.at_max < 0.9  # the 87%: under the whole-window rule's 90%
    f = finding(dg.diagnose(data), "saturation", "asked_before_coding")
    assert f.onset_step == 5
    assert f.title.startswith(
        "'asked_before_coding' is saturated from step 5: at its maximum in 100% of rollouts"
    )
    assert f.evidence["at_max"] == 1.0


@pytest.mark.parametrize("steps", [10, 50, 200])
def test_it_flags_a_component_saturated_for_the_later_80_percent_of_a_run(steps: int) -> None:
    onset = steps // 5
    f = finding(
        dg.diagnose(ask_to_code_like(steps=steps, onset=onset)), "saturation", "asked_before_coding"
    )
    assert abs(f.onset_step - onset) <= 2


def test_it_pools_per_step_health_into_the_whole_window_numbers() -> None:
    data = healthy()
    whole = dg.component_health(data)
    table = dg.step_table(data)
    pooled = table.health(0, table.steps.size)
    for a, b in zip(whole.components, pooled.components, strict=True):
        for key in ("mean", "zero_std_frac", "share", "at_max", "at_min", "within_std", "level"):
            assert getattr(a, key) == pytest.approx(getattr(b, key), abs=1e-9), (a.name, key)
    assert pooled.reward_zero_std_frac == pytest.approx(whole.reward_zero_std_frac)
    assert pooled.n_groups == whole.n_groups and pooled.step_min == 0 and pooled.step_max == 19
    series = (
        table.series()
    )  # vectorised over steps: the same numbers as the health of each single step
    for i in (0, 7, 19):
        one = table.health(i, i + 1)
        for c in one.components:
            for key in ("zero_std_frac", "at_max", "at_min", "share"):
                assert series["components"][c.name][key][i] == pytest.approx(getattr(c, key)), (
                    i,
                    c.name,
                    key,
                )


def test_it_reports_per_step_component_health_over_time() -> None:
    d = dg.diagnose(ask_to_code_like(steps=12, onset=5))
    series = d.over_time["components"]["asked_before_coding"]
    assert d.over_time["steps"] == list(range(12))
    assert series["zero_std_frac"][5:] == [1.0] * 7 and series["share"][6] == 0.0
    assert series["at_max"][5:] == [1.0] * 7 and max(series["at_max"][:5]) < 0.5


@pytest.mark.slow
def test_it_dates_planted_failures_of_every_kind_near_their_onset() -> None:
    from bench.diagnostics import detected, plant

    rng = np.random.default_rng(7)
    for kind in ("dead", "saturation", "unreachable", "signal_collapse", "trivial_outputs"):
        for declared in (True, False):
            p = plant(kind, rng, declared)
            f = detected(p, dg.diagnose(p.data))
            assert f is not None, (kind, declared)
            assert abs(f.onset_step - p.onset) <= 3, (kind, declared, f.onset_step, p.onset)


@pytest.mark.slow
def test_it_raises_no_critical_finding_on_generated_healthy_runs() -> None:
    from bench.diagnostics import healthy as healthy_run

    rng = np.random.default_rng(11)
    for _ in range(15):
        d = dg.diagnose(healthy_run(rng).data)
        assert not [f.title for f in d.findings if f.severity == "critical"]


def test_it_reports_signal_collapse_with_its_step_and_what_to_try() -> None:
    def gen(rng, step, G):
        solved = (
            step >= 12 and rng.random() < 0.9
        )  # from step 12 most prompts are solved by every completion
        correct = np.ones(G) if solved else (rng.random(G) < 0.5).astype(float)
        return np.column_stack([correct, correct]), rng.integers(50, 150, G)

    d = dg.diagnose(synth(HEALTHY_COMPONENTS[:2], gen, steps=30))
    f = finding(d, "signal_collapse")
    assert f.onset_step == 12 and f.severity == "critical"
    assert f.title.startswith("Signal collapse from step 12:")
    assert "dynamic sampling" in f.fix and "larger group" in f.fix and "partial credit" in f.fix
    assert "signal_collapse" not in codes(dg.diagnose(healthy()))


def test_it_infers_kinds_from_the_values_when_none_are_declared() -> None:
    comps = [C("passes", 1.0, ""), C("tidy", 0.5, ""), C("verbose", -0.3, ""), C("score", 0.2, "")]

    def gen(rng, step, G):
        return np.column_stack(
            [rng.random(G) < 0.2, rng.random(G) < 0.9, rng.random(G) < 0.5, rng.random(G)]
        ).astype(float), rng.integers(5, 9, G)

    d = dg.diagnose(synth(comps, gen))
    assert d.inferred_kinds["passes"].startswith("binary, sparse") and d.inferred_kinds[
        "passes"
    ].endswith("task-like")
    assert d.inferred_kinds["tidy"].startswith("binary, dense") and d.inferred_kinds[
        "tidy"
    ].endswith("validity-like")
    assert d.inferred_kinds["verbose"].endswith("-> penalty")  # a negative weight
    assert d.inferred_kinds["score"].startswith("graded")
    declared = dg.diagnose(
        synth(
            [
                C("passes", 1.0, "outcome"),
                C("tidy", 0.5, "behavioural"),
                C("verbose", -0.3, "penalty"),
                C("score", 0.2, "process"),
            ],
            gen,
        )
    )
    assert declared.inferred_kinds == {}


def test_it_finds_saturation_without_kinds_and_says_what_it_inferred() -> None:
    d = dg.diagnose(ask_to_code_like(onset=5, kinds=False))
    f = finding(d, "saturation", "asked_before_coding")
    assert f.onset_step == 5
    assert (
        "No kinds were declared" in f.detail and "'asked_before_coding' binary, dense" in f.detail
    )
    assert f.evidence["inferred_kinds"]["correctness"].endswith("task-like")


def test_it_finds_unreachable_and_trivial_outputs_without_kinds() -> None:
    comps = [C("passes", 1.0, ""), C("parses", 0.5, "")]

    def unreachable(rng, step, G):
        return np.column_stack([rng.random(G) < 0.01, rng.random(G) < 0.6]).astype(
            float
        ), rng.integers(5, 9, G)

    def trivial(
        rng, step, G
    ):  # the task varied, then from step 4 only the validity check is passed
        after = step >= 4
        passes = np.zeros(G) if after else rng.random(G) < 0.4
        return np.column_stack(
            [passes, np.ones(G) if after else rng.random(G) < 0.5]
        ), rng.integers(5, 9, G)

    assert (
        finding(dg.diagnose(synth(comps, unreachable)), "unreachable_reward", "passes").severity
        == "critical"
    )
    f = finding(dg.diagnose(synth(comps, trivial)), "trivial_outputs")
    assert f.onset_step == 4 and "inferred from the values" in f.detail


@pytest.mark.parametrize("case", ["one step one group", "one group", "all NaN", "no rollouts"])
def test_it_says_there_is_not_enough_to_judge_instead_of_a_finding(case: str) -> None:
    if case == "no rollouts":
        none = np.zeros(0, dtype=np.int64)
        data = dg.RunArrays(HEALTHY_COMPONENTS, np.zeros((0, 3)), none, none)
    elif case == "all NaN":
        data = synth(
            HEALTHY_COMPONENTS, lambda rng, s, G: (np.full((G, 3), np.nan), np.full(G, np.nan))
        )
    else:
        data = synth(
            HEALTHY_COMPONENTS,
            healthy_gen,
            steps=1 if case == "one step one group" else 3,
            groups=1,
        )
        data = data.select(data.group_ids == data.group_ids[0])
    d = dg.diagnose(data)
    assert d.status == "not_enough_data" and d.note.startswith("not enough groups to judge")
    assert d.findings == []
    json.dumps(d.as_dict(), allow_nan=False)


def test_it_judges_a_single_component_and_a_single_step() -> None:
    dead = synth(
        [C("only", 1.0, "")],
        lambda rng, s, G: (np.full((G, 1), 0.5), rng.integers(5, 9, G)),
        steps=1,
    )
    d = dg.diagnose(dead)
    assert (
        d.status == "critical" and codes(d) == ["dead_component"] and d.findings[0].onset_step == 0
    )
    fine = synth(
        [C("only", 1.0, "")],
        lambda rng, s, G: (rng.random((G, 1)) < 0.5, rng.integers(5, 9, G)),
        steps=1,
    )
    assert dg.diagnose(fine).status == "healthy"


def test_it_bounds_the_onset_search_on_a_long_run() -> None:
    data = ask_to_code_like(steps=3000, onset=1200, groups=1)
    f = finding(dg.diagnose(data), "saturation", "asked_before_coding")
    assert abs(f.onset_step - 1200) <= 15


def test_it_suspects_the_verifier_when_an_outcome_never_leaves_its_floor() -> None:
    def gen(rng, step, G):  # correctness is 0 for every rollout: the harness never ran the code
        pen = -(rng.random(G) < 0.3).astype(float)
        return np.column_stack([np.zeros(G), rng.random(G) < 0.6, pen]).astype(float), np.full(G, 9)

    d = dg.diagnose(synth(HEALTHY_COMPONENTS, gen))
    f = finding(d, "dead_component", "correct")
    assert f.severity == "critical" and "unreachable_reward" not in codes(d)
    assert (
        f.title.startswith("'correct' scored 0 in every rollout from step 0")
        and "verifier actually runs" in f.fix
    )


def test_an_ablation_on_two_threads_answers_as_on_one(monkeypatch) -> None:
    """Past PARALLEL_ROWS the run's side and the spec's are computed on two threads: the same
    numbers, to the bit."""
    rng = np.random.default_rng(12)
    x = rng.integers(0, 5, (4000, 3)) / 4.0
    x[::13, 1] = np.nan
    data = dg.RunArrays(
        [C("a", 1.0), C("b", 0.5), C("c", 2.0)], x, np.repeat(np.arange(500), 8),
        np.repeat(np.arange(10), 400),
    )  # fmt: skip
    spec = abl.AblationSpec(drop=("b",), weights={"a": 3.0})
    calls = []
    real = abl.ThreadPoolExecutor

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(abl, "ThreadPoolExecutor", counting)
    serial = abl.ablate(data, spec)
    assert not calls
    monkeypatch.setattr(abl, "PARALLEL_ROWS", 0)
    threaded = abl.ablate(data, spec)
    assert len(calls) == 2  # the advantages and the ranks
    assert json.dumps(serial, sort_keys=True) == json.dumps(threaded, sort_keys=True)

"""training/token_diagnostics.py: the token findings fire on a planted sampler/trainer mismatch, a
planted entropy collapse and tool output trained on, each at its onset, and stay quiet on a healthy
run. Token arrays are drawn per rollout and pooled per step the way a recorder would. Pure numpy."""

from __future__ import annotations

import math

import numpy as np

from training import diagnostics as dg
from training import token_diagnostics as td

STEPS, ROLLOUTS, TOKENS = 30, 12, 120


def token_run(noise, entropy_mean, near_zero=lambda s: 0.0, seed: int = 0) -> td.TokenSteps:
    """A run of STEPS steps x ROLLOUTS rollouts x TOKENS tokens. noise(step): the std of the
    sampler's log-prob error against the trainer's; entropy_mean(step), near_zero(step): the mean
    per-token entropy and the share of tokens the policy is certain of."""
    rng = np.random.default_rng(seed)
    by_step = {}
    for s in range(STEPS):
        sums = []
        for _ in range(ROLLOUTS):
            trainer = -rng.gamma(0.6, 0.8, TOKENS)
            sampler = np.minimum(trainer + rng.normal(0.0, noise(s), TOKENS), 0.0)
            entropy = rng.gamma(2.0, entropy_mean(s) / 2.0, TOKENS)
            entropy[rng.random(TOKENS) < near_zero(s)] = 1e-4
            mask = np.ones(TOKENS)
            mask[:5] = 0  # a few template tokens out of the loss
            sums.append(td.rollout_sums(sampler, trainer, entropy, mask, TOKENS))
        by_step[s] = sums
    return td.step_stats(by_step)


def healthy_noise(s):
    return 0.01  # bf16 sampler vs fp32 trainer: a hundredth of a nat


def healthy_entropy(s):
    return 1.0 - 0.01 * s  # slowly sharpening, as a learning policy does


def test_it_is_quiet_on_a_healthy_run():
    ts = token_run(healthy_noise, healthy_entropy, near_zero=lambda s: 0.02)
    assert td.diagnose_tokens(ts) == []


def test_it_computes_the_step_statistics_from_token_arrays():
    trainer = np.array([-0.1, -1.0, -2.0, -0.5])
    sampler = np.array([-0.1, -2.0, -0.5, -9.0])  # the last token is masked out
    sums = td.rollout_sums(sampler, trainer, np.array([0.0, 0.5, 1.0, 3.0]), [1, 1, 1, 0], 4)
    ts = td.step_stats({7: [sums]})
    d = np.array([0.0, 1.0, -1.5])
    assert ts.steps.tolist() == [7]
    assert math.isclose(ts.mean_abs_delta[0], np.abs(d).mean())
    assert math.isclose(ts.k3[0], float(np.mean(np.exp(d) - 1 - d)))
    assert math.isclose(
        ts.ratio_out_fraction[0], 2 / 3
    )  # ratios e^1 and e^-1.5 are outside [0.5, 2]
    assert ts.max_abs_delta[0] == 1.5
    assert math.isclose(ts.mean_entropy[0], 0.5)
    assert math.isclose(ts.low_entropy_fraction[0], 1 / 3)
    assert ts.masked_fraction[0] == 0.25


def test_it_flags_a_mismatch_rising_at_its_onset():
    onset = 18
    ts = token_run(lambda s: 0.01 if s < onset else 0.08 + 0.01 * (s - onset), healthy_entropy)
    findings = td.diagnose_tokens(ts)
    assert [f.code for f in findings] == ["token_mismatch"]
    f = findings[0]
    assert f.onset_step == onset
    assert f"since step {onset}" in f.title
    assert f.evidence["mean_abs_delta_after"] > 5 * f.evidence["mean_abs_delta_before"]
    assert f.evidence["ratio_out_fraction_after"] >= 0  # numbers, not NaN
    assert f.as_dict()["evidence"]["k3_after"] > 0


def test_it_flags_a_sudden_mismatch_as_critical_when_ratios_leave_the_band():
    ts = token_run(lambda s: 0.01 if s < 10 else 0.6, healthy_entropy)
    (f,) = td.detect_mismatch(ts)
    assert f.onset_step == 10
    assert f.severity == "critical"
    assert f.evidence["ratio_out_fraction_after"] > 0.05


def test_a_mismatch_high_from_the_first_step_has_no_rise_to_report():
    ts = token_run(lambda s: 0.3, healthy_entropy)
    assert td.detect_mismatch(ts) == []


def test_it_flags_entropy_collapse_at_its_onset():
    onset = 12
    ts = token_run(
        healthy_noise,
        lambda s: 1.0 if s < onset else 0.15,
        near_zero=lambda s: 0.02 if s < onset else 0.7,
    )
    findings = td.diagnose_tokens(ts)
    assert [f.code for f in findings] == ["entropy_collapse"]
    f = findings[0]
    assert f.onset_step == onset
    assert f.severity == "critical"
    assert f.evidence["near_zero_after"] > 0.5 > f.evidence["near_zero_before"]


def test_a_gradual_entropy_decline_without_certain_tokens_is_not_a_collapse():
    ts = token_run(healthy_noise, lambda s: 1.0 - 0.02 * s, near_zero=lambda s: 0.02)
    assert td.detect_entropy_collapse(ts) == []


def test_the_onset_rule_is_the_diagnostics_one():
    """The state must hold over the hold length (max(3, 20% of the steps) = 6 of 30 here): a change
    in the last 3 steps is not reported yet, however large; a longer hold moves a change out of
    reach, as it does for the reward findings."""
    late = token_run(lambda s: 0.01 if s < 27 else 0.6, healthy_entropy)
    assert td.detect_mismatch(late) == []
    ts = token_run(lambda s: 0.01 if s < 22 else 0.3, healthy_entropy)
    assert [f.onset_step for f in td.detect_mismatch(ts)] == [22]
    assert td.detect_mismatch(ts, dg.Thresholds(min_hold_frac=0.4)) == []


def transcript_roles():
    return ["assistant", "tool", "assistant", "tool", "assistant"]


def test_it_counts_tool_tokens_in_the_loss_by_turn_and_by_offset():
    turns = np.array([0, 0, 1, 1, 1, 2, 3, 4])
    mask = np.array([1, 1, 1, 0, 0, 1, 1, 1])
    assert td.tool_tokens_in_loss(turns, mask, transcript_roles()) == (4, 2)
    assert td.tool_tokens_in_loss(turns, None, transcript_roles()) == (4, 4)
    spans = [(0, 10), (10, 30), (30, 40), (40, 50), (50, 60)]
    offsets = np.array([0, 5, 10, 20, 29, 30, 45, 55])
    assert td.tool_tokens_in_loss(None, mask, transcript_roles(), offsets, spans) == (4, 2)
    assert td.tool_tokens_in_loss(None, mask, transcript_roles()) == (0, 0)


def tool_run(leak_from: int | None) -> td.ToolTokens:
    rng = np.random.default_rng(1)
    ids, steps, tool, in_loss = [], [], [], []
    rid = 100
    for s in range(STEPS):
        for _ in range(ROLLOUTS):
            rid += 1
            n = int(rng.integers(1, 4))  # tool turns of this rollout
            turns = np.repeat(np.arange(2 * n + 1), 20)
            roles = ["assistant", "tool"] * n + ["assistant"]
            leaks = leak_from is not None and s >= leak_from
            mask = np.array([1 if roles[t] == "assistant" or leaks else 0 for t in turns])
            total, trained = td.tool_tokens_in_loss(turns, mask, roles)
            ids.append(rid)
            steps.append(s)
            tool.append(total)
            in_loss.append(trained)
    return td.ToolTokens(np.array(ids), np.array(steps), np.array(tool), np.array(in_loss))


def test_it_flags_tool_output_in_the_loss_from_its_onset():
    tools = tool_run(leak_from=9)
    (f,) = td.detect_tool_tokens_in_loss(tools)
    assert f.code == "tool_tokens_in_loss" and f.severity == "critical"
    assert f.onset_step == 9
    assert f.evidence["rollouts_leaking"] == (STEPS - 9) * ROLLOUTS
    assert f.evidence["example_rollouts"][0] == 101 + 9 * ROLLOUTS


def test_it_is_quiet_when_tool_output_is_masked():
    assert td.detect_tool_tokens_in_loss(tool_run(leak_from=None)) == []
    ts = token_run(healthy_noise, healthy_entropy)
    assert td.diagnose_tokens(ts, tool_run(None)) == []

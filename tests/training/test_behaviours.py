"""The behaviour math (training/behaviours.py) on per-step sums: the onset rule, its mirror for a
fading behaviour, and when a rise counts as taught."""

from __future__ import annotations

import numpy as np

from training import behaviours as tb


def series(rates: list[float], n: int = 64, gap: float = 0.0, seed: int = 0) -> tb.BehaviourSeries:
    """Per step n rollouts, round(rate x n) showing it; advantages N(+gap/2, 1) for them and
    N(-gap/2 x share, 1) for the rest."""
    rng = np.random.default_rng(seed)
    rows = []
    for step, rate in enumerate(rates):
        k = int(round(rate * n))
        a_in = rng.normal(gap / 2, 1.0, k)
        a_out = rng.normal(-gap / 2 * k / max(n - k, 1), 1.0, n - k)
        rows.append(
            (step, n, k, a_in.sum(), (a_in**2).sum(), k, a_out.sum(), (a_out**2).sum(), n - k)
        )
    return tb.BehaviourSeries.from_rows(rows)


T = tb.BehaviourThresholds()


def test_it_finds_the_step_a_behaviour_appears():
    s = series([0.0] * 30 + [0.4] * 30)
    assert int(s.steps[tb.onset(s, +1, T)]) == 30
    assert tb.onset(s, -1, T) is None


def test_it_finds_a_gradual_rise_near_where_it_leaves_its_early_level():
    rng = np.random.default_rng(3)
    rates = [0.05 + 0.02 * rng.random() for _ in range(20)] + [
        min(0.6, 0.05 + 0.03 * i) for i in range(1, 41)
    ]
    i = tb.onset(series(rates), +1, T)
    assert i is not None and 20 <= i <= 24


def test_it_says_nothing_about_a_flat_noisy_rate():
    rng = np.random.default_rng(1)
    s = series([0.2 + 0.03 * rng.standard_normal() for _ in range(60)])
    assert tb.onset(s, +1, T) is None and tb.onset(s, -1, T) is None
    assert tb.findings(tb.BehaviourInfo("flat"), s) == []


def test_it_reports_fading_from_the_step_it_fell():
    s = series([0.5] * 25 + [0.05] * 35)
    (f,) = tb.findings(tb.BehaviourInfo("old hack"), s)
    assert f.code == "behaviour_fading" and f.onset_step == 25


def test_it_calls_a_rise_taught_only_when_its_rollouts_get_more_advantage():
    rates = [0.0] * 30 + [0.4] * 30
    (taught,) = tb.findings(tb.BehaviourInfo("hack"), series(rates, gap=1.0))
    assert taught.code == "behaviour_taught" and taught.evidence["advantage_gap"] > 0.5
    (rising,) = tb.findings(tb.BehaviourInfo("style"), series(rates, gap=0.0))
    assert rising.code == "behaviour_rising" and rising.severity == "info"


def test_it_fails_the_gate_past_a_critical_rate_only():
    rates = [0.0] * 30 + [0.4] * 30
    over = tb.findings(tb.BehaviourInfo("hack", critical=True, max_rate=0.3), series(rates))
    assert "behaviour_critical" in {f.code for f in over}
    under = tb.findings(tb.BehaviourInfo("hack", critical=True, max_rate=0.5), series(rates))
    assert "behaviour_critical" not in {f.code for f in under}

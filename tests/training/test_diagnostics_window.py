"""Onsets are not clipped to the window: a finding that already holds at the window's first step is
dated from the steps before it (when they were read), or flagged "or earlier" (when they were not);
and each finding's numbers name the steps they describe."""

from __future__ import annotations

import numpy as np

from tests.training.test_diagnostics import C, ask_to_code_like, finding, healthy_gen, synth
from training import diagnostics as dg

DEAD = [
    C("correct", 1.0, "outcome", 0.0, 1.0),
    C("format", 0.5, "behavioural", 0.0, 1.0),
    C("penalty", 0.2, "penalty", -1.0, 0.0),
    C("steps", 3.0, "process", 0.0, 1.0),
]


def dead_from_zero(steps: int = 30) -> dg.RunArrays:
    """A heavy process component stuck at 0.5 in every rollout from step 0."""

    def gen(rng, step, G):
        v, ln = healthy_gen(rng, step, G)
        return np.column_stack([v, np.full(G, 0.5)]), ln

    return synth(DEAD, gen, steps=steps)


def test_it_says_since_step_0_for_a_component_dead_from_step_0_in_a_window_from_step_10() -> None:
    data = dead_from_zero()
    clipped = finding(dg.diagnose(data.select(data.steps >= 10)), "dead_component", "steps")
    assert clipped.onset_step == 10  # what the window alone can tell: its own first step
    f = finding(dg.diagnose(data, window_from=10), "dead_component", "steps")
    assert f.onset_step == 0 and f.onset_known
    assert "from step 0" in f.title


def test_it_dates_a_saturation_from_step_5_when_the_window_starts_at_10() -> None:
    d = dg.diagnose(ask_to_code_like(steps=40, onset=5), window_from=10)
    f = finding(d, "saturation", "asked_before_coding")
    assert f.onset_step == 5
    assert f.title.startswith("'asked_before_coding' is saturated from step 5")
    assert d.health.step_min == 10  # the health table is the window's, and says so


def test_it_flags_an_onset_on_the_first_step_read_when_earlier_steps_were_not() -> None:
    data = dead_from_zero()
    d = dg.diagnose(data.select(data.steps >= 10), history_complete=False)
    f = finding(d, "dead_component", "steps")
    assert f.onset_step == 10 and not f.onset_known  # "since step 10 or earlier"
    assert dg.diagnose(data, window_from=10).findings[0].onset_known


def test_it_keeps_an_onset_inside_the_window_as_it_is() -> None:
    d = dg.diagnose(ask_to_code_like(steps=40, onset=25), window_from=10)
    assert finding(d, "saturation", "asked_before_coding").onset_step == 25


def test_it_labels_a_findings_share_with_its_steps_beside_the_windows_share() -> None:
    d = dg.diagnose(ask_to_code_like(steps=40, onset=5))
    f = finding(d, "saturation", "asked_before_coding")
    table_share = d.health.by_name()["asked_before_coding"].share
    assert f.detail.startswith("Over steps 5-39: ")
    assert (
        f"Over the whole window (steps 0-39, as in the health table) 'asked_before_coding' has "
        f"{100 * table_share:.1f}% of the advantage." in f.detail
    )

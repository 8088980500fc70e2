"""Per-step series: every page reads them from StepStat (kept at ingest), so the dashboard, the
diagnostics page, the twin overlay and the jobs compare page draw the same numbers."""

import pytest

from tests.conftest import make_group
from webapp.diagnostics import services as diagnostics
from webapp.rollouts.ingest import ingest_groups
from webapp.runs.job_views import compare_figures
from webapp.runs.queries import dashboard_data

# Two groups of different sizes at step 0: the mean over rollouts (TRL's rewards/<name>/mean, the
# dashboard's) is 0.75; the mean of the two group means would be 0.6875.
STEP0 = [
    make_group(0, "big", [{"correct": 1.0}, {"correct": 1.0}, {"correct": 1.0}, {"correct": 0.5}]),
    make_group(0, "small", [{"correct": 0.0, "format": 1.0}, {"correct": 1.0, "format": 1.0}]),
]
STEP1 = [make_group(1, "only", [{"correct": 0.0}, {"correct": 0.0}])]


@pytest.fixture
def stored(run):
    ingest_groups(run, {"groups": STEP0})
    ingest_groups(run, {"groups": STEP1})
    return run


def test_it_draws_the_same_component_means_on_the_dashboard_and_the_diagnostics_page(stored):
    dash = {c.name: c for c in dashboard_data(stored).components}
    diag = diagnostics.step_aggregates(stored)
    assert diag["steps"] == [0, 1]
    assert dash["correct"].mean == pytest.approx([(3.5 + 1.0) / 6, 0.0])
    assert diag["components"]["correct"]["mean"] == pytest.approx(dash["correct"].mean)
    assert diag["components"]["correct"]["std"] == pytest.approx(dash["correct"].within_std)
    assert diag["components"]["correct"]["zero_std_frac"] == dash["correct"].zero_std_frac
    # format scored only at step 0: the diagnostics axis has a hole where the dashboard has no point
    assert dash["format"].steps == [0]
    assert diag["components"]["format"]["mean"] == [1.0, None]
    assert diag["components"]["penalty"]["mean"] == [None, None]  # never scored


def test_it_draws_the_same_reward_curve_on_the_dashboard_and_the_diagnostics_page(stored):
    dash = dashboard_data(stored)
    diag = diagnostics.step_aggregates(stored)
    assert diag["reward_mean"] == pytest.approx(dash.reward.mean)
    assert diag["reward_zero_std_frac"] == dash.zero_std_frac == [0.0, 1.0]


def test_it_overlays_and_compares_the_dashboard_curves(stored):
    dash = {c.name: c for c in dashboard_data(stored).components}
    [overlay] = diagnostics.overlay_series([stored])
    assert overlay["components"]["correct"] == pytest.approx(dash["correct"].mean)
    reward, *per_component = compare_figures([stored])
    assert reward["data"][0]["y"] == pytest.approx(dashboard_data(stored).reward.mean)
    correct = next(f for f in per_component if f["layout"]["title"]["text"] == "correct mean")
    assert correct["data"][0]["x"] == [0, 1]
    assert correct["data"][0]["y"] == pytest.approx(dash["correct"].mean)
    titles = {f["layout"]["title"]["text"] for f in per_component}
    assert titles == {"correct mean", "format mean"}  # penalty scored nothing: no empty chart


def test_it_windows_the_diagnosis_by_the_rollouts_each_step_holds(stored):
    assert diagnostics.window_start(stored, 1) == 1
    assert diagnostics.window_start(stored, 5) is None  # shorter than the window
    assert (
        diagnostics.window_start(stored, 5, max_rollouts=7) == 1
    )  # step 0 holds 6, step 1 holds 2
    assert diagnostics.window_start(stored, 5, max_rollouts=8) is None

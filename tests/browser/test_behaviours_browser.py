"""Behaviours in real headless Chromium: from 5 labelled hacks, find more like this, accept a
proposal, save it as a critical behaviour; its onset and rate on the run dashboard, a click through
to that step's matching rollouts; a hostile name runs no script."""

from __future__ import annotations

import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD
from tests.webapp.test_behaviours import ONSET, label_hacks, seed_planted

HOSTILE = '<img src=x onerror="alert(1)"> skips tests'


@pytest.mark.slow
@pytest.mark.browser
def test_it_goes_from_labelled_hacks_to_a_behaviour_on_the_dashboard(
    page, live_server, personas, run, shot
):
    seed_planted(run)
    label_hacks(run, personas["annotator"])
    login(page, live_server, "annotator", PASSWORD)

    page.goto(f"{live_server.url}/runs/{run.id}/rollouts/?label=reward-hacking")
    page.click("#find-like")
    first = page.locator("section.proposal").first
    assert first.locator(".recall").inner_text() == "5 of 5"
    assert first.locator(".sample li").count() >= 1
    shot(page, "behaviours-find-like")
    first.locator(".save-proposal").click()

    page.fill('input[name="name"]', HOSTILE)
    page.check('input[name="critical"]')
    page.fill('input[name="max_rate"]', "0.2")
    page.click("#behaviour-form button")
    page.wait_for_selector('.chart[data-chart="overlay"][data-drawn] .main-svg')
    assert "toy-run" in page.locator("#behaviour-runs").inner_text()

    page.goto(f"{live_server.url}/runs/{run.id}/")
    chart = page.wait_for_selector("#behaviours .chart[data-drawn] .main-svg")
    assert chart is not None
    onset = int(page.locator("#behaviours .onset").first.inner_text().rsplit(" ", 1)[1])
    assert abs(onset - ONSET) <= 2
    assert "The reward teaches" in page.locator("#behaviours").inner_text()
    assert HOSTILE in page.locator("#behaviours").inner_text()  # shown as text
    shot(page, "behaviours-dashboard")

    # A click on the step 45 point opens that step's matching rollouts in the explorer.
    page.evaluate(
        """() => document.querySelector('#behaviours .chart[data-drawn]')
             .emit('plotly_click', {points: [{x: 45}]})"""
    )
    page.wait_for_url("**/rollouts/?**step_min=45&step_max=45")
    rows = page.locator("#rollout-table tbody tr")
    assert rows.count() > 0
    assert all(t.split()[0] == "45" for t in rows.all_inner_texts())
    assert page.dialogs == [] and page.page_errors == []

"""The replay pages in real headless Chromium: charts drawn, forms work, no script
from model output."""

import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD
from tests.webapp import replay_fixtures as fx

HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script>\n' + fx.EDGE_SPAM


@pytest.mark.slow
@pytest.mark.browser
def test_it_draws_a_replay_and_runs_no_script_from_model_output(page, live_server, personas, shot):
    from webapp.replays import services

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [
            fx.group_record(s, f"g{s}", [HOSTILE, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE])
            for s in range(3)
        ],
    )
    for rollout in run.rollouts.filter(index=0):
        fx.annotate(rollout.id, "reward-hacking", personas["annotator"])
    replay = services.create_replay(run, {"versions": [{"version": "semantic_coverage@no_extras"}]})
    services.work(replay.id, "test")

    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/replays/{replay.id}/")
    page.wait_for_selector('.chart[data-chart="share"][data-drawn] .main-svg')
    assert (
        page.locator("#replay-headline")
        .inner_text()
        .startswith("Reward hacks still ranked best in their group: 0 of 3")
    )
    assert page.locator("#replay-regression tbody tr").count() == 3
    assert (
        "<script>alert(2)</script>" in page.locator("#replay-regression").inner_text()
    )  # shown as text
    shot(page, "replay-detail")

    page.goto(f"{live_server.url}/replays/runs/{run.id}/")
    page.select_option('select[name="version_0"]', "semantic_coverage@strict")
    page.fill('input[name="params_0"]', '{"min_coverage": 0.9}')
    page.click("#replay-form button")
    page.wait_for_selector("#replay-progress")
    assert "queued" in page.locator("#replay-progress").inner_text()
    assert page.dialogs == [] and page.page_errors == []

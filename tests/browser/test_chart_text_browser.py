"""Plotly in a real Chromium draws a hostile metric, component and run name as text: no
link, no markup."""

from __future__ import annotations

import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD, make_group

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EVIL = "<a href=//evil.example/>x</a>"


def test_it_draws_hostile_names_in_charts_as_text_never_as_links(page, live_server, personas):
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, ensure_environment
    from webapp.runs.metrics import record_metrics

    env = ensure_environment(
        "hostile-charts",
        [
            {
                "name": EVIL,
                "weight": 1.0,
                "kind": "outcome",
                "min_value": 0.0,
                "max_value": 1.0,
                "description": "",
                "source_hash": "",
            }
        ],
    )
    run = create_run(name=EVIL, kind="grpo", environment=env, config={}, status="running")
    ingest_groups(
        run, {"groups": [make_group(s, f"p{s}", [{EVIL: 1.0}, {EVIL: 0.0}]) for s in range(4)]}
    )
    record_metrics(run, {"metrics": [{"step": s, "values": {EVIL: 0.1 * s}} for s in range(4)]})
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{run.id}/")
    page.wait_for_selector('[data-chart^="metric"] .main-svg')
    page.wait_for_selector('[data-chart="mean-0"] .main-svg')
    svg_text = page.eval_on_selector_all(
        ".main-svg", "ss => ss.map(s => s.textContent).join('\\n')"
    )
    assert (
        EVIL in svg_text
    )  # the name reads as typed: plotly turned the escaped text back into characters
    assert page.locator(".main-svg a").count() == 0  # and drew no link
    assert "evil.example" not in page.evaluate(
        "Array.from(document.links).map(a => a.href).join(' ')"
    )
    assert page.page_errors == []

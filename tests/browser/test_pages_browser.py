"""The pages in a real Chromium: login, dashboard charts, explorer sorting/paging/keyboard, group,
transcript, and hostile transcripts that must run no script."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow]

XSS_BITS = [
    "<script>window.__pwned = 1; alert('script')</script>",
    "<img src=x onerror=\"window.__pwned = 2; alert('onerror')\">",
    '<a id="jslink" href="javascript:window.__pwned = 3">click me</a>',
    "</textarea><script>window.__pwned = 4</script>",
    '<svg onload="window.__pwned = 5"></svg>',
    '</pre></div><iframe src="javascript:parent.__pwned = 6"></iframe>',
]


@pytest.fixture
def diagram_run(personas):
    from training.demo import generate_groups, linear_schedule
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import StepMetric

    env = get_environment("diagram")
    run = create_run(
        name="diagram-grpo",
        kind="grpo",
        environment=environment_from_training(env),
        config={"learning_rate": 1e-5, "num_generations": 8},
        base_model="tiny-llama",
        owner=personas["trainer"],
        status="running",
    )
    steps = 8
    groups = generate_groups(
        env,
        ScriptedDiagramPolicy(0, 0.2),
        steps=steps,
        groups_per_step=4,
        G=8,
        seed=3,
        skill_schedule=linear_schedule(0.1, 0.9, steps),
        holdout_groups=1,
    )
    ingest_groups(run, {"groups": groups})
    StepMetric.objects.bulk_create(
        [
            StepMetric(run=run, step=s, name=name, value=v)
            for s in range(steps)
            for name, v in (
                ("kl", 0.002 * s),
                ("loss", 0.5 - 0.03 * s),
                ("entropy", 1.2 - 0.05 * s),
                ("clip_ratio/region_mean", 0.01),
                ("completion_length", 80 + 3 * s),
            )
        ]
    )
    return run


def scroll_through(pg) -> None:
    """Scroll down a screen at a time, as a reader does, then back to the top."""
    height = pg.evaluate("document.body.scrollHeight")
    for y in range(0, height + 900, 600):
        pg.evaluate(f"window.scrollTo(0, {y})")
        pg.wait_for_timeout(50)
    pg.evaluate("window.scrollTo(0, 0)")


def _sort_values(pg) -> list[float]:
    raw = pg.eval_on_selector_all(
        "#rollout-table tbody tr[data-href]", "rs => rs.map(r => r.dataset.sortValue)"
    )
    return [float(v) for v in raw if v != ""]


def test_it_logs_in_and_draws_the_dashboard(page, live_server, diagram_run, shot):
    login(page, live_server, "viewer", PASSWORD)
    assert page.locator("table.runs").get_by_text("diagram-grpo").is_visible()
    assert page.locator("svg.spark polyline").count() == 1
    shot(page, "01-runs-list")
    page.click("text=diagram-grpo")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    scroll_through(page)  # charts below the fold are drawn as they come into view
    # every figure on the page was drawn: reward, zero-std, 2 per component (4), 5 trainer metrics
    page.wait_for_function(
        "document.querySelectorAll('[data-chart] .main-svg').length >= 2 + 8 + 5"
    )
    assert "Two different stds." in page.inner_text(".explain")
    assert page.page_errors == []
    shot(page, "02-dashboard")
    # a click on a point opens the explorer filtered to that step
    page.evaluate(
        "document.querySelector('[data-chart=reward]').emit('plotly_click', {points: [{x: 3}]})"
    )
    page.wait_for_url(re.compile(r".*/rollouts/\?step_min=3&step_max=3$"))
    page.wait_for_selector("#rollout-table")
    steps = page.eval_on_selector_all(
        "#rollout-table tbody tr[data-href] td:first-child",
        "cells => cells.map(c => parseInt(c.textContent))",
    )
    assert steps and set(steps) == {3}
    page.go_back()
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    page.keyboard.press("e")  # the dashboard's shortcut to the explorer
    page.wait_for_url(re.compile(rf".*/runs/{diagram_run.id}/rollouts/$"))


def test_it_sorts_pages_and_navigates_the_explorer_by_keyboard(
    page, live_server, diagram_run, shot
):
    login(page, live_server, "annotator", PASSWORD)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/rollouts/")
    page.click('th.comp a:has-text("semantic_coverage")')  # first click: descending
    page.wait_for_url(re.compile(r".*sort=semantic_coverage&order=desc.*"))
    page.wait_for_selector('#rollout-table[data-sort="semantic_coverage"][data-order="desc"]')
    desc = _sort_values(page)
    assert len(desc) == 50 and desc == sorted(desc, reverse=True)
    page.click('th.comp a:has-text("semantic_coverage")')  # second click: ascending
    page.wait_for_selector('#rollout-table[data-order="asc"]')
    asc = _sort_values(page)
    assert asc == sorted(asc) and asc[0] < desc[0]
    assert "sort=semantic_coverage&order=asc" in page.url
    assert (
        page.input_value('#explorer-filters select[name="sort"]') == "semantic_coverage"
    )  # form follows
    assert page.input_value('#explorer-filters select[name="order"]') == "asc"
    shot(page, "03-explorer-sorted")
    first_ids = page.eval_on_selector_all(
        "#rollout-table tbody tr[data-href]", "rs => rs.map(r => r.dataset.id)"
    )
    page.click("#next-page")
    page.wait_for_url(re.compile(r".*cursor=.*"))
    first_row = "document.querySelector('#rollout-table tbody tr[data-href]')"
    page.wait_for_function(f"!{first_row} || {first_row}.dataset.id !== '{first_ids[0]}'")
    second_ids = page.eval_on_selector_all(
        "#rollout-table tbody tr[data-href]", "rs => rs.map(r => r.dataset.id)"
    )
    page2 = _sort_values(page)
    assert second_ids and not set(first_ids) & set(second_ids)
    assert page2 == sorted(page2) and page2[0] >= asc[-1]
    # keyboard: j j k selects the second row, Enter opens its transcript in the same explorer order
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    selected = page.get_attribute("#rollout-table tr.selected", "data-id")
    assert selected == second_ids[1]
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf".*/rollouts/{selected}/\?sort=semantic_coverage&order=asc.*"))
    # j on the transcript walks to the next rollout of that order
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/rollouts/{second_ids[2]}/\?.*"))
    page.go_back()
    page.go_back()  # back to the paged explorer: the whole page comes back, with its table
    page.wait_for_selector("#rollout-table")


def test_it_shows_a_bad_filter_as_an_error_in_place(page, live_server, diagram_run):
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/rollouts/")
    page.fill('input[name="step_min"]', "three")
    page.press('input[name="step_min"]', "Enter")
    page.wait_for_selector("#explorer-table .error")
    assert "step_min" in page.inner_text("#explorer-table .error")
    page.fill('input[name="step_min"]', "2")
    page.press('input[name="step_min"]', "Enter")
    page.wait_for_selector("#rollout-table")


def test_it_opens_a_group_and_a_transcript(page, live_server, diagram_run, shot):
    from webapp.rollouts.models import Group, Rollout

    group = Group.objects.filter(run=diagram_run, zero_std=False).order_by("-reward_std").first()
    worst = Rollout.objects.filter(group=group).order_by("reward").first()
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/groups/{group.id}/")
    page.wait_for_selector(".rollout-card")
    assert page.locator(".rollout-card").count() == 8
    rewards = page.eval_on_selector_all(
        ".rollout-card header strong", "s => s.map(x => parseFloat(x.textContent))"
    )
    assert rewards == sorted(rewards, reverse=True)
    assert page.locator(".flag.sep").count() == 1
    shot(page, "04-group")
    page.goto(f"{live_server.url}/rollouts/{worst.id}/?sort=reward&order=desc")
    page.wait_for_selector(".msg.assistant")
    img = page.locator("img.state-img")
    assert img.count() == 1
    page.wait_for_function(
        "document.querySelector('img.state-img').naturalWidth > 0"
    )  # the SVG decoded
    shot(page, "05-transcript")
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/no-signal/")
    page.wait_for_selector("table.nosignal-table")
    shot(page, "06-no-signal")


@pytest.fixture
def hostile_run(run):
    from webapp.rollouts.ingest import ingest_groups

    payload = " ".join(XSS_BITS)
    transcript = [
        {"role": "system", "content": payload},
        {"role": "user", "content": payload},
        {
            "role": "assistant",
            "content": payload,
            "tool_calls": [
                {"id": payload[:40], "function": {"name": payload, "arguments": payload}}
            ],
        },
        {"role": "tool", "name": payload, "content": payload},
        {"role": "assistant", "content": payload},
    ]
    g = {
        "step": 0,
        "key": payload[:200],
        "prompt": payload,
        "rollouts": [
            {
                "index": 0,
                "transcript": transcript,
                "parse_error": payload,
                "rewards": {"correct": {"value": 1, "reason": payload}},
                "state": {"svg": payload},
            },
            {
                "index": 1,
                "completion": payload + " different",
                "rewards": {"correct": {"value": 0, "reason": payload}},
            },
        ],
    }
    ingest_groups(run, {"groups": [g]})
    return run


def test_it_runs_no_script_from_hostile_transcripts(page, live_server, hostile_run, shot):
    from webapp.rollouts.models import Rollout

    r = Rollout.objects.get(run=hostile_run, index=0)
    login(page, live_server, "viewer", PASSWORD)
    urls = {
        "07-xss-transcript": f"/rollouts/{r.id}/",
        "xss-group": f"/groups/{r.group_id}/",
        "xss-explorer": f"/runs/{hostile_run.id}/rollouts/",
        "xss-no-signal": f"/runs/{hostile_run.id}/no-signal/",
        "xss-dashboard": f"/runs/{hostile_run.id}/",
    }
    for name, url in urls.items():
        page.goto(live_server.url + url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(
            200
        )  # let any injected onerror/onload fire, if one had slipped through
        assert page.evaluate("typeof window.__pwned") == "undefined", url
        assert page.locator('a[href^="javascript:"], iframe, img[src="x"]').count() == 0, url
        if name.startswith("07"):
            assert "window.__pwned = 1" in page.inner_text(".transcript")  # shown as text, verbatim
            shot(page, name)
    page.goto(live_server.url + urls["07-xss-transcript"])
    # clicking where the hostile link's text is must not navigate or run anything
    page.get_by_text("click me").first.click()
    page.wait_for_timeout(200)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.dialogs == []


def test_it_draws_held_out_evals_side_by_side_and_runs_no_script_from_run_names(
    page, live_server, env3, personas, shot
):
    from tests.conftest import make_group
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run

    ids = []
    for i, name in enumerate(["eval before", XSS_BITS[1] + " eval after"]):
        run = create_run(
            name=name, kind="eval", environment=env3, config={}, base_model=XSS_BITS[0]
        )
        rollouts = [{"correct": float(j < i + 1), "format": 1.0} for j in range(4)]
        ingest_groups(run, {"groups": [{**make_group(i * 10, "p", rollouts), "split": "holdout"}]})
        ids.append(run.id)
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/compare/?run={ids[0]}&run={ids[1]}")
    page.wait_for_selector("#eval-chart .main-svg")
    cells = page.eval_on_selector_all(
        "#eval-summary tbody tr", "rs => rs.map(r => r.cells[5].textContent)"
    )
    assert cells == ["0.250", "0.500"]  # correct: 1 of 4, then 2 of 4
    assert page.locator("#eval-chart g.trace.bars").count() == 2
    page.wait_for_timeout(200)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert (
        page.locator('img[src="x"]').count() == 0 and page.dialogs == [] and page.page_errors == []
    )
    assert "window.__pwned = 1" in page.inner_text("#eval-summary")  # the model name, shown as text
    shot(page, "08-compare-evals")

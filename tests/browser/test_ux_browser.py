"""Issue 19 in a real Chromium: exports that never pair a text with itself, a GRPO launch whose
reward weights end up on the run, a live chart that gains points without a reload, cancel that reads
right, a review queue made from an explorer view, and no console error on any page opened
(screenshots in test-artifacts/)."""

from __future__ import annotations

import contextlib
import json
import re
import time

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from tests.browser.conftest import login
from tests.browser.test_pages_browser import diagram_run, scroll_through  # noqa: F401 - fixture
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _steps(run, first: int, last: int) -> list[dict]:
    """Groups of the diagram environment for steps first..last (the same generator
    as the fixture's)."""
    from training.demo import generate_groups, linear_schedule
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy

    groups = generate_groups(
        get_environment("diagram"),
        ScriptedDiagramPolicy(0, 0.2),
        steps=last + 1,
        groups_per_step=2,
        G=4,
        seed=11,
        skill_schedule=linear_schedule(0.1, 0.9, last + 1),
    )
    return [g for g in groups if first <= g["step"] <= last]


def _sft_run(personas, **fields):
    from training.environments import get_environment
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import Run

    env = environment_from_training(get_environment("diagram"))
    run = create_run(
        name=fields.pop("name", "sft on fixes"),
        kind=fields.pop("kind", "sft"),
        environment=env,
        config={"max_steps": 100},
        owner=personas["trainer"],
        base_model="tiny:diagram",
        status="running",
    )
    Run.objects.filter(id=run.id).update(**fields)
    run.refresh_from_db()
    return run


def test_it_exports_dpo_pairs_whose_chosen_never_equals_rejected(
    page, live_server, diagram_run, personas, shot
):  # noqa: F811
    from webapp.annotations.models import Label
    from webapp.annotations.services import save_annotation
    from webapp.annotations.taxonomy import ensure_default_labels
    from webapp.rollouts.models import Rollout

    ensure_default_labels()
    hack = Label.objects.get(slug="reward-hacking")
    # In every group of step 7: the worst rollout is a bad case and the best one is a copy of
    # its text (a duplicate sample), so the naive "best unflagged sibling" would pair the
    # text with itself.
    for group_id in (
        Rollout.objects.filter(run=diagram_run, step=7)
        .values_list("group_id", flat=True)
        .distinct()
    ):
        rs = list(Rollout.objects.filter(group_id=group_id).order_by("reward", "id"))
        bad, best = rs[0], rs[-1]
        Rollout.objects.filter(id=best.id).update(
            transcript=bad.transcript, completion=bad.completion, reward=(bad.reward or 0) + 5
        )
        save_annotation(bad, personas["annotator"], label=hack, note="keyword\r\nstuffing")
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/annotations/datasets/")
    page.click("text=Export a new dataset")
    page.fill('#ann-export-form input[name="name"]', "step7-hacks")
    page.select_option('#ann-export-form select[name="kind"]', "dpo")
    page.select_option('#ann-export-form select[name="source"]', "label")
    page.select_option('#ann-export-form select[name="label"]', "reward-hacking")
    page.select_option('#ann-export-form select[name="run"]', str(diagram_run.id))
    page.fill('#ann-export-form input[name="min_margin"]', "0.05")
    page.click('#ann-export-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/annotations/datasets/\d+/$"))
    assert "differs in text" in page.inner_text(".ann-kv")  # the page says how chosen was picked
    shot(page, "ux-dataset")
    body = page.request.get(page.url + "download.jsonl").text()
    records = [json.loads(line) for line in body.splitlines()]
    assert records, "the export holds the step-7 pairs"
    assert all(r["chosen"] != r["rejected"] for r in records)
    assert all(
        isinstance(r["prompt"], list) and r["prompt"][0]["role"] == "user" for r in records
    )  # chat format
    assert "\r" not in body and all(r["note"] == "keyword\nstuffing" for r in records)
    assert page.console_errors == [] and page.page_errors == []


def test_it_launches_grpo_with_reward_weights_that_the_run_stores(
    page, live_server, personas, shot, monkeypatch
):
    from training.environments import get_environment
    from webapp.runs import launch
    from webapp.runs.models import Run

    monkeypatch.setattr(
        launch, "enqueue_run", lambda run_id: "gpu"
    )  # no worker in this test: the run stays queued
    names = [c.name for c in get_environment("diagram").components]
    weights = {n: round(0.5 + 0.25 * i, 2) for i, n in enumerate(names)}
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/launch/grpo/")
    assert page.locator("fieldset legend").all_inner_texts() == [
        "Model",
        "Data",
        "Optimisation",
        "Algorithm",
        "Reward weights",
        "LoRA",
        "Recording",
    ]
    assert not page.locator('input[name="cfg_epsilon"]').is_visible()  # advanced: folded
    other = [c.name for c in get_environment("ask_to_code").components]
    page.select_option('select[name="environment"]', "ask_to_code")  # its own components' weights
    page.wait_for_url(re.compile(r".*environment=ask_to_code.*"))
    assert (
        page.eval_on_selector_all('[name^="weight_"]', "es => es.map(e => e.name.slice(7))")
        == other
    )
    page.select_option('select[name="environment"]', "diagram")
    page.wait_for_url(re.compile(r".*environment=diagram.*"))
    page.fill('input[name="name"]', "weighted grpo")
    for n, w in weights.items():
        page.fill(f'input[name="weight_{n}"]', str(w))
    page.fill('input[name="cfg_max_steps"]', "7")
    summary = page.inner_text("#launch-summary")
    assert "weighted grpo" in summary and "steps\n7" in summary.replace("\t", "\n")
    assert ", ".join(f"{n} {w}" for n, w in weights.items()) in summary
    shot(page, "ux-launch-grpo")
    page.check('input[name="launch_anyway"]')  # the untrained tiny model, on purpose
    page.click('button[type="submit"].primary')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    run = Run.objects.get(name="weighted grpo")
    assert run.reward_weights() == weights and run.config["max_steps"] == 7
    assert "Queued on" in page.inner_text("#queue-note") and "gpu" in page.inner_text("#queue-note")
    shot(page, "ux-job-queued")
    assert page.console_errors == [] and page.page_errors == []


def test_it_extends_a_running_runs_charts_without_a_reload(page, live_server, diagram_run, shot):  # noqa: F811
    from webapp.rollouts.ingest import ingest_groups
    from webapp.runs.models import StepMetric

    polls = []  # (query, answer) of every live.json poll

    def on_response(r):
        if "/live.json" in r.url:
            # the page may leave before the body is read (the test moved on): that poll is not kept
            with contextlib.suppress(PlaywrightError):
                polls.append((r.url.split("?", 1)[-1], r.json()))

    page.on("response", on_response)
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    page.evaluate("""() => {
        window.__same_page = 1; window.__extended = [];
        const extend = Plotly.extendTraces;
        Plotly.extendTraces = function (gd) {
            window.__extended.push(gd.getAttribute('data-chart'));
            return extend.apply(this, arguments);
        };
    }""")
    count = "document.querySelector('[data-chart=\"%s\"]').data[%d].x.length"
    before = page.evaluate(count % ("reward", 2))
    assert before == 8
    # The trainer stores two more steps while the page is open: rollouts and a logged metric.
    ingest_groups(diagram_run, {"groups": _steps(diagram_run, 8, 9)})
    StepMetric.objects.bulk_create(
        [StepMetric(run=diagram_run, step=s, name="kl", value=0.002 * s) for s in (8, 9)]
    )
    page.wait_for_function((count % ("reward", 2)) + " === 10", timeout=20_000)
    xs = "document.querySelector('[data-chart=\"reward\"]').data[2].x"
    assert page.evaluate(xs) == list(range(10))  # step 7 was sent again and replaced, not doubled
    # Only the new points travelled: the page named its last step and got steps 7-9,
    # no whole figure.
    query, answer = next((q, a) for q, a in polls if a["points"])
    assert "since=7" in query and answer["figures"] is None
    assert answer["points"]["reward"]["x"][2] == [7, 8, 9]
    assert answer["points"]["metric:kl"]["x"] == [[7, 8, 9]]
    assert "reward" in page.evaluate("window.__extended")  # drawn charts grew in place
    scroll_through(
        page
    )  # the kl chart was below the fold, not drawn: it is drawn whole, with the new steps
    page.wait_for_function((count % ("metric:kl", 0)) + " === 10", timeout=20_000)
    assert page.evaluate("window.__same_page") == 1  # no reload happened
    shot(page, "ux-dashboard-live")
    # The runs list follows the run's progress without a reload too.
    page.goto(live_server.url + "/")
    diagram_run.set_progress(30, 120)
    expect(page.locator("#runs-table .run-step")).to_have_text("step 30/120 · 25%", timeout=20_000)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    # The run ends: the page stops asking.
    diagram_run.mark_succeeded()
    page.wait_for_function(
        "!document.querySelector('[data-figures]').hasAttribute('data-live')", timeout=20_000
    )
    assert page.console_errors == [] and page.page_errors == []


def test_it_reads_cancelling_then_cancelled_and_offers_no_checkpoint_actions(
    page, live_server, personas, shot
):
    run = _sft_run(
        personas,
        log_tail="step 12 loss 0.41\nstep 13 loss 0.40\n",
        current_step=13,
        total_steps=100,
        progress=0.13,
    )
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/{run.id}/")
    expect(page.locator("#grpo-from")).to_be_visible()  # pending: GRPO may queue behind a live SFT
    page.click("#cancel-form button")
    page.wait_for_url(f"{live_server.url}/jobs/{run.id}/")
    expect(page.locator("#progress .status")).to_have_text("cancelling")
    assert page.locator("#cancel-form").count() == 0 and page.locator("#grpo-from").count() == 0
    shot(page, "ux-job-cancelling")
    run.mark_cancelled()  # the worker stopped the child
    expect(page.locator("#progress .status")).to_have_text("cancelled", timeout=15_000)
    expect(page.locator("#run-actions")).to_contain_text("no checkpoint", timeout=15_000)
    assert page.locator("#eval-checkpoint").count() == 0 and page.locator("#grpo-from").count() == 0
    style = page.eval_on_selector(".log-tail", "e => getComputedStyle(e).textDecorationLine")
    assert style == "none" and "step 13 loss 0.40" in page.inner_text(".log-tail")
    shot(page, "ux-job-cancelled")
    assert page.console_errors == [] and page.page_errors == []


def test_it_makes_a_review_queue_from_an_explorer_view(page, live_server, diagram_run, shot):  # noqa: F811
    from webapp.annotations.models import ReviewQueue
    from webapp.rollouts.models import RewardComponent

    component = (
        RewardComponent.objects.filter(environment=diagram_run.environment)
        .order_by("position")
        .first()
    )
    login(page, live_server, "trainer", PASSWORD)
    page.goto(
        f"{live_server.url}/runs/{diagram_run.id}/rollouts/?sort={component.name}&order=asc&step_min=2"
    )
    page.wait_for_selector("#rollout-table")
    view = [
        int(x)
        for x in page.eval_on_selector_all(
            "#rollout-table tbody tr[data-id]", "rs => rs.map(r => r.dataset.id)"
        )
    ]
    assert page.locator("#rollout-table .bar-num").count() > 0  # numbers beside the bars
    shot(page, "ux-explorer")
    page.click("#queue-from-view")
    page.wait_for_url(re.compile(r".*/annotations/queues/new/.*"))
    page.fill('input[name="limit"]', "6")
    shot(page, "ux-queue-new")
    page.click('button[type="submit"]')
    page.wait_for_url(re.compile(r".*/annotations/queues/\d+/$"))
    queue = ReviewQueue.objects.latest("id")
    assert queue.params["sort"] == component.name and queue.params["step_min"] == "2"
    assert list(queue.items.order_by("position").values_list("rollout_id", flat=True)) == view[:6]
    assert page.console_errors == [] and page.page_errors == []


def test_it_opens_every_page_without_a_console_error(
    page, live_server, diagram_run, personas, shot
):  # noqa: F811
    from webapp.annotations.models import Label
    from webapp.annotations.services import create_queue
    from webapp.annotations.taxonomy import ensure_default_labels
    from webapp.rollouts.models import Rollout

    ensure_default_labels()
    rollout = Rollout.objects.filter(run=diagram_run).order_by("id").first()
    queue = create_queue(
        name="all pages",
        run=diagram_run,
        source="explorer",
        params={"sort": "reward"},
        limit=3,
        seed=None,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[personas["admin"]],
    )
    sft = _sft_run(
        personas,
        status="succeeded",
        current_step=100,
        total_steps=100,
        progress=1.0,
        summary={"train_loss": 0.3, "train_runtime": 12.5},
    )
    twin = _twin(diagram_run, personas)
    ablation = _ablation(diagram_run, personas)
    label = Label.objects.order_by("id").first()
    base = live_server.url
    pages = {
        "runs": "/",
        "dashboard": f"/runs/{diagram_run.id}/",
        "sft-dashboard": f"/runs/{sft.id}/",
        "explorer": f"/runs/{diagram_run.id}/rollouts/",
        "no-signal": f"/runs/{diagram_run.id}/no-signal/",
        "group": f"/groups/{rollout.group_id}/",
        "transcript": f"/rollouts/{rollout.id}/",
        "job": f"/jobs/{sft.id}/",
        "compare": f"/jobs/compare/?run={diagram_run.id}&run={sft.id}",
        "annotate": "/annotations/",
        "queue": f"/annotations/queues/{queue.id}/",
        "focus": f"/annotations/queues/{queue.id}/focus/0/",
        "labels": "/annotations/labels/",
        "datasets": "/annotations/datasets/",
        "diagnostics": f"/diagnostics/runs/{diagram_run.id}/",
        "ablations": f"/diagnostics/runs/{diagram_run.id}/ablations/",
        "overlay": f"/diagnostics/runs/{diagram_run.id}/overlay/{twin.id}/",
        "ablation": f"/diagnostics/ablations/{ablation.id}/",
        "ablation-preview": (
            f"/diagnostics/runs/{diagram_run.id}/ablations/?{ablation_query(ablation)}"
        ),
        "replays": f"/replays/runs/{diagram_run.id}/",
        "annotate-rollout": f"/annotations/rollout/{rollout.id}/",
        "new-label": "/annotations/labels/new/",
        "edit-label": f"/annotations/labels/{label.id}/edit/",
        "activity": "/annotations/activity/",
        "agreement": f"/annotations/queues/{queue.id}/agreement/",
        "new-queue": "/annotations/queues/new/",
        **{
            f"launch-{k}": f"/jobs/launch/{k}/"
            for k in ("teacher", "sft", "grpo", "dpo", "eval", "probe")
        },
    }
    page.goto(
        base + "/accounts/login/"
    )  # the login page too: no favicon 404 before anyone signs in
    page.wait_for_load_state("networkidle")
    login(page, live_server, "admin", PASSWORD)
    for name, path in pages.items():
        resp = page.goto(base + path)
        assert resp.status == 200, f"{name}: {resp.status}"
        page.wait_for_load_state("networkidle")
        # Charts below the fold are drawn as they come near: a reader scrolling down
        # finds each drawn.
        scroll_through(page)
        page.wait_for_function(
            "[...document.querySelectorAll('[data-chart]')].every(e => "
            "e.querySelector('.main-svg'))"
        )
        shot(page, f"ux-page-{name}")
    assert page.console_errors == [], page.console_errors
    assert page.page_errors == [] and page.dialogs == []
    # a viewer sees no launch link, and the page they may not use says which role it needs
    page.context.clear_cookies()
    login(page, live_server, "viewer", PASSWORD)
    assert page.locator('a[href*="/jobs/launch/"]').count() == 0
    page.goto(f"{base}/jobs/{sft.id}/")
    assert page.locator("#grpo-from, #eval-checkpoint, #cancel-form").count() == 0
    resp = page.goto(f"{base}/jobs/launch/grpo/")
    assert resp.status == 403
    expect(page.locator(".forbidden")).to_contain_text("This action needs the trainer role.")
    shot(page, "ux-403")


def _twin(run, personas):
    """An ablation twin of `run` with other weights, its rollouts stored, no trainer metrics."""
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run

    weights = {c.name: 2.0 for c in run.components()}
    twin = create_run(
        name=f"{run.name} / ablation: doubled",
        kind="grpo",
        environment=run.environment,
        config={"ablation_of": run.id, "reward_weights": weights},
        owner=personas["trainer"],
        parent=run,
        status="succeeded",
    )
    ingest_groups(twin, {"groups": _steps(run, 0, 7)})
    return twin


def _ablation(run, personas):
    """A saved ablation of `run` (its first component dropped), as the ablations form saves one."""
    from training import ablation as abl
    from webapp.diagnostics import services
    from webapp.diagnostics.models import Ablation

    first = run.components()[0].name
    spec = abl.AblationSpec(
        drop=(first,), weights={}, scale_rewards="group", aggregation="sum_then_normalize"
    )
    return Ablation.objects.create(
        run=run,
        name=f"drop {first}",
        spec=spec.as_dict(),
        results=services.run_ablation(run, spec),
        created_by=personas["trainer"],
    )


def ablation_query(ablation) -> str:
    spec = ablation.spec
    return f"drop={spec['drop'][0]}&scale_rewards=group&aggregation=sum_then_normalize"


def test_it_overlays_a_twin_with_a_legend_clear_of_the_axis(
    page, live_server, diagram_run, personas, shot
):  # noqa: F811
    from webapp.runs.models import StepMetric

    twin = _twin(diagram_run, personas)
    StepMetric.objects.bulk_create(  # the original's trainer logged its reward; the twin's did not
        [StepMetric(run=diagram_run, step=s, name="reward", value=0.1 * s) for s in range(8)]
    )
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/diagnostics/runs/{diagram_run.id}/overlay/{twin.id}/")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    legend = page.eval_on_selector_all(
        '[data-chart="reward"] .legendtext', "es => es.map(e => e.textContent)"
    )
    assert [t for t in legend if t.endswith("(trainer log)")] == [
        f"original: {diagram_run.name} (trainer log)"
    ]
    assert "sum their rewards with different weights" in page.inner_text("body")
    scroll_through(page)
    for chart in page.locator("[data-chart]").all():
        chart.locator(".main-svg").first.wait_for()
    shot(page, "ux-overlay")
    # Measured in one script once every chart has laid out its title and legend: Plotly redraws a
    # chart in several ticks (the legend placement relayouts it), and an element read between them
    # has no box (seen once in three runs).
    boxes = page.wait_for_function(
        """() => {
            const box = e => e && e.getBoundingClientRect();
            const out = [...document.querySelectorAll('[data-chart]')].map(c => ({
                title: box(c.querySelector('.g-xtitle')),
                legend: box(c.querySelector('.legend')),
                ticks: [...c.querySelectorAll('.xtick')].map(box),
            }));
            const ready = out.every(o => o.title && o.title.height > 0 && o.legend
                && o.legend.height > 0 && o.ticks.length);
            return ready && JSON.stringify(out);
        }"""
    ).json_value()
    for chart in json.loads(boxes):
        title, legend, ticks = chart["title"], chart["legend"], chart["ticks"]
        # text boxes include a few px of line height: overlapping glyphs would be ~10 px
        assert title["y"] >= max(t["y"] + t["height"] for t in ticks) - 4, "title on the ticks"
        assert legend["y"] >= title["y"] + title["height"] - 4, "the legend overlaps the step title"
    assert page.console_errors == [] and page.page_errors == []


@pytest.fixture
def bench_shaped_run(personas):
    """The 1M-rollout bench run's dashboard, at 1 group per step: the same 500 steps and 4
    components (the page reads per-step StepStat rows, so its size does not depend on the rollouts
    per step) and the dozen metrics TRL logs per step."""
    import numpy as np

    from bench.pages import COMPONENTS, STEPS, synthetic_step
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, ensure_environment
    from webapp.runs.models import StepMetric

    env = ensure_environment("bench-pages", COMPONENTS)
    run = create_run(
        name="bench-shaped",
        kind="grpo",
        environment=env,
        config={},
        owner=personas["trainer"],
        status="succeeded",
    )
    rng = np.random.default_rng(0)
    for first in range(0, STEPS, 100):
        ingest_groups(
            run,
            {"groups": [g for s in range(first, first + 100) for g in synthetic_step(s, 1, rng)]},
        )
    names = [
        "loss",
        "kl",
        "entropy",
        "grad_norm",
        "learning_rate",
        "completion_length",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "frac_reward_zero_std",
        "num_tokens",
        "epoch",
        "reward",
    ]
    StepMetric.objects.bulk_create(
        [
            StepMetric(run=run, step=s, name=n, value=float(rng.random()))
            for s in range(STEPS)
            for n in names
        ],
        batch_size=2000,
    )
    return run


def _best_of(page, url: str, until: str, n: int = 3) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_function(until)
        times.append(time.perf_counter() - start)
    return min(times)


def test_it_prints_how_long_the_dashboard_takes_to_be_usable(page, live_server, bench_shaped_run):
    """Timing printed, not asserted (a shared machine's load decides it): navigation start to the
    moment every chart in view is drawn, on a page shaped like the 1M-rollout bench run's. Baselines
    measured in the same run: the runs list, and the same dashboard in a window tall enough to show
    every chart (what drawing all figures up front costs, as the page did before charts below the
    fold were lazy)."""
    import os

    login(page, live_server, "viewer", PASSWORD)
    url = f"{live_server.url}/runs/{bench_shaped_run.id}/"
    page.goto(url)  # warm: static files cached as a returning user has them
    in_view = """() => [...document.querySelectorAll('[data-chart]')]
        .filter(e => e.getBoundingClientRect().top < innerHeight)
        .every(e => e.querySelector('.main-svg'))"""
    first = _best_of(
        page, url, "() => !!document.querySelector('[data-chart=\"reward\"] .main-svg')"
    )
    lazy = _best_of(page, url, in_view)
    drawn = page.evaluate("document.querySelectorAll('[data-chart][data-drawn]').length")
    total = page.evaluate("document.querySelectorAll('[data-chart]').length")
    size = page.evaluate("performance.getEntriesByType('navigation')[0].decodedBodySize")
    runs_list = _best_of(
        page, live_server.url + "/", "() => !!document.querySelector('table.runs')"
    )
    page.set_viewport_size({"width": 1440, "height": 8000})
    eager = _best_of(page, url, in_view)
    print(
        f"\ndashboard (500 steps, 4 components, 12 metrics, {size / 1024:.0f} KB): first chart "
        f"{first:.2f} s; every chart in view {lazy:.2f} s with "
        f"{drawn}/{total} charts drawn up front; all {total} drawn up front {eager:.2f} s "
        f"(ratio {lazy / eager:.2f}); runs list {runs_list:.2f} s (ratio {lazy / runs_list:.2f}); "
        f"best of 3 each; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    assert page.console_errors == [] and page.page_errors == []

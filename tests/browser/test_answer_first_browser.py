"""Issue 29 in a real Chromium: pages that tell the answer first. The dashboard's verdict, findings
and components above its charts (one y axis on the reward chart, the log folded); one diagnostics
window on both pages with onsets that are not the window's edge; an eval run as a results table and
its chain on the runs list; a teacher run's kept and dropped trajectories; a live header that
follows the run; a GRPO launch that starts from the latest SFT output and will not queue from the
untrained base unasked. Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

import re

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import login
from tests.browser.test_pages_browser import diagram_run  # noqa: F401 - fixture
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _top(page, selector: str) -> float:
    return page.eval_on_selector(selector, "e => e.getBoundingClientRect().top + window.scrollY")


# ------------------------------------------------------------------------------ 8: verdict first


def test_it_puts_verdict_findings_and_components_above_the_charts(
    page, live_server, diagram_run, shot
):  # noqa: F811
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    diag, table = (
        _top(page, "#diagnostics .diag-status, #diagnostics h2"),
        _top(page, "#slot-health"),
    )
    charts = _top(page, '[data-chart="reward"]')
    assert diag < table < charts  # verdict, then the component table, then the charts
    assert _top(page, "#diagnostics .findings") < charts
    assert _top(page, "#charts-heading") < charts
    # The raw log is folded: its text is not on screen until asked for.
    assert page.eval_on_selector("details.run-log", "d => d.open") is False
    assert not page.locator(".job-progress .log-tail").is_visible()
    # One y axis on the aggregate reward chart: the batch std is the band around the mean.
    axes = page.evaluate(
        "Object.keys(document.querySelector('[data-chart=reward]')._fullLayout)"
        ".filter(k => /^yaxis\\d*$/.test(k))"
    )
    assert axes == ["yaxis"]
    names = page.evaluate("document.querySelector('[data-chart=reward]').data.map(t => t.name)")
    assert names == ["mean + std", "± 1 batch std", "reward mean"]
    lows = page.evaluate("document.querySelector('[data-chart=reward]').data[1].y")
    means = page.evaluate("document.querySelector('[data-chart=reward]').data[2].y")
    assert all(lo <= m for lo, m in zip(lows, means, strict=True))  # a band under the mean
    shot(page, "29-dashboard-verdict-first", full_page=False)
    assert page.console_errors == [] and page.page_errors == []


# ------------------------------------------------------------------------- 4: one window, onsets


@pytest.fixture
def saturated_run(personas):
    """60 steps of diagram groups in which schema_valid is 1.0 in every rollout from step 0, while
    the outcome keeps varying: a saturation that starts at step 0, before any window of 50 steps."""
    from training.demo import generate_groups, linear_schedule
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training

    env = get_environment("diagram")
    run = create_run(
        name="saturated-from-0",
        kind="grpo",
        environment=environment_from_training(env),
        config={"num_generations": 4},
        base_model="tiny-llama",
        owner=personas["trainer"],
        status="succeeded",
    )
    steps = 60
    groups = generate_groups(
        env,
        ScriptedDiagramPolicy(0, 0.3),
        steps=steps,
        groups_per_step=3,
        G=4,
        seed=5,
        skill_schedule=linear_schedule(0.2, 0.6, steps),
    )
    for g in groups:
        for r in g["rollouts"]:
            r["rewards"]["schema_valid"] = {"value": 1.0, "reason": "always valid"}
    ingest_groups(run, {"groups": groups})
    return run


def _finding(page, component: str) -> dict:
    """The onset text and data of the finding that names `component` in its title."""
    return page.evaluate(
        """c => { const f = [...document.querySelectorAll('li.finding')]
            .find(li => li.querySelector('strong').textContent.includes("'" + c + "'"));
          const o = f && f.querySelector('.onset');
          return f ? {code: f.dataset.code, onset: o && o.dataset.onset, text: o && o.textContent,
                      title: f.querySelector('strong').textContent} : null; }""",
        component,
    )


def test_it_dates_an_onset_before_the_window_the_same_on_both_pages(
    page, live_server, saturated_run, shot
):
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{saturated_run.id}/")
    slot = _finding(page, "schema_valid")
    slot_window = page.inner_text("#diag-window")
    slot_share = page.inner_text('#slot-health tr[data-component="schema_valid"] td.share').strip()
    shot(page, "29-dashboard-onset", full_page=False)
    page.goto(f"{live_server.url}/diagnostics/runs/{saturated_run.id}/")
    full = _finding(page, "schema_valid")
    page_window = page.inner_text("#diag-window")
    table_share = page.inner_text('#health tr[data-component="schema_valid"] td:nth-child(7)')
    shot(page, "29-diagnostics-onset")
    # The window: the last 50 steps (10-59) on both pages, labelled.
    assert "steps 10–59" in slot_window and "steps 10–59" in page_window
    assert "Component health, steps 10–59" in page.inner_text("h2:has-text('Component health')")
    # The onset is where the condition starts (step 0), not the window's first step (10).
    assert slot is not None and full is not None, (slot, full)
    assert slot["onset"] == full["onset"] == "0" and slot["code"] == full["code"]
    assert slot["text"] == full["text"] == "holds since step 0"
    assert "from step 0" in full["title"]
    # The share of the advantage reads the same in the slot and the health table (one window).
    assert slot_share == table_share.strip()
    assert page.console_errors == [] and page.page_errors == []


# ------------------------------------------------------------------- 7: eval and teacher results


def _eval_groups(env, prompts, answers, step=0):
    from training.common import Sample
    from training.eval import score_groups

    samples = [[Sample(a, len(a.split()), False) for a in group] for group in answers]
    groups, _ = score_groups(env, prompts, samples, step=step, split="holdout")
    return groups


@pytest.fixture
def demo_chain(personas, tmp_path):
    """The demo's chain as the worker leaves it: a scripted teacher that forgets connections (its
    groups and result from training.teacher), SFT, an eval before SFT of the untrained model, evals
    after SFT and after GRPO (groups and checks from training.eval), GRPO with training groups."""
    from training.demo import generate_groups
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy
    from training.eval import eval_checks
    from training.sinks import MemorySink
    from training.teacher import TeacherJobConfig
    from training.teacher import main as teacher_main
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training

    env = get_environment("diagram")
    db_env = environment_from_training(env)
    owner = personas["trainer"]

    def run(name, kind, parent=None, base="tiny:diagram", summary=None):
        r = create_run(
            name=f"demo · {name}",
            kind=kind,
            environment=db_env,
            config={"demo_chain": True},
            owner=owner,
            base_model=base,
            parent=parent,
            status="succeeded",
        )
        r.summary = summary or {}
        r.save()
        return r

    sink = MemorySink()
    config = TeacherJobConfig(
        output_dir=str(tmp_path / "teacher"),
        num_prompts=16,
        scripted_faults={"omit_edges": 0.5},
        min_scores={"json_valid": 1.0, "schema_valid": 1.0},
        min_reward=0.8,
    )
    teacher = run("teacher", "teacher", summary=teacher_main(config, sink=sink))
    teacher.config.update(min_reward=0.8, min_scores=config.min_scores)
    teacher.save()
    ingest_groups(teacher, {"groups": sink.groups})
    prompts = [p for p in env.prompts("holdout", 12, seed=0) if p.spec.get("edges")][:10]
    full = [env.solve(p) for p in prompts]
    bare = ["\n".join(x for x in a.splitlines() if '"from"' not in x) for a in full]
    plans = {  # per prompt, 4 answers: "f" full, "b" without connections, "x" not JSON
        "before": ["xxxx"] * 10,
        "after_sft": [
            "fbbb",
            "ffbb",
            "fbbb",
            "ffbb",
            "fbbb",
            "ffbb",
            "ffbb",
            "fffb",
            "ffbb",
            "fbbb",
        ],
        "after_grpo": ["ffff"] * 9 + ["fffb"],
    }
    pick = {"f": lambda i: full[i], "b": lambda i: bare[i], "x": lambda i: "I cannot draw that"}

    def evaluate(name, parent, base):
        answers = [[pick[c](i) for c in plan] for i, plan in enumerate(plans[name])]
        groups = _eval_groups(env, prompts, answers)
        checks = eval_checks(env, prompts, groups)
        r = run(f"eval {name.replace('_', ' ')}", "eval", parent, base, {"checks": checks})
        ingest_groups(r, {"groups": groups})
        return r

    before = evaluate("before", None, "tiny:diagram")
    sft = run("sft", "sft", parent=teacher)
    after_sft = evaluate("after_sft", sft, f"run:{sft.id}")
    grpo = run("grpo", "grpo", parent=sft, base=f"run:{sft.id}")
    ingest_groups(
        grpo,
        {"groups": generate_groups(env, ScriptedDiagramPolicy(0, 0.8), 3, 2, G=4, seed=1)},
    )
    after_grpo = evaluate("after_grpo", grpo, f"run:{grpo.id}")
    return {
        "teacher": teacher,
        "before": before,
        "sft": sft,
        "after_sft": after_sft,
        "grpo": grpo,
        "after_grpo": after_grpo,
    }


def _held_out(run) -> tuple[float, float, dict[str, float]]:
    from webapp.rollouts.models import RewardScore, Rollout

    rewards = np.array(list(Rollout.objects.filter(run=run).values_list("reward", flat=True)))
    json_ok = list(
        RewardScore.objects.filter(run=run, component__name="json_valid").values_list(
            "value", flat=True
        )
    )
    return rewards.mean(), rewards.std(ddof=1), {"json_valid": np.mean(np.array(json_ok) == 1.0)}


def _cell(page, row: str, n: int) -> str:
    return page.inner_text(f'#eval-table tr[data-row="{row}"] td:nth-child({n})').strip()


def test_it_shows_an_eval_run_as_a_results_table_within_its_chain(
    page, live_server, demo_chain, shot
):
    chain = demo_chain
    after, previous = chain["after_grpo"], chain["after_sft"]
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{after.id}/")
    page.wait_for_selector("#eval-table")
    mean, std, passes = _held_out(after)
    prev_mean, _, prev_passes = _held_out(previous)
    assert _cell(page, "reward", 3) == f"{mean:.3f}" and _cell(page, "reward", 4) == f"{std:.3f}"
    assert _cell(page, "json_valid", 5) == f"{100 * passes['json_valid']:.1f}%"
    assert _cell(page, "reward", 7) == f"{mean - prev_mean:+.3f}".replace("-", "−")
    grpo_last = _training_last_step_mean(chain["grpo"])
    assert _cell(page, "reward", 6) == f"{mean - grpo_last:+.3f}".replace("-", "−")
    # The demo's check, before -> after, and the chain's story.
    shares = [
        f"{100 * chain[k].summary['checks']['answers without connections']['share']:.0f}%"
        for k in ("before", "after_sft", "after_grpo")
    ]
    assert shares == ["100%", "57%", "2%"]  # 40, 23 and 1 of 40 answers draw no connection
    check = page.inner_text('#eval-table tr[data-check="answers without connections"]')
    assert "1 of 40" in check and "57% → 2%" in check
    story = page.inner_text("#chain-story")
    assert (
        "Chain: teacher → eval before SFT → sft → eval after SFT → grpo → eval after GRPO" in story
    )
    assert "answers without connections 100% → 57% → 2%" in story
    # The worst held-out rollouts, linked; no chart of one dot per step.
    worst = page.eval_on_selector_all("#worst-rollouts a", "as => as.map(a => a.textContent)")
    assert len(worst) == 5
    assert (
        page.locator("[data-chart]").count() == 0 and page.locator("#no-step-charts").is_visible()
    )
    assert _top(page, "#eval-table") < _top(page, "#diagnostics")
    shot(page, "29-eval-results")
    page.click("#worst-rollouts a >> nth=0")
    page.wait_for_url(re.compile(r".*/rollouts/\d+/$"))
    # The runs list: the chain together, its story on one line, each eval's headline figure.
    page.goto(live_server.url + "/")
    head = page.inner_text(f'tr.chain-head[data-chain="{chain["teacher"].id}"]')
    assert "answers without connections 100% → 57% → 2%" in head
    kinds = page.eval_on_selector_all(
        f'tr.in-chain[data-chain="{chain["teacher"].id}"] td:nth-child(2)',
        "cs => cs.map(c => c.textContent.trim())",
    )
    assert kinds == ["Teacher trajectories", "Eval", "SFT", "Eval", "GRPO", "Eval"]
    headline = page.inner_text(f'tr[data-run="{after.id}"] .headline')
    assert headline == f"held-out reward {mean:.3f} ({mean - prev_mean:+.3f})"
    shot(page, "29-runs-list-chain")
    assert page.console_errors == [] and page.page_errors == []


def _training_last_step_mean(run) -> float:
    from webapp.rollouts.models import Rollout

    last = Rollout.objects.filter(run=run).order_by("-step").values_list("step", flat=True)[0]
    return float(
        np.mean(list(Rollout.objects.filter(run=run, step=last).values_list("reward", flat=True)))
    )


def test_it_says_how_many_trajectories_a_teacher_kept_and_why_it_dropped_the_rest(
    page, live_server, demo_chain, shot
):
    teacher = demo_chain["teacher"]
    s = teacher.summary
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{teacher.id}/")
    kept = page.inner_text("#teacher-kept")
    assert f"Kept {s['kept']} of {s['kept'] + s['rejected']}" in kept and s["rejected"] > 0
    rows = page.eval_on_selector_all(
        "#teacher-dropped tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert rows == [[why, str(n)] for why, n in s["rejected_by"].items()]
    assert any(why.startswith("weighted score < 0.8") for why, _ in rows)
    assert page.locator("[data-chart]").count() == 0
    shot(page, "29-teacher-result")
    page.goto(live_server.url + "/")
    assert page.inner_text(f'tr[data-run="{teacher.id}"] .headline') == (
        f"kept {s['kept']} of {s['kept'] + s['rejected']}"
    )


# -------------------------------------------------------------------------- 9: live header


def test_it_follows_a_live_run_in_the_title_and_counts_until_it_ends(
    page,
    live_server,
    diagram_run,
    shot,  # noqa: F811
):
    from tests.browser.test_ux_browser import _steps
    from webapp.rollouts.ingest import ingest_groups

    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{diagram_run.id}/")
    page.wait_for_selector('[data-chart="reward"] .main-svg')
    page.evaluate("window.__same_page = 1")
    groups, rollouts = page.inner_text("#run-groups"), page.inner_text("#run-rollouts")
    assert page.inner_text("#run-status .status") == "running"
    ingest_groups(diagram_run, {"groups": _steps(diagram_run, 8, 9)})
    diagram_run.mark_succeeded()
    expect(page.locator("#run-status .status")).to_have_text("succeeded", timeout=20_000)
    from webapp.rollouts.models import Group, Rollout

    n_groups = Group.objects.filter(run=diagram_run).count()
    n_rollouts = Rollout.objects.filter(run=diagram_run).count()
    expect(page.locator("#run-groups")).to_have_text(str(n_groups))
    expect(page.locator("#run-rollouts")).to_have_text(str(n_rollouts))
    assert int(groups) < n_groups and int(rollouts) < n_rollouts
    assert "status-succeeded" in page.get_attribute("#run-status .status", "class")
    assert page.evaluate("window.__same_page") == 1  # no reload
    shot(page, "29-live-header-ended", full_page=False)
    assert page.console_errors == [] and page.page_errors == []


def test_it_rewrites_the_run_queued_note_once_the_run_started_and_ended(
    page, live_server, personas, monkeypatch, shot
):
    from webapp.runs import launch
    from webapp.runs.models import Run

    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")  # no worker: we move it
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/launch/eval/")
    page.fill('input[name="name"]', "queued note")
    page.click('button[type="submit"].primary')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    run = Run.objects.get(name="queued note")
    note = page.locator(".messages li")
    expect(note).to_have_text(f"Run {run.id} queued.")
    run.claim("worker-a")
    expect(note).to_have_text(f"Run {run.id} is running.", timeout=15_000)
    run.mark_succeeded()
    expect(note).to_have_text(f"Run {run.id} succeeded.", timeout=15_000)
    expect(page.locator("#progress .status")).to_have_text("succeeded")
    shot(page, "29-job-note-ended", full_page=False)


# ---------------------------------------------------------------- 11: launching into nothing


def test_it_starts_grpo_from_the_latest_sft_output_and_warns_before_an_untrained_base(
    page, live_server, personas, monkeypatch, shot
):
    from training.environments import get_environment
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs import launch
    from webapp.runs.models import Run

    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")
    login(page, live_server, "trainer", PASSWORD)
    # No SFT output yet: the untrained default says so before anything is queued.
    page.goto(f"{live_server.url}/jobs/launch/grpo/")
    assert page.input_value('input[name="base_model"]') == "tiny:diagram"
    warning = page.inner_text("#base-warning")
    assert "Untrained base: expect no signal, run the probe first." in warning
    probe = page.get_attribute("#run-probe", "href")
    assert probe == "/jobs/launch/probe/?environment=diagram&base_model=tiny%3Adiagram"
    shot(page, "29-launch-untrained")
    page.fill('input[name="name"]', "from nothing")
    page.click('button[type="submit"].primary')
    error = page.inner_text("tr.has-error .error")
    assert error.startswith("untrained base: expect no signal, run the probe first")
    assert not Run.objects.filter(name="from nothing").exists()
    page.check('input[name="launch_anyway"]')
    page.click('button[type="submit"].primary')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    assert Run.objects.get(name="from nothing").base_model == "tiny:diagram"
    # An SFT run succeeded on this environment: GRPO starts from its output.
    env = environment_from_training(get_environment("diagram"))
    old = create_run(name="sft old", kind="sft", environment=env, config={}, status="running")
    old.mark_succeeded()
    sft = create_run(name="sft new", kind="sft", environment=env, config={}, status="running")
    sft.mark_succeeded()
    page.goto(f"{live_server.url}/jobs/launch/grpo/")
    assert page.input_value('input[name="base_model"]') == f"run:{sft.id}"
    assert "sft new" in page.inner_text("#base-default")
    assert page.locator("#base-warning").count() == 0
    shot(page, "29-launch-from-sft")
    page.fill('input[name="name"]', "from sft")
    page.click('button[type="submit"].primary')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    assert Run.objects.get(name="from sft").base_model == f"run:{sft.id}"
    assert page.console_errors == [] and page.page_errors == []


def test_it_fills_a_live_evals_results_table_when_it_ends_without_a_reload(
    page, live_server, personas, shot
):
    from training.environments import get_environment
    from training.eval import eval_checks
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training

    env = get_environment("diagram")
    run = create_run(
        name="live eval",
        kind="eval",
        environment=environment_from_training(env),
        config={},
        owner=personas["trainer"],
        base_model="tiny:diagram",
        status="running",
    )
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{run.id}/")
    page.evaluate("window.__same_page = 1")
    assert page.locator("#eval-table").count() == 0 and page.inner_text("#run-rollouts") == "0"
    prompts = [p for p in env.prompts("holdout", 6, seed=1) if p.spec.get("edges")][:4]
    groups = _eval_groups(env, prompts, [[env.solve(p), "no"] for p in prompts])
    ingest_groups(run, {"groups": groups})
    run.summary = {"checks": eval_checks(env, prompts, groups)}
    run.save(update_fields=["summary"])
    run.mark_succeeded()
    expect(page.locator("#run-status .status")).to_have_text("succeeded", timeout=20_000)
    expect(page.locator("#eval-table")).to_be_visible(timeout=20_000)
    # The diagnostics slot is refreshed too (4 groups: too few to judge, and it says so).
    expect(page.locator("#diagnostics .diag-status")).to_have_text("not enough data")
    expect(page.locator("#diagnostics")).to_contain_text("Not enough groups to judge: 4 groups")
    assert page.inner_text("#run-rollouts") == "8"
    assert _cell(page, "reward", 3) != "—" and page.locator("[data-chart]").count() == 0
    assert page.evaluate("window.__same_page") == 1
    shot(page, "29-live-eval-ended", full_page=False)
    assert page.console_errors == [] and page.page_errors == []

"""Issue 29, in a real Chromium: numbers and texts that agree with each other and with the data.

Runs are built the way `seed_demo` builds the demo's (the scripted diagram policy, the ask_to_code
stories played in the sandbox, the demo's replay and review queue), smaller. Every assertion reads
what the page shows: texts, bar widths, legend entries, the page's width."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.slow]


# --- runs as the demo makes them ------------------------------------------------------------------


def diagram_import(owner, name: str = "diagram · scripted policy (demo)", seed: int = 0):
    """A scripted-policy run of the diagram environment, stored as an import (as the demo's)."""
    from training.demo import generate_groups, linear_schedule
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import environment_from_training, get_or_create_run
    from webapp.runs.management.commands.seed_demo import trl_style_metrics
    from webapp.runs.metrics import record_metrics
    from webapp.runs.models import Run

    env = get_environment("diagram")
    run, _ = get_or_create_run(
        name=name,
        kind=Run.Kind.IMPORT,
        environment=environment_from_training(env),
        owner=owner,
        status=Run.Status.RUNNING,
        config={"policy": "ScriptedDiagramPolicy", "scale_rewards": "group"},
    )
    steps = 4  # enough groups for ties, hacks and curves; seconds to generate
    groups = generate_groups(
        env,
        ScriptedDiagramPolicy(seed=seed, skill=0.2),
        steps,
        8,
        G=8,
        seed=seed,
        skill_schedule=linear_schedule(0.2, 0.9, steps),
    )
    ingest_groups(run, {"groups": groups})
    names = [c.name for c in env.components]
    weights = {c.name: c.weight for c in env.components}
    record_metrics(run, {"metrics": trl_style_metrics(groups, names, weights)})
    run.mark_succeeded()
    return run


def ask_import(owner, steps: int = 1):
    """The fixed ask_to_code story's first steps (every style of the scripted policy)."""
    from training.demo_stories import story_groups
    from training.environments import get_environment
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import environment_from_training, get_or_create_run
    from webapp.runs.models import Run

    run, _ = get_or_create_run(
        name="ask_to_code · verifier fixed (demo)",
        kind=Run.Kind.IMPORT,
        environment=environment_from_training(get_environment("ask_to_code")),
        owner=owner,
    )
    ingest_groups(run, {"groups": story_groups(False, steps=steps, groups_per_step=4, G=6)})
    run.mark_succeeded()
    return run


def _labels():
    from webapp.annotations.taxonomy import ensure_default_labels

    ensure_default_labels()


# --- 1. DPO export of a multi-turn run ------------------------------------------------------------


def test_it_exports_dpo_pairs_of_a_multi_turn_run_with_the_prompt_once(
    page, live_server, personas, shot
):
    from webapp.annotations.models import Label
    from webapp.annotations.services import save_annotation
    from webapp.rollouts.models import Rollout

    _labels()
    run = ask_import(personas["trainer"])
    guess = Label.objects.get(slug="premature-completion")
    for r in Rollout.objects.filter(run=run, state__policy_style="guess"):
        save_annotation(r, personas["annotator"], label=guess, note="codes before asking")
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/annotations/datasets/")
    page.click("text=Export a new dataset")
    page.fill('#ann-export-form input[name="name"]', "ask-guesses")
    page.select_option('#ann-export-form select[name="kind"]', "dpo")
    page.select_option('#ann-export-form select[name="source"]', "label")
    page.select_option('#ann-export-form select[name="label"]', "premature-completion")
    page.select_option('#ann-export-form select[name="run"]', str(run.id))
    page.click('#ann-export-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/annotations/datasets/\d+/$"))
    shot(page, "truths-dataset-multiturn")
    body = page.request.get(page.url + "download.jsonl").text()
    records = [json.loads(line) for line in body.splitlines()]
    assert records
    for rec in records:
        transcript = Rollout.objects.get(id=rec["source_rollout_id"]).transcript
        # The episode's own system + user messages are the prompt, once.
        assert [m["role"] for m in rec["prompt"]] == ["system", "user"]
        assert rec["prompt"][1]["content"] == transcript[1]["content"]
        for side in ("chosen", "rejected"):
            assert [m["role"] for m in rec[side]] == ["assistant"] * len(rec[side]), rec[side]
            assert all(m["content"] != transcript[1]["content"] for m in rec[side])
    assert page.console_errors == [] and page.page_errors == []


# --- 2. weights as typed --------------------------------------------------------------------------


class TrlShapedTrainer:
    """What training.recorder.trainer_settings reads from a TRL 1.16 GRPOTrainer: the config's
    reward_weights, and the float32 tensor GRPOTrainer.__init__ makes of them."""

    def __init__(self, names: list[str], weights: list[float]) -> None:
        import torch

        self.args = SimpleNamespace(reward_weights=weights, beta=0.0, loss_type="dapo")
        self.reward_func_names = names
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)  # as TRL 1.16 does
        self.scale_rewards = "group"
        self.num_generations = 8


def test_it_shows_the_weights_the_user_typed_after_the_trainer_reports_them(
    page, live_server, personas, shot, monkeypatch
):
    from training.recorder import trainer_settings
    from webapp.runs import launch
    from webapp.runs.models import Run
    from workers.sinks import DatabaseSink

    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")  # no worker here
    demo = diagram_import(personas["trainer"])
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/launch/grpo/?environment=diagram")
    page.fill('input[name="name"]', "grpo with the default weights")
    assert page.input_value('input[name="weight_json_valid"]') == "0.2"
    page.check('input[name="launch_anyway"]')  # the untrained tiny model, on purpose
    page.click('button[type="submit"].primary')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    run = Run.objects.get(name="grpo with the default weights")
    # The worker starts the trainer: the recorder posts what it trains with.
    weights = run.reward_weights()
    DatabaseSink(run.id).write_settings(
        trainer_settings(TrlShapedTrainer(list(weights), list(weights.values())))
    )
    page.goto(f"{live_server.url}/runs/{run.id}/")
    row = page.locator("tr", has=page.locator("td", has_text=re.compile(r"^json_valid$")))
    weight_cell = row.first.locator("td").nth(2).inner_text()
    assert weight_cell == "0.2", weight_cell  # not 0.20000000298023224 (default 0.2)
    shot(page, "truths-provenance-weights")
    page.goto(f"{live_server.url}/jobs/{run.id}/")
    assert "replaces" not in page.inner_text("body")  # nothing changed: the log says nothing
    page.goto(f"{live_server.url}/jobs/compare/?run={demo.id}&run={run.id}")
    assert page.locator("#weights-note").count() == 0  # both sum with the default weights
    assert page.console_errors == [] and page.page_errors == []


# --- 3. ablation: a different best vs a tie -------------------------------------------------------


def _expected_best_changes(run, dropped: str) -> tuple[int, int, int]:
    """(groups with a unique best reward, of those a different unique best, of those a tie) when
    `dropped` is left out of the weighted sum: within a group the advantage orders completions as
    the reward does (scale_rewards=group), so the best by reward is the best by advantage."""
    from webapp.rollouts.models import RewardScore

    weights = run.reward_weights()
    totals: dict[int, dict[int, list[float]]] = {}
    for gid, rid, comp, value in RewardScore.objects.filter(run=run).values_list(
        "rollout__group_id", "rollout_id", "component__name", "value"
    ):
        both = totals.setdefault(gid, {}).setdefault(rid, [0.0, 0.0])
        both[0] += weights[comp] * (value or 0.0)
        if comp != dropped:
            both[1] += weights[comp] * (value or 0.0)
    unique = different = tied = 0
    for rows in totals.values():
        before = max(v[0] for v in rows.values())
        top = [rid for rid, v in rows.items() if v[0] >= before - 1e-9]
        if len(top) != 1:
            continue
        unique += 1
        after = max(v[1] for v in rows.values())
        top_after = [rid for rid, v in rows.items() if v[1] >= after - 1e-9]
        if len(top_after) > 1:
            tied += 1
        elif top_after != top:
            different += 1
    return unique, different, tied


def test_it_reports_a_different_best_and_a_tie_apart_with_their_denominator(
    page, live_server, personas, shot
):
    run = diagram_import(personas["trainer"])
    unique, different, tied = _expected_best_changes(run, "layout_quality")
    assert tied > 0  # the demo's case: layout_quality alone separated some groups' best
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/diagnostics/runs/{run.id}/ablations/")
    page.check('input[name="drop"][value="layout_quality"]')
    page.click("#ablation-form button.primary")
    page.wait_for_selector("#ablation-numbers")
    assert page.locator("#ablation-best-different").count() == 1, "no 'different best' row"
    got_different = page.inner_text("#ablation-best-different td")
    got_tied = page.inner_text("#ablation-best-tied td")
    assert got_different.startswith(f"{different} of {unique} ("), got_different
    assert got_tied.startswith(f"{tied} of {unique} ("), got_tied
    verdict = page.inner_text("#ablation-numbers .verdict")
    assert f"a different best in {different} of {unique} groups with a unique best" in verdict
    assert f"{tied} of {unique} now tied" in verdict
    shot(page, "truths-ablation-ties")
    assert page.console_errors == [] and page.page_errors == []


# --- 5, 10, 12: the replay page -------------------------------------------------------------------


def _replay_with_later_hacks(personas):
    """The demo's replay (hacks annotated, semantic_coverage@no_extras), then two more reward
    hacks annotated after it finished."""
    from webapp.annotations.models import Label
    from webapp.annotations.services import save_annotation
    from webapp.rollouts.models import Rollout
    from webapp.runs.management.commands import seed_demo

    _labels()
    run = diagram_import(personas["trainer"])
    replay = seed_demo._replay_story(run, personas["trainer"])
    assert replay is not None and replay.summary
    hack = Label.objects.get(slug="reward-hacking")
    later = (
        Rollout.objects.filter(run=run)
        .exclude(annotations__label=hack)
        .order_by("-reward", "id")[:2]
    )
    for r in later:
        save_annotation(r, personas["annotator"], label=hack, note="found after the replay")
    return run, replay


HACKS = re.compile(r"[Rr]eward hacks still ranked best in their group: (\d+) of (\d+)")


def test_it_says_the_same_hack_count_in_the_summary_and_the_box_with_their_times(
    page, live_server, personas, shot
):
    run, replay = _replay_with_later_hacks(personas)
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/replays/{replay.id}/")
    assert page.locator("#replay-summary").count() == 1, "no summary line"
    line = page.inner_text("#replay-summary")
    box = page.inner_text("#replay-headline .verdict")
    assert HACKS.search(line).groups() == HACKS.search(box).groups(), (line, box)
    assert "annotations as of" in line
    # Best-completion changes: a new winner and a tie apart, over the groups with a unique best.
    different = page.inner_text("#replay-best-different td")
    tied = page.inner_text("#replay-best-tied td")
    n = re.search(r"of (\d+) groups with a unique best", different).group(1)
    assert f"a different best in {different.split()[0]} of {n} groups with a unique best" in line
    assert f"{tied.split()[0]} of {n} now tied" in line
    assert "From the annotations as of" in page.inner_text("#replay-headline")
    then = page.inner_text("#replay-summary-then")  # the line as it stood, with its time
    assert "When it finished" in then and HACKS.search(then).group(2) != HACKS.search(box).group(2)
    shot(page, "truths-replay-summary")
    assert page.console_errors == [] and page.page_errors == []


def test_it_says_why_an_import_has_no_train_button_and_keeps_the_launch_link(
    page, live_server, personas, shot
):
    from webapp.runs.management.commands import seed_demo

    _labels()
    run = diagram_import(personas["trainer"])
    replay = seed_demo._replay_story(run, personas["trainer"])  # worked to the end
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/replays/{replay.id}/")
    assert page.locator("header nav a", has_text="Launch").count() == 1  # as on every page
    assert page.locator("#replay-train").count() == 0
    why = page.inner_text("#replay-no-train")
    assert "Train with this reward" in why and "import run" in why, why
    shot(page, "truths-replay-no-train", full_page=False)
    assert page.console_errors == [] and page.page_errors == []


def test_it_fits_the_replay_page_in_a_1400_pixel_window(page, live_server, personas, shot):
    from webapp.rollouts.models import Rollout

    run, replay = _replay_with_later_hacks(personas)
    # Completions as the demo's scripted policy writes them: one compact JSON action a line, no
    # space to break a line at inside one.
    shape = {"action": "create_shape", "shape": "rect", "x": 300, "y": 20, "w": 200, "h": 50}
    compact = "[\n" + "\n".join(
        json.dumps({**shape, "id": name, "label": name}, separators=(",", ":"))
        for name in ("Checkout", "Build", "Test", "Deploy")
    )
    Rollout.objects.filter(run=run).update(completion=compact)
    page.set_viewport_size({"width": 1400, "height": 900})
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/replays/{replay.id}/")
    page.wait_for_selector('.chart[data-chart="share"][data-drawn] .main-svg')
    widths = page.evaluate(
        """() => ({page: document.documentElement.scrollWidth,
                   tables: [...document.querySelectorAll('main table')].map(
                     t => Math.round(t.getBoundingClientRect().right))})"""
    )
    assert widths["page"] <= 1400 and max(widths["tables"]) <= 1400, widths
    shot(page, "truths-replay-1400")
    assert page.console_errors == [] and page.page_errors == []


# --- 6. penalty bars ------------------------------------------------------------------------------


def test_it_draws_no_penalty_as_an_empty_bar_and_a_full_penalty_as_a_full_one(
    page, live_server, personas, shot
):
    from webapp.rollouts.models import RewardScore

    run = ask_import(personas["trainer"])
    values = set(
        RewardScore.objects.filter(run=run, component__name="loop_penalty").values_list(
            "value", flat=True
        )
    )
    assert {0.0, -1.0} <= values  # the story has looping and non-looping episodes
    login(page, live_server, "viewer", PASSWORD)
    for sort, order in (("loop_penalty", "asc"), ("loop_penalty", "desc")):
        page.goto(f"{live_server.url}/runs/{run.id}/rollouts/?sort={sort}&order={order}")
        cells = page.eval_on_selector_all(
            "td.comp.sorted",
            """cs => cs.map(c => ({value: parseFloat(c.querySelector('.bar-num').textContent),
                 fill: c.querySelector('.bar > span').getBoundingClientRect().width,
                 full: c.querySelector('.bar').getBoundingClientRect().width}))""",
        )
        assert cells
        for c in cells:
            expected = c["full"] * (-c["value"])  # the size of the penalty: 0 empty, -1 full
            assert abs(c["fill"] - expected) <= 1, c
    # Every other place that draws component bars: the group view and the transcript.
    from webapp.rollouts.models import Rollout

    worst = Rollout.objects.filter(
        run=run, scores__component__name="loop_penalty", scores__value=-1.0
    ).first()
    for url in (f"/groups/{worst.group_id}/", f"/rollouts/{worst.id}/"):
        page.goto(live_server.url + url)
        bars = page.eval_on_selector_all(
            ".bar.penalty",
            """bs => bs.map(b => ({title: b.title,
                 fill: b.querySelector('span').getBoundingClientRect().width,
                 full: b.getBoundingClientRect().width}))""",
        )
        assert bars, url
        for b in bars:
            value = float(b["title"].split(": ")[1].split(" ")[0])
            assert abs(b["fill"] - b["full"] * (-value)) <= 1, (url, b)
    shot(page, "truths-penalty-bars")
    assert page.console_errors == [] and page.page_errors == []


# --- 12. compare, agreement, export error, focus --------------------------------------------------


def test_it_names_the_runs_in_the_compare_legends_and_picks_them_with_a_chooser(
    page, live_server, personas, shot
):
    a = diagram_import(personas["trainer"], name="diagram before", seed=0)
    b = diagram_import(personas["trainer"], name="diagram after", seed=1)
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/jobs/compare/")
    page.fill("#run-filter", "diagram")
    page.check(f"#pick-{a.id}")
    page.click(f"label[for=pick-{b.id}]")
    page.click("#run-chooser button[type=submit]")
    page.wait_for_selector("#compare-charts .legendtext")
    assert set(re.findall(r"run=(\d+)", page.url)) == {str(a.id), str(b.id)}
    legends = page.eval_on_selector_all(
        "#compare-charts .js-plotly-plot",
        "ps => ps.map(p => [...p.querySelectorAll('.legendtext')].map(t => t.textContent))",
    )
    assert len(legends) >= 2  # the reward and at least one component
    for entries in legends:
        assert sorted(entries) == sorted([f"diagram before (#{a.id})", f"diagram after (#{b.id})"])
    shot(page, "truths-compare")
    assert page.console_errors == [] and page.page_errors == []


@pytest.fixture
def reviewed(personas):
    """The demo's review queue (both annotators, the demo's labels and notes) on an ask run."""
    from webapp.runs.management.commands import seed_demo

    _labels()
    run = ask_import(personas["trainer"], steps=2)
    return seed_demo._review_queue(run, personas["trainer"], personas["annotator"])


def test_it_shows_each_annotators_label_and_note_apart_on_the_agreement_page(
    page, live_server, reviewed, shot
):
    from webapp.annotations.models import Annotation, Label

    slugs = set(Label.objects.values_list("slug", flat=True))
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/annotations/queues/{reviewed.id}/agreement/")
    opinions = page.eval_on_selector_all(
        "#ann-disagreements .ann-opinion",
        """os => os.map(o => ({by: o.querySelector('.ann-by').textContent,
             label: o.querySelector('.ann-label').textContent,
             note: (o.querySelector('q') || {}).textContent || ''}))""",
    )
    assert opinions, "no disagreement shown"
    notes = dict(
        Annotation.objects.filter(rollout__queue_items__queue=reviewed).values_list(
            "author__username", "note"
        )
    )
    for o in opinions:
        assert o["by"] in {"trainer", "annotator"}
        assert o["note"] and not o["note"].startswith("demo:"), o
        assert not any(s in o["note"] for s in slugs), o  # a reason, not the label again
    assert set(notes) == {"trainer", "annotator"}
    shot(page, "truths-agreement")
    assert page.console_errors == [] and page.page_errors == []


def test_it_counts_skipped_bad_cases_in_words_in_an_export_error(page, live_server, reviewed, shot):
    login(page, live_server, "trainer", PASSWORD)
    page.goto(f"{live_server.url}/annotations/datasets/")
    page.click("text=Export a new dataset")
    page.fill('#ann-export-form input[name="name"]', "no-corrections")
    page.select_option('#ann-export-form select[name="kind"]', "sft")
    page.select_option('#ann-export-form select[name="source"]', "queue")
    page.select_option('#ann-export-form select[name="queue"]', str(reviewed.id))
    page.click('#ann-export-form button[type="submit"]')
    error = page.inner_text("#ann-export-form .ann-error")
    m = re.search(r"(\d+) bad cases? without a correction", error)
    assert m, error
    n = int(m.group(1))
    assert (n == 1) == ("bad case without" in error), error  # "5 bad cases", "1 bad case"
    assert re.search(r"\d+ good completions? \(not included\)", error), error
    shot(page, "truths-export-error", full_page=False)


def test_it_shows_each_components_reason_in_the_focus_view(page, live_server, reviewed, shot):
    item = reviewed.items.select_related("rollout").order_by("position").first()
    expected = list(
        item.rollout.scores.order_by("component__position", "component_id").values_list(
            "component__name", "reason"
        )
    )
    login(page, live_server, "annotator", PASSWORD)
    page.goto(f"{live_server.url}/annotations/queues/{reviewed.id}/focus/{item.position}/")
    assert page.locator("#ann-scores").count() == 1, "no component table"
    rows = page.eval_on_selector_all(
        "#ann-scores tr",
        "rs => rs.map(r => [r.querySelector('th').textContent, "
        "r.querySelector('.ann-reason').textContent])",
    )
    assert rows == [[name, reason or "—"] for name, reason in expected]
    assert all(page.locator(".ann-reason").nth(i).is_visible() for i in range(len(rows)))
    shot(page, "truths-focus-reasons")
    assert page.console_errors == [] and page.page_errors == []

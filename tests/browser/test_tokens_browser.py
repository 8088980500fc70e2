"""The token view in a real Chromium: colours follow the chosen quantity, the hover/focus card reads
every value of a token, masked tokens and turns are marked, the keyboard walks the tokens, hostile
token text stays text, a 32,000-token rollout draws only what is near the view, and opening the
panel shifts nothing on the page. The dashboard's token charts draw."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser.conftest import login
from tests.conftest import PASSWORD
from tests.webapp.test_token_pages import groups

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG = 32_000


@pytest.fixture
def token_run(run):
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(run, {"groups": groups(24, drift=14)})
    return run


@pytest.fixture
def long_rollout(run):
    """One rollout of LONG tokens: a long answer between two tool results."""
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Rollout

    rng = np.random.default_rng(7)
    words = [f"w{i % 997}" + (" " if i % 13 else "\n") for i in range(LONG - 20)]
    text = ["tool says hi "] * 10 + words + ["tool says bye "] * 10
    turn = [0] * 10 + [1] * (LONG - 20) + [2] * 10
    trainer = -rng.gamma(0.5, 0.7, LONG)
    tokens = {
        "ids": rng.integers(0, 50_000, LONG).tolist(),
        "text": text,
        "sampler_logprobs": np.minimum(trainer + rng.normal(0, 0.01, LONG), 0).tolist(),
        "trainer_logprobs": trainer.tolist(),
        "entropy": rng.gamma(2.0, 0.4, LONG).tolist(),
        "advantages": [-0.7] * LONG,
        "loss_mask": [0 if t != 1 else 1 for t in turn],
        "turn": turn,
    }
    transcript = [
        {"role": "tool", "content": "".join(text[:10])},
        {"role": "assistant", "content": "".join(words)},
        {"role": "tool", "content": "".join(text[-10:])},
    ]
    rollout = {"index": 0, "transcript": transcript, "rewards": {"correct": 1.0}, "tokens": tokens}
    ingest_groups(
        run, {"groups": [{"step": 0, "key": "long", "prompt": "p", "rollouts": [rollout]}]}
    )
    return Rollout.objects.get(group__key="long")


def open_tokens(page, url: str) -> None:
    page.goto(url)
    page.click(".tv-toggle")
    page.wait_for_selector("#token-view[data-loaded]")
    page.wait_for_selector(".tv-strip .main-svg")


def colour(page, i: int) -> str:
    return page.eval_on_selector(f"#tok-{i}", "e => getComputedStyle(e).backgroundColor")


def card(page) -> dict[str, str]:
    return page.evaluate(
        """() => {
      const out = {}, c = document.querySelector('.tv-card');
      if (c.hidden) return null;
      const dts = c.querySelectorAll('dt');
      dts.forEach(dt => { out[dt.textContent] = dt.nextElementSibling.textContent; });
      return out;
    }"""
    )


def test_it_colours_marks_and_explains_each_token(page, live_server, token_run, shot):
    from webapp.rollouts.models import Rollout

    rollout = Rollout.objects.filter(run=token_run, step=20).order_by("id").first()
    stored = rollout.tokens.arrays()
    login(page, live_server, "viewer", PASSWORD)
    open_tokens(page, f"{live_server.url}/rollouts/{rollout.id}/")
    assert page.get_attribute("#token-view", "data-quantity") == "sampler"
    before = [colour(page, i) for i in range(8)]
    assert len(set(before)) > 1  # the colour follows each token's value
    page.check('input[name="tv-quantity"][value="entropy"]')
    assert page.get_attribute("#token-view", "data-quantity") == "entropy"
    assert [colour(page, i) for i in range(8)] != before
    assert page.eval_on_selector(".tv-strip .gtitle", "e => e.textContent") == "entropy"
    assert page.inner_text(".tv-legend .tv-label") == "entropy"

    # Turns: a header per message, the tool's tokens hatched as out of the loss.
    heads = page.eval_on_selector_all(".tv-turn", "hs => hs.map(h => h.textContent)")
    assert heads[:3] == ["turn 2 · assistant", "turn 3 · tool · unit_tests", "turn 4 · assistant"]
    turns = stored.turn.tolist()
    tool = [i for i, t in enumerate(turns) if t == 3]
    assert page.eval_on_selector(f"#tok-{tool[0]}", "e => e.classList.contains('masked')")
    assert "repeating-linear-gradient" in page.eval_on_selector(
        f"#tok-{tool[0]}", "e => getComputedStyle(e).backgroundImage"
    )
    assert not page.eval_on_selector("#tok-0", "e => e.classList.contains('masked')")

    # Hostile tool output is shown as text: no script ran, the card quotes it.
    assert page.evaluate("window.__pwned") is None and page.dialogs == []
    page.hover(f"#tok-{tool[0]}")
    values = card(page)
    assert values["text"] == '"<"' and values["loss mask"] == "0 · masked, not trained on"
    assert values["turn"] == "3 · tool"

    page.hover("#tok-4")
    values = card(page)
    s, t = float(stored.sampler_logprobs[4]), float(stored.trainer_logprobs[4])
    assert float(values["sampler log-prob"]) == pytest.approx(s, rel=2e-3, abs=1e-4)
    assert float(values["trainer log-prob"]) == pytest.approx(t, rel=2e-3, abs=1e-4)
    assert float(values["delta (trainer − sampler)"]) == pytest.approx(t - s, abs=2e-3)
    assert float(values["importance ratio"]) == pytest.approx(np.exp(t - s), rel=3e-3)
    assert float(values["entropy"]) == pytest.approx(float(stored.entropy[4]), rel=2e-3)
    assert values["token"] == f"#4 · id {int(stored.ids[4])}"
    assert page.page_errors == []
    shot(page, "tokens-view", full_page=False)
    page.screenshot(path="/tmp/tokens-view.png")


def test_the_keyboard_walks_the_tokens(page, live_server, token_run):
    from webapp.rollouts.models import Rollout

    rollout = Rollout.objects.filter(run=token_run).order_by("id").first()
    turns = rollout.tokens.arrays().turn.tolist()
    login(page, live_server, "viewer", PASSWORD)
    open_tokens(page, f"{live_server.url}/rollouts/{rollout.id}/")
    page.focus(".tv-toggle")
    for _ in range(12):  # Tab from the toggle through the quantity choices to the tokens
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('tv-scroll')"):
            break
    assert page.evaluate("document.activeElement.classList.contains('tv-scroll')")
    assert page.get_attribute("#token-view", "data-active") == "0"
    assert card(page)["token"].startswith("#0 ")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#token-view", "data-active") == "2"
    assert page.get_attribute(".tv-scroll", "aria-activedescendant") == "tok-2"
    assert card(page)["token"].startswith("#2 ")
    page.keyboard.press("]")  # the next turn: the tool's first token
    assert int(page.get_attribute("#token-view", "data-active")) == turns.index(3)
    page.keyboard.press("ArrowDown")
    assert int(page.get_attribute("#token-view", "data-active")) > turns.index(3)
    page.keyboard.press("End")
    assert int(page.get_attribute("#token-view", "data-active")) == len(turns) - 1
    page.keyboard.press("Home")
    assert page.get_attribute("#token-view", "data-active") == "0"
    page.keyboard.press("Escape")
    assert card(page) is None
    # Strip chart click: the view moves to that token.
    page.evaluate("document.querySelector('.tv-strip').emit('plotly_click', {points: [{x: 9}]})")
    assert page.get_attribute("#token-view", "data-active") == "9"


def test_a_32000_token_rollout_draws_only_what_is_in_view(page, live_server, long_rollout, shot):
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/rollouts/{long_rollout.id}/")
    page.evaluate(
        """() => { window.__shift = 0; new PerformanceObserver(list => {
          list.getEntries().forEach(e => { if (!e.hadRecentInput) window.__shift += e.value; });
        }).observe({type: 'layout-shift', buffered: true}); }"""
    )
    t0 = page.evaluate("performance.now()")
    page.click(".tv-toggle")
    page.wait_for_selector("#token-view[data-loaded]")
    page.wait_for_selector(".tv-strip .main-svg")
    took = page.evaluate("performance.now()") - t0
    spans = page.eval_on_selector_all(".tv-scroll .tok", "s => s.length")
    chunks = page.eval_on_selector_all(".tv-chunk", "c => c.length")
    assert 0 < spans < 2_000 < LONG and chunks > 150
    assert page.inner_text(".tv-status").startswith(f"{LONG} tokens")
    # Jump to the end and back: what was drawn near the start is given back.
    page.focus(".tv-scroll")
    page.keyboard.press("End")
    page.wait_for_function(f"document.getElementById('tok-{LONG - 1}') !== null")
    page.wait_for_function("document.getElementById('tok-300') === null")
    assert page.eval_on_selector_all(".tv-scroll .tok", "s => s.length") < 2_000
    for y in (0.25, 0.5, 0.75):  # scrolling the middle stays bounded too
        page.eval_on_selector(".tv-scroll", f"s => s.scrollTop = s.scrollHeight * {y}")
        page.wait_for_timeout(120)
        assert page.eval_on_selector_all(".tv-scroll .tok", "s => s.length") < 2_000
    page.keyboard.press("ArrowLeft")
    assert page.get_attribute("#token-view", "data-active") == str(LONG - 2)
    # The page itself never moved while the panel loaded and drew (no layout shift outside input).
    assert page.evaluate("window.__shift") < 0.01
    assert page.page_errors == []
    assert took < 10_000, took
    shot(page, "tokens-long", full_page=False)
    page.screenshot(path="/tmp/tokens-long.png")

    # The panel stays open on the next page (a cookie): the server renders it open at its final
    # size, so loading and drawing the tokens moves nothing there either.
    page.add_init_script(
        """window.__shift = 0; new PerformanceObserver(list => {
          list.getEntries().forEach(e => { if (!e.hadRecentInput) window.__shift += e.value; });
        }).observe({type: 'layout-shift', buffered: true});"""
    )
    page.reload()
    page.wait_for_selector("#token-view[data-loaded]")
    page.wait_for_selector(".tv-strip .main-svg")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__shift") < 0.01


def test_the_dashboard_draws_the_token_charts(page, live_server, token_run):
    login(page, live_server, "viewer", PASSWORD)
    page.goto(f"{live_server.url}/runs/{token_run.id}/")
    page.locator("#token-charts").scroll_into_view_if_needed()
    for chart in ("tokens-mismatch", "tokens-offpolicy", "tokens-entropy", "tokens-masked"):
        page.locator(f'[data-chart="{chart}"]').scroll_into_view_if_needed()
        page.wait_for_selector(f'[data-chart="{chart}"] .main-svg')
    title = page.eval_on_selector('[data-chart="tokens-mismatch"] .gtitle', "e => e.textContent")
    assert title.startswith("Sampler/trainer mismatch")
    assert page.page_errors == []
    page.locator("#token-charts").scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tokens-dashboard.png")
    page.goto(f"{live_server.url}/diagnostics/runs/{token_run.id}/")
    finding = page.locator('.finding[data-code="token_mismatch"]')
    assert "since step 14" in finding.inner_text()
    finding.scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tokens-diagnostics.png")

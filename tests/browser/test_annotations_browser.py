"""Walk a review queue with the keyboard in a real Chromium: label keys, "/" note, "n" save & next,
"s" skip, the skipped item coming back last, and hostile transcripts that run no script."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import login
from tests.conftest import PASSWORD, make_group

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def queue(run, personas):
    from webapp.annotations.services import create_queue
    from webapp.annotations.taxonomy import ensure_default_labels
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Rollout

    # The migrated labels: a flush by an earlier transactional test is not always restored here (the
    # serialized-rollback copy is missing on the connection the Playwright tests see).
    ensure_default_labels()
    ingest_groups(
        run,
        {
            "groups": [
                make_group(
                    0,
                    "p",
                    [{"correct": c, "format": 1} for c in (1, 0, 1)],
                    prompt="Draw a box <script>alert('prompt')</script>",
                )
            ]
        },
    )
    q = create_queue(
        name="hacks at step 0",
        run=run,
        source="explorer",
        params={"sort": "reward"},
        limit=3,
        seed=None,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[personas["annotator"]],
    )
    first = q.items.get(position=0).rollout_id
    Rollout.objects.filter(id=first).update(
        transcript=[
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "draw", "arguments": {"shape": "box"}}],
            },
            {"role": "tool", "content": "ok</pre><img src=x onerror=\"alert('tool')\">"},
            {
                "role": "assistant",
                "content": "Done! <script>window.__pwned = 1; alert('x')</script>",
            },
        ]
    )
    return q


def _focus_url(live_server, queue, position: int) -> re.Pattern:
    return re.compile(
        re.escape(f"{live_server.url}/annotations/queues/{queue.id}/focus/{position}/") + "$"
    )


def test_it_walks_a_queue_with_the_keyboard(page, live_server, queue, personas, shot):
    from webapp.annotations.models import Annotation

    login(page, live_server, "annotator", PASSWORD)
    page.goto(f"{live_server.url}/annotations/queues/{queue.id}/")
    page.click("#ann-start")
    page.wait_for_url(_focus_url(live_server, queue, 0))
    assert page.locator(".ann-pos").inner_text() == "item 1 of 3"
    assert (
        "window.__pwned" in page.locator(".ann-transcript").inner_text()
    )  # shown as text, not run

    page.keyboard.press("1")  # reward hacking
    assert page.locator('input[name="label"][value="reward-hacking"]').is_checked()
    page.keyboard.press("/")
    page.keyboard.type("keyword stuffing; n and s typed here stay text")
    page.keyboard.press("Escape")
    shot(page, "annotations-focus")
    page.keyboard.press("n")
    page.wait_for_url(_focus_url(live_server, queue, 1))
    ann = Annotation.objects.get(author=personas["annotator"])
    assert (ann.label.slug, ann.note) == (
        "reward-hacking",
        "keyword stuffing; n and s typed here stay text",
    )

    page.keyboard.press("s")  # skip item 2: it comes back once the rest is done
    page.wait_for_url(_focus_url(live_server, queue, 2))
    page.keyboard.press("0")  # good
    page.keyboard.press("n")
    page.wait_for_url(_focus_url(live_server, queue, 1))
    page.keyboard.press("n")  # no label chosen: the server says so and stores nothing
    # The refusal arrives as a new page: wait for it (reading at once raced the
    # response under load).
    expect(page.locator(".ann-panel")).to_contain_text("label: choose a label")
    page.keyboard.press("5")  # loop / repetition
    page.keyboard.press("n")
    page.wait_for_url(f"{live_server.url}/annotations/queues/{queue.id}/")
    assert "Nothing left for you in this queue." in page.content()
    assert page.locator("#ann-progress tbody tr").first.inner_text().split() == [
        "annotator",
        "3",
        "3",
        "0",
        "100%",
    ]
    shot(page, "annotations-queue")

    got = sorted(Annotation.objects.values_list("label__slug", flat=True))
    assert got == ["good", "loop-repetition", "reward-hacking"]
    assert page.dialogs == [] and page.page_errors == []
    assert page.evaluate("window.__pwned") is None

"""The behaviour pages: saving an explorer view, find more like this, the dashboard panel (onset,
findings, the click-through link), one behaviour across the runs of its environment."""

from __future__ import annotations

import pytest

from tests.webapp.test_behaviours import ONSET, label_hacks, seed_planted
from webapp.behaviours import services
from webapp.behaviours.models import Behaviour
from webapp.rollouts.services import create_run


@pytest.fixture(autouse=True)
def _fresh_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def test_it_saves_an_explorer_view_as_a_behaviour(client_as, run):
    seed_planted(run)
    c = client_as("annotator")
    page = c.get(f"/runs/{run.id}/rollouts/?q=skipped&sort=advantage").content.decode()
    assert f"/behaviours/runs/{run.id}/new/?" in page and 'id="save-behaviour"' in page
    r = c.get(f"/behaviours/runs/{run.id}/new/?q=skipped&sort=advantage&order=desc")
    assert r.status_code == 200 and 'name="q" value="skipped"' in r.content.decode()
    r = c.post(
        f"/behaviours/runs/{run.id}/new/",
        {"q": "skipped", "name": "skips tests", "critical": "on", "max_rate": "0.2"},
    )
    assert r.status_code == 302
    b = Behaviour.objects.get(name="skips tests")
    assert b.query == {"q": "skipped"} and b.critical and b.max_rate == 0.2
    detail = c.get(r["Location"]).content.decode()
    assert "skips tests" in detail and "toy-run" in detail


def test_it_refuses_a_bad_pattern_on_the_page_naming_it(client_as, run):
    r = client_as("annotator").post(
        f"/behaviours/runs/{run.id}/new/", {"q": "skipped", "name": "x", "pattern": "(a"}
    )
    assert r.status_code == 400 and 'data-field="pattern"' in r.content.decode()
    assert not Behaviour.objects.exists()
    assert client_as("viewer").get(f"/behaviours/runs/{run.id}/new/?q=x").status_code == 403


def test_it_proposes_queries_from_a_label(client_as, personas, run):
    seed_planted(run)
    label_hacks(run, personas["annotator"])
    explorer = client_as("viewer").get(f"/runs/{run.id}/rollouts/?label=reward-hacking")
    assert 'id="find-like"' in explorer.content.decode()
    page = client_as("viewer").get(f"/behaviours/runs/{run.id}/like/?label=reward-hacking")
    text = page.content.decode()
    assert page.status_code == 200 and 'recalls <strong class="recall">5 of 5</strong>' in text
    bad = client_as("viewer").get(f"/behaviours/runs/{run.id}/like/?label=good")
    assert bad.status_code == 400 and "no rollout of this run is labelled" in bad.content.decode()


def test_it_draws_the_panel_with_the_onset_and_a_click_through(client_as, run):
    seed_planted(run)
    services.define(run.environment, name="skips tests", query={"q": '"skipped running"'})
    dash = client_as("viewer").get(f"/runs/{run.id}/").content.decode()
    assert f"/behaviours/runs/{run.id}/panel/" in dash
    panel = client_as("viewer").get(f"/behaviours/runs/{run.id}/panel/").content.decode()
    assert "onset at step" in panel and 'data-code="behaviour_taught"' in panel
    assert f'data-explorer="/runs/{run.id}/rollouts/?q=' in panel
    live = client_as("viewer").get(f"/behaviours/runs/{run.id}/series.json").json()
    (fig,) = live.values()
    assert fig["data"][0]["name"] == "rate" and len(fig["data"][0]["x"]) == 60


def test_it_overlays_every_run_of_the_environment(client_as, run, personas):
    seed_planted(run)
    twin = create_run(
        name="fixed-reward",
        kind="import",
        environment=run.environment,
        config={},
        owner=personas["trainer"],
        status="running",
    )
    seed_planted(twin, seed=11)
    b = services.define(run.environment, name="skips tests", query={"q": "skipped"})
    page = client_as("viewer").get(f"/behaviours/{b.id}/").content.decode()
    assert "toy-run" in page and "fixed-reward" in page and 'data-chart="overlay"' in page
    rows = services.overlay(b, [run, twin])
    assert all(abs(r["onset_step"] - ONSET) <= 2 for r in rows)

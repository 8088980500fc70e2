"""Plotly renders a subset of HTML in trace names, titles, annotations, hover text and
category labels: a metric, component or run name must reach the figure JSON escaped, on every
page that draws one."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.services import create_run, ensure_environment
from webapp.runs import charts
from webapp.runs.metrics import record_metrics

EVIL = "<a href=//evil>x</a>"
SAFE = "&lt;a href=//evil&gt;x&lt;/a&gt;"


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def figure_blob(html: str, blob_id: str):
    m = re.search(rf'<script id="{blob_id}" type="application/json">(.*?)</script>', html, re.S)
    assert m, f"no {blob_id} on the page"
    return json.loads(m.group(1))


def assert_escaped(figures) -> None:
    texts = list(strings(figures))
    assert SAFE in "\n".join(texts), (
        "the hostile name never reached a figure: the test proves nothing"
    )
    assert not any("<a" in t for t in texts), [t for t in texts if "<a" in t][:3]


@pytest.fixture
def hostile_run(db, personas):
    # A training environment's component names are not checked like the API's: any text
    # reaches the DB.
    env = ensure_environment(
        "hostile",
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
    run = create_run(
        name=EVIL,
        kind="grpo",
        environment=env,
        config={},
        status="running",
        owner=personas["trainer"],
    )
    groups = [make_group(step, f"p{step}", [{EVIL: 1.0}, {EVIL: 0.0}]) for step in range(3)]
    ingest_groups(run, {"groups": groups})
    record_metrics(
        run, {"metrics": [{"step": s, "values": {EVIL: 0.5 + s, "loss": 1.0}} for s in range(3)]}
    )
    return run


def test_it_escapes_names_and_titles_in_a_metric_figure():
    fig = charts.metric_figure(EVIL, [0, 1], [0.1, 0.2], "#000")
    assert fig["data"][0]["name"] == SAFE and fig["layout"]["title"]["text"] == SAFE
    assert fig["data"][0]["line"]["color"] == "#000" and fig["data"][0]["x"] == [
        0,
        1,
    ]  # style and data untouched


def test_it_escapes_annotations_hover_and_category_labels():
    fig = charts.escape_figure(
        {
            "data": [
                {
                    "type": "bar",
                    "x": [EVIL],
                    "y": [1],
                    "hovertext": [EVIL],
                    "hovertemplate": "%{x}<extra></extra>",
                }
            ],
            "layout": {"annotations": [{"text": EVIL, "x": 1}], "xaxis": {"title": EVIL}},
        }
    )
    assert fig["data"][0]["x"] == [SAFE] and fig["data"][0]["hovertext"] == [SAFE]
    assert (
        fig["data"][0]["hovertemplate"] == "%{x}<extra></extra>"
    )  # ours: plotly's own markup stays
    assert (
        fig["layout"]["annotations"][0]["text"] == SAFE and fig["layout"]["xaxis"]["title"] == SAFE
    )


def test_it_escapes_a_hostile_metric_and_component_on_the_dashboard(client_as, hostile_run):
    res = client_as("viewer").get(f"/runs/{hostile_run.id}/")
    assert res.status_code == 200
    assert_escaped(figure_blob(res.content.decode(), "dashboard-figures"))


def test_it_escapes_a_hostile_component_on_the_diagnostics_page(client_as, hostile_run):
    res = client_as("viewer").get(f"/diagnostics/runs/{hostile_run.id}/")
    assert res.status_code == 200
    assert_escaped(figure_blob(res.content.decode(), "diag-figures"))


def test_it_escapes_hostile_run_names_on_the_compare_pages(client_as, hostile_run, env3):
    other = create_run(
        name="plain", kind="grpo", environment=hostile_run.environment, config={}, status="running"
    )
    ingest_groups(other, {"groups": [make_group(0, "q", [{EVIL: 1.0}, {EVIL: 0.5}])]})
    c = client_as("viewer")
    res = c.get(f"/jobs/compare/?run={hostile_run.id}&run={other.id}")
    assert res.status_code == 200
    assert_escaped(figure_blob(res.content.decode(), "compare-figures"))
    res = c.get(f"/diagnostics/runs/{hostile_run.id}/overlay/{other.id}/")
    assert res.status_code == 200
    assert_escaped(figure_blob(res.content.decode(), "overlay-figures"))

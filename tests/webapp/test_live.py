"""The dashboard's live poll (runs/<id>/live.json): whole figures for a page that names no
step, and only the points from the page's last step on when it does (the page extends its
charts with them)."""

from __future__ import annotations

from django.urls import reverse

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.runs.models import StepMetric


def _grow(run, steps):
    ingest_groups(
        run,
        {"groups": [make_group(s, f"g{s}", [{"correct": 1}, {"correct": s % 2}]) for s in steps]},
    )
    StepMetric.objects.bulk_create(
        [StepMetric(run=run, step=s, name="kl", value=0.01 * s) for s in steps]
    )


def test_it_sends_only_the_points_from_the_step_the_page_names(client_as, run):
    _grow(run, range(4))
    url = reverse("runs-live", args=[run.id])
    viewer = client_as("viewer")
    first = viewer.get(url, {"since": 3}).json()
    assert first["figures"] is None and first["since"] == 3
    assert first["points"]["reward"]["x"] == [[3], [3], [3]]  # band, band, mean
    assert first["points"]["metric:kl"] == {"x": [[3]], "y": [[0.03]]}
    _grow(run, (4, 5))
    grown = viewer.get(url, {"version": first["version"], "since": 3}).json()
    assert grown["points"]["reward"]["x"][2] == [3, 4, 5]
    assert grown["points"]["metric:kl"]["x"] == [[3, 4, 5]]
    assert {k for k in grown["points"] if k.startswith(("mean-", "std-"))} == {
        "mean-0",
        "std-0",
        "mean-1",
        "std-1",
        "mean-2",
        "std-2",
    }
    same = viewer.get(url, {"version": grown["version"], "since": 5}).json()
    assert same["points"] is None and same["figures"] is None  # nothing new: no chart rebuilt


def test_it_sends_whole_figures_when_the_page_names_no_step(client_as, run):
    _grow(run, range(3))
    url = reverse("runs-live", args=[run.id])
    for query in ({}, {"since": "x"}):
        body = client_as("viewer").get(url, query).json()
        assert body["points"] is None and body["figures"]["reward"]["data"][2]["x"] == [0, 1, 2]

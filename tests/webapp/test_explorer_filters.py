"""A filter registered from outside the explorer package (as an app does from its
AppConfig.ready()) is parsed, written back into links, checked, and filters the explorer's pages,
the API and a behaviour's matches; without the registration its parameter is ignored."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Exists, Expression, OuterRef
from django.urls import reverse

from webapp.errors import FieldError
from webapp.explorer import filters
from webapp.explorer.params import ExplorerQuery, int_param
from webapp.explorer.query import explore, matching_rollouts
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import RewardComponent, Rollout
from webapp.runs.models import Run


class PositionFilter(filters.ExplorerFilter):
    """A toy: position=<n> keeps the rollouts at index n of their group."""

    key = "position"

    def parse(self, params: Mapping[str, Any], components: list[str]) -> int | None:
        return int_param(params, "position")

    def to_params(self, value: int) -> dict[str, str]:
        return {"position": str(value)}

    def resolve(self, run: Run, value: int, sort: str) -> int:
        if value < 0:
            raise FieldError("position", "must be 0 or more")
        return value

    def conditions(
        self, resolved: int, outer: str, comps: dict[str, RewardComponent]
    ) -> list[Expression]:
        return [Exists(Rollout.objects.filter(id=OuterRef(outer), index=resolved))]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(filters, "_REGISTRY", dict(filters._REGISTRY))  # undone after the test
    return filters.register(PositionFilter())


@pytest.fixture
def scored(run):
    groups = [
        {
            "step": step,
            "key": "p",
            "prompt": "prompt",
            "rollouts": [
                {"index": i, "completion": f"answer {step} {i}", "rewards": {"correct": i / 4}}
                for i in range(4)
            ],
        }
        for step in range(3)
    ]
    ingest_groups(run, {"groups": groups})
    return run


def test_it_parses_the_filter_and_writes_it_back(registered):
    q = ExplorerQuery.from_params({"position": "2", "sort": "correct"}, ["correct"])
    assert q.filters == {"position": 2}
    assert q.params() == {"sort": "correct", "order": "desc", "position": "2"}
    with pytest.raises(FieldError) as e:
        ExplorerQuery.from_params({"position": "two"}, [])
    assert e.value.field == "position"


def test_it_filters_the_pages_the_api_and_a_behaviours_matches(registered, scored, api, personas):
    comps = scored.components()
    q = ExplorerQuery.from_params({"position": "1", "sort": "correct"}, [c.name for c in comps])
    page = explore(scored, q)
    assert [r.rollout.index for r in page.rows] == [1, 1, 1]
    res = api(personas["viewer"]).get(
        reverse("api-run-rollouts", args=[scored.id]), {"position": "1"}
    )
    assert res.status_code == 200, res.content
    assert [r["index"] for r in res.json()["rollouts"]] == [1, 1, 1]
    parts = matching_rollouts(scored, q, comps)
    assert sorted(i for part in parts for i in part.values_list("index", flat=True)) == [1, 1, 1]


def test_it_checks_the_value_against_the_run(registered, scored):
    with pytest.raises(FieldError) as e:
        explore(scored, ExplorerQuery(filters={"position": -1}))
    assert e.value.field == "position"


def test_without_the_registration_the_parameter_is_ignored(scored):
    q = ExplorerQuery.from_params({"position": "1"}, [])
    assert q.filters == {} and "position" not in q.params()
    assert len(explore(scored, q).rows) == 12


def test_the_explorer_never_imports_the_apps_that_register_filters():
    root = Path(__file__).resolve().parents[2] / "webapp" / "explorer"
    imported = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
    assert not {m for m in imported if m.startswith(("webapp.replays", "webapp.annotations"))}

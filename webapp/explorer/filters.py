"""Filters other apps add to the explorer. An app registers an ExplorerFilter from its
AppConfig.ready() (webapp/replays/explorer.py, webapp/annotations/explorer.py); the explorer then
parses its parameters, writes them back into links, applies its conditions and, if it serves a
sort, walks its rows. The explorer never imports those apps. Example: docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, Expression, OuterRef, QuerySet

if TYPE_CHECKING:
    from webapp.rollouts.models import RewardComponent
    from webapp.runs.models import Run

Ranges = dict[str, tuple[float | None, float | None]]  # name -> (lo, hi)


class ExplorerFilter:
    """One filter: its parsed value lives in ExplorerQuery.filters[key] (absent when unused)."""

    key: str = ""  # names the filter in the registry and in ExplorerQuery.filters
    sort_help: str = ""  # the sorts it serves, as the sort parameter's error names them
    in_matching: bool = True  # applied by matching_rollouts (a behaviour's rollouts) too

    def parse(self, params: Mapping[str, Any], components: list[str]) -> Any:
        """The filter's value from query-string params, or None when it is not used. Raises
        FieldError naming the parameter."""
        raise NotImplementedError

    def to_params(self, value: Any) -> dict[str, str]:
        """The value as URL parameters (so a link reproduces the view)."""
        raise NotImplementedError

    def sorts(self, sort: str, components: list[str]) -> bool:
        """Whether the filter serves the sort key `sort` (sort_rows then gives its rows)."""
        return False

    def resolve(self, run: Run, value: Any, sort: str) -> Any:
        """The value checked against the run (e.g. a row it names) and the query's sort: a
        FieldError if it is not there. What conditions and sort_rows receive. `value` is None
        when the query sorts by a sort of this filter's but does not set it (built in code)."""
        return value

    def conditions(
        self, resolved: Any, outer: str, comps: dict[str, RewardComponent]
    ) -> list[Expression]:
        """Conditions on the rows walked, whose rollout id is the field `outer` (an EXISTS
        with OuterRef(outer), usually)."""
        return []

    def sort_rows(
        self, resolved: Any, sort: str, comps: dict[str, RewardComponent]
    ) -> tuple[QuerySet, str]:
        """For a sort it serves: rows with `value` and `rollout_id` columns, in an index by
        value, and the path from them to the rollout's step (e.g. "rollout__step")."""
        raise NotImplementedError


_REGISTRY: dict[str, ExplorerFilter] = {}


def register(f: ExplorerFilter) -> ExplorerFilter:
    """Add a filter (from an AppConfig.ready()). Registering the same key again replaces it."""
    if not f.key:
        raise ValueError(f"{type(f).__name__} has no key")
    _REGISTRY[f.key] = f
    return f


def registered() -> tuple[ExplorerFilter, ...]:
    """The filters, in registration order (the order of INSTALLED_APPS)."""
    return tuple(_REGISTRY.values())


def range_exists(
    ranges: Ranges, scores: QuerySet, comps: dict[str, RewardComponent], outer: str
) -> list[Exists]:
    """One EXISTS per component range over `scores` (RewardScore, or one replay's ReplayScore
    rows) on the rollout id field `outer`."""
    out = []
    for name, (lo, hi) in ranges.items():
        sub = scores.filter(rollout_id=OuterRef(outer), component=comps[name])
        if lo is not None:
            sub = sub.filter(value__gte=lo)
        if hi is not None:
            sub = sub.filter(value__lte=hi)
        out.append(Exists(sub))
    return out

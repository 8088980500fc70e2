"""The replay filter of the explorer (registered from ReplaysConfig.ready()): a replay's values
sort and filter like a component's, sort=replay.<component> and min_/max_replay.<component> with
replay=<id>, served by the (replay, component, value, rollout) index."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Expression, QuerySet

from webapp.errors import FieldError
from webapp.explorer.filters import ExplorerFilter, Ranges, range_exists
from webapp.explorer.params import int_param, range_params, range_params_of
from webapp.replays.models import Replay, ReplayScore
from webapp.rollouts.models import RewardComponent
from webapp.runs.models import Run

PREFIX = "replay."
REQUIRED = f"required (a replay id) to sort or filter by {PREFIX}<component>"


@dataclass
class ReplayChoice:
    id: int | None
    ranges: Ranges = field(default_factory=dict)  # component -> (lo, hi) of the replay's values


class ReplayFilter(ExplorerFilter):
    key = "replay"
    sort_help = f"{PREFIX}<component> with replay=<id>"
    in_matching = False  # a replay is one run's: a behaviour spans runs

    def sorts(self, sort: str, components: list[str]) -> bool:
        return sort.startswith(PREFIX) and sort[len(PREFIX) :] in components

    def parse(self, params: Mapping[str, Any], components: list[str]) -> ReplayChoice | None:
        choice = ReplayChoice(
            int_param(params, "replay"), range_params_of(params, components, PREFIX)
        )
        sorted_by = self.sorts(params.get("sort") or "", components)
        if choice.id is None and (sorted_by or choice.ranges):
            raise FieldError("replay", REQUIRED)
        return choice if choice.id is not None else None

    def to_params(self, value: ReplayChoice) -> dict[str, str]:
        return {"replay": str(value.id), **range_params(value.ranges, PREFIX)}

    def resolve(self, run: Run, value: ReplayChoice | None, sort: str) -> tuple[Replay, Ranges]:
        """The replay, checked: one of this run's, with stored values for what the query uses."""
        if value is None or value.id is None:
            raise FieldError("replay", REQUIRED)
        used = set(value.ranges) | ({sort[len(PREFIX) :]} if sort.startswith(PREFIX) else set())
        replay = Replay.objects.filter(id=value.id, run=run).first()
        if replay is None:
            raise FieldError("replay", f"no replay {value.id} of this run")
        missing = sorted(used - set(replay.components()))
        if missing:
            raise FieldError(
                "replay",
                f"replay {replay.id} does not replay {missing[0]!r} "
                f"(it replays {', '.join(replay.components())})",
            )
        return replay, value.ranges

    def conditions(
        self, resolved: tuple[Replay, Ranges], outer: str, comps: dict[str, RewardComponent]
    ) -> list[Expression]:
        replay, ranges = resolved
        return list(range_exists(ranges, replay.scores.all(), comps, outer))

    def sort_rows(
        self, resolved: tuple[Replay, Ranges], sort: str, comps: dict[str, RewardComponent]
    ) -> tuple[QuerySet, str]:
        replay, _ = resolved
        rows = ReplayScore.objects.filter(replay=replay, component=comps[sort[len(PREFIX) :]])
        return rows, "rollout__step"  # ReplayScore carries no step

"""The annotation filters of the explorer (registered from AnnotationsConfig.ready()): label=<slug>
keeps the rollouts with an annotation of that label, annotated=1|0 those with any annotation or
none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Exists, Expression, OuterRef

from webapp.annotations.models import Label
from webapp.errors import FieldError
from webapp.explorer.filters import ExplorerFilter
from webapp.rollouts.models import RewardComponent, Rollout
from webapp.runs.models import Run


class LabelFilter(ExplorerFilter):
    key = "label"

    def parse(self, params: Mapping[str, Any], components: list[str]) -> str | None:
        return params.get("label") or None

    def to_params(self, value: str) -> dict[str, str]:
        return {"label": value}

    def resolve(self, run: Run, value: str, sort: str) -> str:
        if not Label.objects.filter(slug=value).exists():
            slugs = ", ".join(Label.objects.values_list("slug", flat=True))
            raise FieldError("label", f"no label {value[:60]!r}; labels are: {slugs}")
        return value

    def conditions(
        self, resolved: str, outer: str, comps: dict[str, RewardComponent]
    ) -> list[Expression]:
        return [
            Exists(Rollout.objects.filter(id=OuterRef(outer), annotations__label__slug=resolved))
        ]


class AnnotatedFilter(ExplorerFilter):
    key = "annotated"

    def parse(self, params: Mapping[str, Any], components: list[str]) -> bool | None:
        raw = params.get("annotated")
        return {"1": True, "yes": True, "0": False, "no": False}.get(raw) if raw else None

    def to_params(self, value: bool) -> dict[str, str]:
        return {"annotated": "1" if value else "0"}

    def conditions(
        self, resolved: bool, outer: str, comps: dict[str, RewardComponent]
    ) -> list[Expression]:
        any_ann = Exists(Rollout.objects.filter(id=OuterRef(outer), annotations__isnull=False))
        return [any_ann if resolved else ~any_ann]

"""The explorer query as the query string carries it: ExplorerQuery.from_params parses it (a
FieldError naming the parameter at the first bad one), ExplorerQuery.params writes it back for
links. Sorts: reward, advantage, length, step, any component, tokens.<summary>, and those the
registered filters serve (filters.py); filters: steps, split, zero-std groups, the search (q=),
component ranges (min_/max_<component>), token-summary ranges and the registered filters'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from webapp.errors import FieldError
from webapp.explorer.filters import Ranges, registered
from webapp.rollouts.text import SearchQuery, parse_query
from webapp.tokens.models import TOKEN_SORT_FIELDS

BUILTIN_SORTS = ("reward", "advantage", "length", "step")
# Sort=tokens.<summary>, min_/max_tokens.<summary>: a rollout's token summaries (RolloutTokens); a
# token sort lists the rollouts that carry tokens.
TOKEN_PREFIX = "tokens."
TOKEN_SORTS = tuple(TOKEN_PREFIX + f for f in TOKEN_SORT_FIELDS)
DEFAULT_LIMIT = 50
MAX_LIMIT = 500


@dataclass
class ExplorerQuery:
    sort: str = "reward"
    order: str = "desc"
    step_min: int | None = None
    step_max: int | None = None
    split: str | None = None
    zero_std_only: bool = False
    text: str = ""  # the search query as typed (q=)
    search: SearchQuery | None = None  # parsed from `text` (webapp/rollouts/text.py)
    ranges: Ranges = field(default_factory=dict)  # component -> (lo, hi)
    token_ranges: Ranges = field(default_factory=dict)
    # Registered filters' values (filters.py), by key: e.g. "label", "annotated", "replay".
    filters: dict[str, Any] = field(default_factory=dict)
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None

    def __post_init__(self) -> None:
        if self.text and self.search is None:
            self.search = parse_query(self.text)  # a FieldError naming q

    @classmethod
    def from_params(cls, params: Any, components: list[str]) -> ExplorerQuery:
        """Parse query-string params (a QueryDict or dict). Raises FieldError
        naming the parameter."""
        q = cls()
        q.sort = params.get("sort") or "reward"
        known = (*BUILTIN_SORTS, *TOKEN_SORTS, *components)
        if q.sort not in known and not any(f.sorts(q.sort, components) for f in registered()):
            helps = [f.sort_help for f in registered() if f.sort_help]
            raise FieldError("sort", "must be one of " + " or ".join([", ".join(known), *helps]))
        q.order = params.get("order") or "desc"
        if q.order not in ("asc", "desc"):
            raise FieldError("order", "must be asc or desc")
        q.step_min = int_param(params, "step_min")
        q.step_max = int_param(params, "step_max")
        q.split = params.get("split") or None
        if q.split not in (None, "train", "holdout"):
            raise FieldError("split", "must be train or holdout")
        q.zero_std_only = params.get("zero_std") in ("1", "true", "on")
        q.text = params.get("q") or ""
        q.__post_init__()  # parses the search: a FieldError naming q
        q.ranges = range_params_of(params, components, "")
        q.token_ranges = range_params_of(params, TOKEN_SORT_FIELDS, TOKEN_PREFIX)
        for f in registered():
            value = f.parse(params, components)
            if value is not None:
                q.filters[f.key] = value
        limit = int_param(params, "limit")
        q.limit = DEFAULT_LIMIT if limit is None else limit
        if not 1 <= q.limit <= MAX_LIMIT:
            raise FieldError("limit", f"must be between 1 and {MAX_LIMIT}")
        q.cursor = params.get("cursor") or None
        return q

    def params(self, **override: Any) -> dict[str, str]:
        """The query as URL parameters (so a link reproduces the view)."""
        out: dict[str, str] = {"sort": self.sort, "order": self.order}
        if self.step_min is not None:
            out["step_min"] = str(self.step_min)
        if self.step_max is not None:
            out["step_max"] = str(self.step_max)
        if self.split:
            out["split"] = self.split
        if self.zero_std_only:
            out["zero_std"] = "1"
        if self.text:
            out["q"] = self.text
        out.update(range_params(self.ranges, ""))
        for f in registered():
            if f.key in self.filters:
                out.update(f.to_params(self.filters[f.key]))
        out.update(range_params(self.token_ranges, TOKEN_PREFIX))
        if self.limit != DEFAULT_LIMIT:
            out["limit"] = str(self.limit)
        out.update({k: str(v) for k, v in override.items() if v is not None})
        return out

    def step_range(self, step_field: str) -> Q:
        """The step range on `step_field` (empty when there is none)."""
        cond = Q()
        if self.step_min is not None:
            cond &= Q(**{f"{step_field}__gte": self.step_min})
        if self.step_max is not None:
            cond &= Q(**{f"{step_field}__lte": self.step_max})
        return cond


def range_params_of(params: Any, names: Any, prefix: str) -> Ranges:
    """{name: (lo, hi)} from min_<prefix><name> / max_<prefix><name>, for the names given one."""
    out: Ranges = {}
    for name in names:
        lo, hi = (float_param(params, f"{end}_{prefix}{name}") for end in ("min", "max"))
        if lo is not None or hi is not None:
            out[name] = (lo, hi)
    return out


def range_params(ranges: Ranges, prefix: str) -> dict[str, str]:
    """min_<prefix><name> / max_<prefix><name> for each bound that is set."""
    out = {}
    for name, (lo, hi) in ranges.items():
        if lo is not None:
            out[f"min_{prefix}{name}"] = repr(lo)
        if hi is not None:
            out[f"max_{prefix}{name}"] = repr(hi)
    return out


def int_param(params: Any, name: str) -> int | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise FieldError(name, f"must be an integer, got {str(raw)[:40]!r}") from None


def float_param(params: Any, name: str) -> float | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise FieldError(name, f"must be a number, got {str(raw)[:40]!r}") from None
    if not math.isfinite(v):
        raise FieldError(name, "must be a finite number")
    return v

"""A page of the explorer: the run's rollouts sorted by any component, the aggregate reward, the
advantage, the length or a token summary (or a sort a registered filter serves, like a replay's
values), filtered, with keyset paging (paging.py). explore() returns model instances for the pages,
exports and queues; explore_values() plain dicts for the API; matching_rollouts() every match, for
behaviours. Searches go to the database's backend (search/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Exists, Expression, OuterRef, Q, QuerySet

from webapp.explorer.filters import ExplorerFilter, range_exists, registered
from webapp.explorer.paging import encode_cursor, keyset_fetch, per_step_fetch
from webapp.explorer.params import TOKEN_PREFIX, TOKEN_SORTS, ExplorerQuery
from webapp.explorer.search import backend
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, RewardScore, Rollout
from webapp.rollouts.text import SearchQuery
from webapp.runs.models import Run
from webapp.tokens.models import RolloutTokens


@dataclass
class ExplorerRow:
    # For a search, rollout.snippet_from and .snippet_text hold the text around the match (the
    # view layer marks it up: rollouts templatetags search_snippet).
    rollout: Rollout
    sort_value: float | None
    values: dict[str, float | None]  # every component's value (None: not scored / unscorable)
    group_std: float | None  # the group's within-group std of the sorted component (or reward)


@dataclass
class ExplorerPage:
    rows: list[ExplorerRow]
    next_cursor: str | None
    components: list[RewardComponent]


def _filters(q: ExplorerQuery, prefix: str, step_field: str = "step") -> Q:
    """Filters on Rollout fields; `prefix` is "" for a Rollout queryset, "rollout__" for
    RewardScore. `step_field`: Rollout and RewardScore carry step; ReplayScore does not
    ("rollout__step")."""
    cond = q.step_range(step_field)
    if q.split:
        cond &= Q(**{f"{prefix}split": q.split})
    if q.zero_std_only:
        cond &= Q(**{f"{prefix}group__zero_std": True})
    return cond


def _token_ranges(q: ExplorerQuery, outer: str) -> list[Exists]:
    """One EXISTS per token-summary range (min_/max_tokens.<summary>) on the rollout id `outer`."""
    out = []
    for name, (lo, hi) in q.token_ranges.items():
        sub = RolloutTokens.objects.filter(rollout_id=OuterRef(outer))
        if lo is not None:
            sub = sub.filter(**{f"{name}__gte": lo})
        if hi is not None:
            sub = sub.filter(**{f"{name}__lte": hi})
        out.append(Exists(sub))
    return out


def _resolved(
    run: Run, q: ExplorerQuery, comps: list[str], matching: bool = False
) -> list[tuple[ExplorerFilter, Any]]:
    """The query's registered filters, and the one serving its sort (its value None when the
    query has none), with their values checked against the run (FieldError)."""
    return [
        (f, f.resolve(run, q.filters.get(f.key), q.sort))
        for f in registered()
        if (f.key in q.filters or (f.sorts(q.sort, comps) and not matching))
        and (f.in_matching or not matching)
    ]


def _conditions(
    filters: list[tuple[ExplorerFilter, Any]], outer: str, comps: dict[str, RewardComponent]
) -> list[Expression]:
    return [c for f, resolved in filters for c in f.conditions(resolved, outer, comps)]


UNSORTED = object()


@dataclass
class _Source:
    """Where the query's sort values live: rows of `qs` with the value in `value_field` and the
    rollout id in `outer`; `prefix` and `step_field` lead from those rows to the rollout."""

    qs: QuerySet
    outer: str
    value_field: str
    prefix: str = "rollout__"
    step_field: str = "step"
    per_step: bool = False  # an index keyed (run, [component,] step, value, id) serves step tops


def _source(
    run: Run,
    q: ExplorerQuery,
    comps: dict[str, RewardComponent],
    filters: list[tuple[ExplorerFilter, Any]],
) -> _Source:
    sorter = next(((f, r) for f, r in filters if f.sorts(q.sort, list(comps))), None)
    if sorter is not None:  # a registered filter's rows (e.g. a replay's scores)
        qs, step_field = sorter[0].sort_rows(sorter[1], q.sort, comps)
        return _Source(qs, "rollout_id", "value", step_field=step_field)
    if q.sort in comps:
        qs = RewardScore.objects.filter(run=run, component=comps[q.sort])
        return _Source(qs, "rollout_id", "value", per_step=True)
    if q.sort in TOKEN_SORTS:  # the (run, <summary>, rollout) index of RolloutTokens
        qs = RolloutTokens.objects.filter(run=run)
        return _Source(qs, "rollout_id", q.sort[len(TOKEN_PREFIX) :])
    qs = Rollout.objects.filter(run=run)
    return _Source(qs, "id", q.sort, prefix="", per_step=q.sort != "step")


def sort_value(
    run: Run, q: ExplorerQuery, comps_list: list[RewardComponent], rollout: Rollout
) -> Any:
    """The rollout's value under the query's sort, read where the listing reads it; UNSORTED when
    the rollout has none (so it is not in that listing). Raises FieldError as explore does."""
    comps = {c.name: c for c in comps_list}
    src = _source(run, q, comps, _resolved(run, q, list(comps)))
    if src.outer == "id":
        return getattr(rollout, src.value_field)  # a column of the rollout at hand
    rows = src.qs.filter(**{src.outer: rollout.id}).values_list(src.value_field, flat=True)
    found = list(rows[:1])
    return found[0] if found else UNSORTED


def _page_hits(
    run: Run, q: ExplorerQuery, comps_list: list[RewardComponent]
) -> tuple[list[tuple[int, Any]], str | None]:
    """The page's (rollout id, sort value) in keyset order, and the next page's cursor."""
    comps = {c.name: c for c in comps_list}
    filters = _resolved(run, q, list(comps))
    src = _source(run, q, comps, filters)
    qs = src.qs.filter(_filters(q, src.prefix, step_field=src.step_field))
    outer, value_field = src.outer, src.value_field
    for ex in [
        *range_exists(q.ranges, RewardScore.objects.all(), comps, outer),
        *_token_ranges(q, outer),
        *_conditions(filters, outer, comps),
    ]:
        qs = qs.filter(ex)
    search = backend()
    steps = search.range_steps(run, q) if src.per_step and q.search is None else None
    if steps is not None:
        hits = per_step_fetch(qs, value_field, outer, q.order, q.cursor, q.limit + 1, steps)
    elif q.search is None:
        hits = keyset_fetch(qs, value_field, outer, q.order, q.cursor, q.limit + 1)
    else:
        hits = search.search_page(run, qs, value_field, outer, q)
    more = len(hits) > q.limit
    hits = hits[: q.limit]
    next_cursor = encode_cursor(hits[-1][1], hits[-1][0]) if more and hits else None
    return hits, next_cursor


def explore(
    run: Run, q: ExplorerQuery, components: list[RewardComponent] | None = None
) -> ExplorerPage:
    """A page of the run's rollouts as model instances (the explorer page, exports, queues).
    `components`: the run's, when the caller has read them already (run.components())."""
    comps_list = run.components() if components is None else components
    hits, next_cursor = _page_hits(run, q, comps_list)
    sorted_comp = next((c for c in comps_list if c.name == q.sort), None)
    rows = _hydrate(hits, comps_list, sorted_comp, q.search)
    return ExplorerPage(rows=rows, next_cursor=next_cursor, components=comps_list)


# The rollout columns of explore_values' rows, in the API's order.
VALUE_FIELDS = (
    "id",
    "step",
    "group_id",
    "index",
    "split",
    "reward",
    "advantage",
    "length",
    "completion",
)


def explore_values(
    run: Run, q: ExplorerQuery, components: list[RewardComponent]
) -> tuple[list[dict[str, Any]], str | None]:
    """The page explore() reads, as plain dicts for the API (no model instances, no snippet): each
    row holds VALUE_FIELDS, then rewards (component -> value), group_std and sort_value; and the
    next page's cursor. After the keyset walk, two queries whatever the page size."""
    hits, next_cursor = _page_hits(run, q, components)
    sorted_comp = next((c for c in components if c.name == q.sort), None)
    ids = [h[0] for h in hits]
    by_id = _page_rows(ids, sorted_comp)
    values = _component_values(ids, components)
    rows = []
    for rid, v in hits:
        if rid in by_id:  # else deleted since the keyset walk read it
            fields, std = by_id[rid]
            rows.append({**fields, "rewards": values[rid], "group_std": std, "sort_value": v})
    return rows, next_cursor


# The page's rows and scores are read by hand-written SQL: through the ORM, building and compiling
# the two queries cost ~1.5 ms of CPU a page (most of an API read's own), this ~0.2 ms. Names come
# from the models' metadata; values are parameters.
def _page_rows(
    ids: list[int], sorted_comp: RewardComponent | None
) -> dict[int, tuple[dict[str, Any], float | None]]:
    """{id: (VALUE_FIELDS, group std)} of the rollouts `ids`: the group's std of the sorted
    component (GroupComponentStat), or of the reward when the sort is not a component."""
    if not ids:
        return {}
    qn = connection.ops.quote_name
    meta = Rollout._meta
    cols = ", ".join(f"r.{qn(meta.get_field(f).column)}" for f in VALUE_FIELDS)
    # A subquery per row (an index lookup each), not a join: with a join the planner hashed a
    # sequential scan of the whole stats table for the page's 50 rows (1.5 ms at 20k rollouts).
    params: list[Any] = []
    if sorted_comp is not None:  # (group, component) is unique: one row at most
        std = f"SELECT s.std FROM {GroupComponentStat._meta.db_table} s "
        std += "WHERE s.group_id = r.group_id AND s.component_id = %s"
        params.append(sorted_comp.id)
    else:
        std = f"SELECT g.reward_std FROM {Group._meta.db_table} g WHERE g.id = r.group_id"
    marks = ", ".join(["%s"] * len(ids))
    sql = f"SELECT {cols}, ({std}) FROM {meta.db_table} r WHERE r.id IN ({marks})"
    with connection.cursor() as cur:
        cur.execute(sql, [*params, *ids])
        rows = cur.fetchall()  # one call: iterating the cursor costs a call per row
    return {row[0]: (dict(zip(VALUE_FIELDS, row[:-1], strict=True)), row[-1]) for row in rows}


def _component_values(
    ids: list[int], comps: list[RewardComponent]
) -> dict[int, dict[str, float | None]]:
    """{rollout id: {component: value}} for the rollouts `ids` (a component the rollout has no
    score for is absent), in one query."""
    values: dict[int, dict[str, float | None]] = {i: {} for i in ids}
    if not ids:
        return values
    names = {c.id: c.name for c in comps}
    sql = (
        f"SELECT rollout_id, component_id, value FROM {RewardScore._meta.db_table} "
        f"WHERE rollout_id IN ({', '.join(['%s'] * len(ids))})"
    )
    with connection.cursor() as cur:
        cur.execute(sql, ids)
        scores = cur.fetchall()
    for rid, cid, v in scores:
        values[rid][names.get(cid, str(cid))] = v
    return values


def _hydrate(
    hits: list[tuple[int, Any]],
    comps: list[RewardComponent],
    sorted_comp: RewardComponent | None,
    search: SearchQuery | None = None,
) -> list[ExplorerRow]:
    ids = [h[0] for h in hits]
    by_id = backend().list_rollouts(ids, search)
    values = _component_values(ids, comps)
    group_ids = {r.group_id for r in by_id.values()}
    stds: dict[int, float | None] = {}
    if sorted_comp is not None:
        stds = dict(
            GroupComponentStat.objects.filter(
                group_id__in=group_ids, component=sorted_comp
            ).values_list("group_id", "std")
        )
    else:
        stds = dict(Group.objects.filter(id__in=group_ids).values_list("id", "reward_std"))
    return [
        ExplorerRow(
            rollout=by_id[rid],
            sort_value=v,
            values=values[rid],
            group_std=stds.get(by_id[rid].group_id),
        )
        for rid, v in hits
        if rid in by_id
    ]


def matching_rollouts(
    run: Run, q: ExplorerQuery, components: list[RewardComponent]
) -> list[QuerySet]:
    """Every rollout of the run that the query's filters and search hold (its sort, order, cursor,
    limit, token ranges and the filters not `in_matching`, such as a replay, ignored), as disjoint
    Rollout querysets whose union is the answer (a behaviour, webapp/behaviours, counts them per
    step). The same search as the pages (the backend's matching)."""
    comps = {c.name: c for c in components}
    base = Rollout.objects.filter(run=run).filter(_filters(q, ""))
    for ex in [
        *range_exists(q.ranges, RewardScore.objects.all(), comps, "id"),
        *_conditions(_resolved(run, q, list(comps), matching=True), "id", comps),
    ]:
        base = base.filter(ex)
    if q.search is None:
        return [base]
    return backend().matching(run, base, q.search)

"""The explorer query, shared by the API and the pages: rollouts of a run sorted by any component,
the aggregate reward, the advantage or the length, filtered, with keyset pagination. A reward replay's
values (webapp/replays) sort and filter like a component's: sort=replay.<component>, min_/max_replay.<component>,
replay=<id>, served by the (replay, component, value, rollout) index.

Keyset order is (value, id) with NULL treated as larger than every number: ascending puts NULLs last,
descending puts them first. That is Postgres's native B-tree order, so both directions are a plain
forward or backward scan of the (run, component, value, rollout) or (run, field, id) index.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import BigIntegerField, Exists, F, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Cast, Greatest, Length, StrIndex, Substr, Upper
from django.utils.safestring import SafeString

from webapp.errors import FieldError
from webapp.rollouts.models import GroupComponentStat, RewardComponent, RewardScore, Rollout
from webapp.rollouts.text import SNIPPET_BEFORE, SNIPPET_CHARS, SearchQuery, highlight, parse_query
from webapp.runs.models import Run

BUILTIN_SORTS = ("reward", "advantage", "length", "step")
REPLAY_PREFIX = "replay."  # sort=replay.<component>, min_/max_replay.<component>: a replay's values (replay=<id>)
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
    ranges: dict[str, tuple[float | None, float | None]] = field(
        default_factory=dict
    )  # component -> (lo, hi)
    label: str | None = None  # annotation label slug
    annotated: bool | None = None
    replay: int | None = None  # a replay of the run: its values sort and filter like a component's
    replay_ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    limit: int = 50
    cursor: str | None = None

    def __post_init__(self) -> None:
        if self.text and self.search is None:
            self.search = parse_query(self.text)  # a FieldError naming q

    @classmethod
    def from_params(cls, params: Any, components: list[str]) -> ExplorerQuery:
        """Parse query-string params (a QueryDict or dict). Raises FieldError naming the parameter."""
        q = cls()
        q.sort = params.get("sort") or "reward"
        replayed = q.sort.startswith(REPLAY_PREFIX) and q.sort[len(REPLAY_PREFIX) :] in components
        if q.sort not in BUILTIN_SORTS and q.sort not in components and not replayed:
            raise FieldError(
                "sort",
                f"must be one of {', '.join([*BUILTIN_SORTS, *components])} "
                f"or {REPLAY_PREFIX}<component> with replay=<id>",
            )
        q.order = params.get("order") or "desc"
        if q.order not in ("asc", "desc"):
            raise FieldError("order", "must be asc or desc")
        q.step_min = _int_param(params, "step_min")
        q.step_max = _int_param(params, "step_max")
        q.split = params.get("split") or None
        if q.split not in (None, "train", "holdout"):
            raise FieldError("split", "must be train or holdout")
        q.zero_std_only = params.get("zero_std") in ("1", "true", "on")
        q.text = params.get("q") or ""
        q.__post_init__()  # parses the search: a FieldError naming q
        for name in components:
            lo, hi = _float_param(params, f"min_{name}"), _float_param(params, f"max_{name}")
            if lo is not None or hi is not None:
                q.ranges[name] = (lo, hi)
            lo, hi = (
                _float_param(params, f"{end}_{REPLAY_PREFIX}{name}") for end in ("min", "max")
            )
            if lo is not None or hi is not None:
                q.replay_ranges[name] = (lo, hi)
        q.replay = _int_param(params, "replay")
        if q.replay is None and (replayed or q.replay_ranges):
            raise FieldError(
                "replay", f"required (a replay id) to sort or filter by {REPLAY_PREFIX}<component>"
            )
        q.label = params.get("label") or None
        ann = params.get("annotated")
        q.annotated = {"1": True, "yes": True, "0": False, "no": False}.get(ann) if ann else None
        limit = _int_param(params, "limit")
        q.limit = 50 if limit is None else limit
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
        for name, (lo, hi) in self.ranges.items():
            if lo is not None:
                out[f"min_{name}"] = repr(lo)
            if hi is not None:
                out[f"max_{name}"] = repr(hi)
        if self.label:
            out["label"] = self.label
        if self.annotated is not None:
            out["annotated"] = "1" if self.annotated else "0"
        if self.replay is not None:
            out["replay"] = str(self.replay)
        for name, (lo, hi) in self.replay_ranges.items():
            if lo is not None:
                out[f"min_{REPLAY_PREFIX}{name}"] = repr(lo)
            if hi is not None:
                out[f"max_{REPLAY_PREFIX}{name}"] = repr(hi)
        if self.limit != 50:
            out["limit"] = str(self.limit)
        out.update({k: str(v) for k, v in override.items() if v is not None})
        return out


def _int_param(params: Any, name: str) -> int | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise FieldError(name, f"must be an integer, got {str(raw)[:40]!r}") from None


def _float_param(params: Any, name: str) -> float | None:
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


def encode_cursor(value: float | int | None, row_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([value, row_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float | None, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, row_id = json.loads(raw)
        if (value is not None and not isinstance(value, (int, float))) or not isinstance(
            row_id, int
        ):
            raise ValueError
        return value, row_id
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise FieldError("cursor", "is not a cursor this server issued") from None


def keyset_fetch(
    qs: QuerySet, value_field: str, id_field: str, order: str, cursor: str | None, limit: int
) -> list[tuple[int, Any]]:
    """Up to `limit` (id, value) rows after `cursor` in keyset order.

    NULLs form their own segment (last ascending, first descending), fetched by a separate query:
    one `value > v OR (value = v AND id > last)` predicate mixed with `IS NULL` would make Postgres
    scan the index from its start, so every page would cost as much as OFFSET. Each segment's
    predicate carries the redundant bound `value >= v` (or `<=`) that lets the scan start at the cursor.
    """
    asc = order == "asc"
    vf, idf = value_field, id_field
    segments = ["value", "null"] if asc else ["null", "value"]
    start_segment, v, last = segments[0], None, None
    if cursor:
        v, last = decode_cursor(cursor)
        start_segment = "null" if v is None else "value"
    rows: list[tuple[int, Any]] = []
    for seg in segments[segments.index(start_segment) :]:
        at_cursor = cursor is not None and seg == start_segment
        if seg == "null":
            part = qs.filter(**{f"{vf}__isnull": True})
            if at_cursor:
                part = part.filter(**{f"{idf}__gt" if asc else f"{idf}__lt": last})
            part = part.order_by(idf if asc else f"-{idf}")
        else:
            part = qs.filter(**{f"{vf}__isnull": False})
            if at_cursor and asc:
                part = part.filter(**{f"{vf}__gte": v}).filter(
                    Q(**{f"{vf}__gt": v}) | Q(**{f"{idf}__gt": last})
                )
            elif at_cursor:
                part = part.filter(**{f"{vf}__lte": v}).filter(
                    Q(**{f"{vf}__lt": v}) | Q(**{f"{idf}__lt": last})
                )
            part = part.order_by(vf, idf) if asc else part.order_by(f"-{vf}", f"-{idf}")
        rows += list(part.values_list(idf, vf)[: limit - len(rows)])
        if len(rows) >= limit:
            break
    return rows


@dataclass
class ExplorerRow:
    rollout: Rollout
    sort_value: float | None
    values: dict[str, float | None]  # every component's value (None: not scored / unscorable)
    group_std: (
        float | None
    )  # the group's within-group std of the sorted component (or of the reward)
    snippet: SafeString | None = None  # search only: escaped text around the match, terms in <mark>


@dataclass
class ExplorerPage:
    rows: list[ExplorerRow]
    next_cursor: str | None
    components: list[RewardComponent]


SEARCH_PROBE = (
    300  # a search matching at most this many of a run's rollouts is answered from their ids
)


def _search_q(search: SearchQuery, prefix: str) -> Q:
    """Case-insensitive substrings of the whole rollout's search text. Postgres: UPPER(...) LIKE, which the
    trigram GIN index on UPPER(search_text) serves; SQLite: a scan (the demo's size)."""
    cond = Q()
    for term in search.include:
        cond &= Q(**{f"{prefix}search_text__icontains": term})
    for term in search.exclude:
        cond &= ~Q(**{f"{prefix}search_text__icontains": term})
    return cond


@contextlib.contextmanager
def _plan(**settings: str) -> Iterator[None]:
    """Postgres: planner settings for the queries inside (SET LOCAL, undone at the transaction's end)."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(), connection.cursor() as cur:
        # Plans priced past a disabled node cross jit_above_cost: half a second compiling a 5 ms query.
        cur.execute("SET LOCAL jit = off")
        for name, value in settings.items():
            cur.execute(
                f"SET LOCAL {name} = {value}"
            )  # names and values are ours, never the request's
        yield


def _probe(run: Run, search: SearchQuery) -> list[int] | None:
    """The ids of the run's rollouts that match, when there are at most SEARCH_PROBE; None when more.

    Postgres cannot estimate how many rows a LIKE on long text matches (ANALYZE skips values over 1 KB),
    so it guesses "few" and rechecks every trigram candidate even for a word in half the run (1.2 s at 6,000
    rows). We find out: the trigram index alone (bitmap scans only) stops after SEARCH_PROBE + 1 hits.
    Few hits: the page query filters on their ids. Many: _walk checks rows in sort order until the page
    is full, a few rows per hit. The index leads with run_id (btree_gin), so other runs cost nothing."""
    # run_id as bigint: btree_gin has no int8 = int4 operator, and an int4 literal leaves run_id out of
    # the index condition (2.2 s instead of 0.5 ms for a word common in another run).
    run_id = Cast(Value(run.id), BigIntegerField())
    with _plan(enable_seqscan="off", enable_indexscan="off"):
        ids = list(
            Rollout.objects.filter(run_id=run_id)
            .filter(_search_q(search, ""))
            .values_list("id", flat=True)[: SEARCH_PROBE + 1]
        )
    return ids if len(ids) <= SEARCH_PROBE else None


WALK_FIRST, WALK_MAX = (
    100,
    3000,
)  # rows checked per round of _walk: doubling from the first to the last


def _walk(
    qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery, search: SearchQuery | None
) -> list[tuple[int, Any]]:
    """keyset_fetch of q.limit + 1 rows; with `search`, rows in keyset order are fetched without it, in
    rounds, and kept when their rollout matches: the plan cannot turn into a recheck of every hit."""
    if search is None:
        return keyset_fetch(qs, value_field, id_field, q.order, q.cursor, q.limit + 1)
    hits: list[tuple[int, Any]] = []
    cursor, n = q.cursor, WALK_FIRST
    while len(hits) <= q.limit:
        chunk = keyset_fetch(qs, value_field, id_field, q.order, cursor, n)
        with _plan(
            enable_bitmapscan="off", enable_seqscan="off"
        ):  # by primary key, never the trigram index
            found = set(
                Rollout.objects.filter(id__in=[c[0] for c in chunk])
                .filter(_search_q(search, ""))
                .values_list("id", flat=True)
            )
        hits += [c for c in chunk if c[0] in found]
        if len(chunk) < n:
            break
        cursor, n = encode_cursor(chunk[-1][1], chunk[-1][0]), min(2 * n, WALK_MAX)
    return hits[: q.limit + 1]


def _filters(
    run: Run,
    q: ExplorerQuery,
    comps: dict[str, RewardComponent],
    prefix: str,
    matched: list[int] | None = None,
    step_field: str = "step",
) -> Q:
    """Filters on Rollout fields; `prefix` is "" for a Rollout queryset, "rollout__" for RewardScore.
    `matched`: the search's hits when _probe found few (else _walk checks the search row by row).
    `step_field`: Rollout and RewardScore carry step; ReplayScore does not ("rollout__step")."""
    cond = Q()
    if q.step_min is not None:
        cond &= Q(**{f"{step_field}__gte": q.step_min})
    if q.step_max is not None:
        cond &= Q(**{f"{step_field}__lte": q.step_max})
    if q.split:
        cond &= Q(**{f"{prefix}split": q.split})
    if q.zero_std_only:
        cond &= Q(**{f"{prefix}group__zero_std": True})
    if matched is not None:
        cond &= Q(**{f"{prefix}id__in": matched})
    return cond


def _range_exists(
    ranges: dict[str, tuple[float | None, float | None]],
    scores: QuerySet,
    comps: dict[str, RewardComponent],
    outer: str,
) -> list[Exists]:
    """One EXISTS per component range over `scores` (RewardScore, or one replay's ReplayScore rows)."""
    out = []
    for name, (lo, hi) in ranges.items():
        sub = scores.filter(rollout_id=OuterRef(outer), component=comps[name])
        if lo is not None:
            sub = sub.filter(value__gte=lo)
        if hi is not None:
            sub = sub.filter(value__lte=hi)
        out.append(Exists(sub))
    return out


def _replay(run: Run, q: ExplorerQuery) -> Any:
    """The query's replay, checked: one of this run's, with stored values for what the query uses."""
    from webapp.replays.models import Replay  # replays build on rollouts, not the other way round

    used = set(q.replay_ranges) | (
        {q.sort[len(REPLAY_PREFIX) :]} if q.sort.startswith(REPLAY_PREFIX) else set()
    )
    if q.replay is None:
        if used:
            raise FieldError(
                "replay", f"required (a replay id) to sort or filter by {REPLAY_PREFIX}<component>"
            )
        return None
    replay = Replay.objects.filter(id=q.replay, run=run).first()
    if replay is None:
        raise FieldError("replay", f"no replay {q.replay} of this run")
    missing = sorted(used - set(replay.components()))
    if missing:
        raise FieldError(
            "replay",
            f"replay {replay.id} does not replay {missing[0]!r} "
            f"(it replays {', '.join(replay.components())})",
        )
    return replay


def _annotation_filters(q: ExplorerQuery, outer: str) -> list[Exists]:
    """The label / annotated filters on the rollout id field `outer`, through Rollout.annotations."""
    out = []
    if q.label:
        from webapp.annotations.models import Label

        if not Label.objects.filter(slug=q.label).exists():
            slugs = ", ".join(Label.objects.values_list("slug", flat=True))
            raise FieldError("label", f"no label {q.label[:60]!r}; labels are: {slugs}")
        out.append(
            Exists(Rollout.objects.filter(id=OuterRef(outer), annotations__label__slug=q.label))
        )
    if q.annotated is not None:
        any_ann = Exists(Rollout.objects.filter(id=OuterRef(outer), annotations__isnull=False))
        out.append(any_ann if q.annotated else ~any_ann)
    return out


def explore(run: Run, q: ExplorerQuery) -> ExplorerPage:
    comps_list = run.components()
    comps = {c.name: c for c in comps_list}
    matched = _probe(run, q.search) if q.search is not None else None
    # Many hits: walk the sort order and check rows as they come (a bitmap would recheck every hit).
    walk = q.search if q.search is not None and matched is None else None
    replay = _replay(run, q)
    if replay is not None and q.sort.startswith(REPLAY_PREFIX):
        from webapp.replays.models import (
            ReplayScore,
        )  # the (replay, component, value, rollout) index

        qs = ReplayScore.objects.filter(
            replay=replay, component=comps[q.sort[len(REPLAY_PREFIX) :]]
        )
        qs = qs.filter(_filters(run, q, comps, "rollout__", matched, step_field="rollout__step"))
        outer = "rollout_id"
    elif q.sort in comps:
        qs = RewardScore.objects.filter(run=run, component=comps[q.sort])
        qs = qs.filter(_filters(run, q, comps, "rollout__", matched))
        outer = "rollout_id"
    else:
        qs = Rollout.objects.filter(run=run).filter(_filters(run, q, comps, "", matched))
        outer = "id"
    replay_ranges = (
        _range_exists(q.replay_ranges, replay.scores.all(), comps, outer) if replay else []
    )
    for ex in [
        *_range_exists(q.ranges, RewardScore.objects.all(), comps, outer),
        *replay_ranges,
        *_annotation_filters(q, outer),
    ]:
        qs = qs.filter(ex)
    hits = _walk(qs, "value" if outer == "rollout_id" else q.sort, outer, q, walk)
    more = len(hits) > q.limit
    hits = hits[: q.limit]
    rows = _hydrate(hits, comps_list, comps.get(q.sort), q.search)
    next_cursor = encode_cursor(hits[-1][1], hits[-1][0]) if more and hits else None
    return ExplorerPage(rows=rows, next_cursor=next_cursor, components=comps_list)


def _list_rollouts(ids: list[int], search: SearchQuery | None) -> dict[int, Rollout]:
    """The page's rollouts with the list columns only (never transcript, state or search text); for a
    search, the database cuts a snippet around the first match of the most specific term."""
    qs = Rollout.objects.only(*Rollout.LIST_FIELDS)
    if search is not None:
        pos = StrIndex(Upper("search_text"), Value(search.first.upper()))
        qs = (
            qs.annotate(match_at=pos, doc_chars=Length("search_text"))
            .annotate(
                snippet_from=Greatest(F("match_at") - SNIPPET_BEFORE, Value(1)),
            )
            .annotate(snippet_text=Substr("search_text", F("snippet_from"), SNIPPET_CHARS))
        )
    return qs.in_bulk(ids)


def _snippet(r: Rollout, search: SearchQuery | None) -> SafeString | None:
    if search is None:
        return None
    return highlight(
        r.snippet_text, search, r.snippet_from > 1, r.snippet_from + SNIPPET_CHARS - 1 < r.doc_chars
    )


def _hydrate(
    hits: list[tuple[int, Any]],
    comps: list[RewardComponent],
    sorted_comp: RewardComponent | None,
    search: SearchQuery | None = None,
) -> list[ExplorerRow]:
    ids = [h[0] for h in hits]
    by_id = _list_rollouts(ids, search)
    values: dict[int, dict[str, float | None]] = {i: {} for i in ids}
    names = {c.id: c.name for c in comps}
    scores = RewardScore.objects.filter(rollout_id__in=ids).values_list(
        "rollout_id", "component_id", "value"
    )
    for rid, cid, v in scores:
        values[rid][names.get(cid, str(cid))] = v
    group_ids = {r.group_id for r in by_id.values()}
    stds: dict[int, float | None] = {}
    if sorted_comp is not None:
        stds = dict(
            GroupComponentStat.objects.filter(
                group_id__in=group_ids, component=sorted_comp
            ).values_list("group_id", "std")
        )
    else:
        from webapp.rollouts.models import Group

        stds = dict(Group.objects.filter(id__in=group_ids).values_list("id", "reward_std"))
    return [
        ExplorerRow(
            rollout=by_id[rid],
            sort_value=v,
            values=values[rid],
            group_std=stds.get(by_id[rid].group_id),
            snippet=_snippet(by_id[rid], search),
        )
        for rid, v in hits
        if rid in by_id
    ]

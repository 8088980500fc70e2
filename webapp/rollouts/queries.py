"""The explorer query, shared by the API and the pages: rollouts of a run sorted by any component,
the aggregate reward, the advantage or the length, filtered, with keyset pagination. A reward
replay's values (webapp/replays) sort and filter like a component's: sort=replay.<component>,
min_/max_replay.<component>, replay=<id>, served by the (replay, component, value, rollout) index.

Keyset order is (value, id) with NULL treated as larger than every number: ascending puts NULLs
last, descending puts them first. That is Postgres's native B-tree order, so both directions are a
plain forward or backward scan of the (run, component, value, rollout) or (run, field, id) index.
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
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Exists,
    ExpressionWrapper,
    F,
    Field,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.expressions import OrderBy, RawSQL
from django.db.models.functions import Cast, Greatest, StrIndex, Substr, Upper
from django.utils.safestring import SafeString

from webapp.errors import FieldError
from webapp.rollouts import text
from webapp.rollouts.models import (
    Group,
    GroupComponentStat,
    RewardComponent,
    RewardScore,
    Rollout,
    StepStat,
)
from webapp.rollouts.text import SNIPPET_BEFORE, SNIPPET_CHARS, SearchQuery, highlight, parse_query
from webapp.runs.models import Run
from webapp.tokens.models import TOKEN_SORT_FIELDS, RolloutTokens

BUILTIN_SORTS = ("reward", "advantage", "length", "step")
# Sort=replay.<component>, min_/max_replay.<component>: a replay's values (replay=<id>)
REPLAY_PREFIX = "replay."
# Sort=tokens.<summary>, min_/max_tokens.<summary>: a rollout's token summaries (RolloutTokens); a
# token sort lists the rollouts that carry tokens.
TOKEN_PREFIX = "tokens."
TOKEN_SORTS = tuple(TOKEN_PREFIX + f for f in TOKEN_SORT_FIELDS)
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
    token_ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    limit: int = 50
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
        replayed = q.sort.startswith(REPLAY_PREFIX) and q.sort[len(REPLAY_PREFIX) :] in components
        known = (*BUILTIN_SORTS, *TOKEN_SORTS, *components)
        if q.sort not in known and not replayed:
            raise FieldError(
                "sort",
                f"must be one of {', '.join(known)} or {REPLAY_PREFIX}<component> with replay=<id>",
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
        for name in TOKEN_SORT_FIELDS:
            lo, hi = (_float_param(params, f"{end}_{TOKEN_PREFIX}{name}") for end in ("min", "max"))
            if lo is not None or hi is not None:
                q.token_ranges[name] = (lo, hi)
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
        out.update(_range_params(self.ranges, ""))
        if self.label:
            out["label"] = self.label
        if self.annotated is not None:
            out["annotated"] = "1" if self.annotated else "0"
        if self.replay is not None:
            out["replay"] = str(self.replay)
        out.update(_range_params(self.replay_ranges, REPLAY_PREFIX))
        out.update(_range_params(self.token_ranges, TOKEN_PREFIX))
        if self.limit != 50:
            out["limit"] = str(self.limit)
        out.update({k: str(v) for k, v in override.items() if v is not None})
        return out


def _range_params(
    ranges: dict[str, tuple[float | None, float | None]], prefix: str
) -> dict[str, str]:
    """min_<prefix><name> / max_<prefix><name> for each bound that is set."""
    out = {}
    for name, (lo, hi) in ranges.items():
        if lo is not None:
            out[f"min_{prefix}{name}"] = repr(lo)
        if hi is not None:
            out[f"max_{prefix}{name}"] = repr(hi)
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
    qs: QuerySet,
    value_field: str,
    id_field: str,
    order: str,
    cursor: str | None,
    limit: int,
    by_index: bool = True,
) -> list[tuple[int, Any]]:
    """Up to `limit` (id, value) rows after `cursor` in keyset order.

    NULLs form their own segment (last ascending, first descending), fetched by a separate query:
    one `value > v OR (value = v AND id > last)` predicate mixed with `IS NULL` would make
    Postgres scan the index from its start, so every page would cost as much as OFFSET. Each
    segment's predicate carries the redundant bound `value >= v` (or `<=`) that lets the scan
    start at the cursor. by_index=False orders by `value + 0, id + 0`, which no index serves: the
    rows are found by the filters' index (a step range's, _range_first) and the top of them sorted.
    """
    asc = order == "asc"
    vf, idf = value_field, id_field

    def key(name: str, kind: type[Field]) -> OrderBy:
        expr = F(name) if by_index else ExpressionWrapper(F(name) + Value(0), output_field=kind())
        return expr.asc() if asc else expr.desc()

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
            part = part.order_by(key(idf, BigIntegerField))
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
            part = part.order_by(key(vf, FloatField), key(idf, BigIntegerField))
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


SEARCH_PROBE = 300  # hits always fetched outright, whatever the run's size (the index's candidates)


def _search_q(search: SearchQuery, prefix: str) -> Q:
    """Case-insensitive substrings of the whole rollout's search text. Postgres: UPPER(...) LIKE,
    which the trigram GIN index on UPPER(search_text) serves; SQLite: a scan (the demo's size)."""
    cond = Q()
    for term in search.include:
        cond &= Q(**{f"{prefix}search_text__icontains": term})
    for term in search.exclude:
        cond &= ~Q(**{f"{prefix}search_text__icontains": term})
    return cond


@contextlib.contextmanager
def _plan(**settings: str) -> Iterator[None]:
    """Postgres: planner settings for the queries inside (SET LOCAL, undone at
    the transaction's end)."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(), connection.cursor() as cur:
        # Plans priced past a disabled node cross jit_above_cost: half a second compiling a
        # 5 ms query.
        cur.execute("SET LOCAL jit = off")
        for name, value in settings.items():
            cur.execute(
                f"SET LOCAL {name} = {value}"
            )  # names and values are ours, never the request's
        yield


def _run_search(run: Run, search: SearchQuery) -> QuerySet:
    # run_id as bigint: btree_gin has no int8 = int4 operator, and an int4 literal leaves run_id out
    # of the index condition (2.2 s instead of 0.5 ms for a word common in another run).
    run_id = Cast(Value(run.id), BigIntegerField())
    return Rollout.objects.filter(run_id=run_id).filter(_search_q(search, ""))


def _candidates(run: Run, search: SearchQuery) -> int | None:
    """How many of the run's rollouts the trigram index offers for the search's words, before any is
    rechecked against its text; None off Postgres. Postgres cannot estimate a LIKE on long text
    (ANALYZE skips values over 1 KB), and a recheck costs a detoast and an UPPER of the whole
    document (~0.1-0.3 ms at 11 KB): counting the hits themselves would cost as much as fetching
    them. The index's own count comes from running its bitmap scan once, under EXPLAIN ANALYZE with
    LIMIT 1 (the bitmap is built whole before the first row is read; the heap is then read only up
    to the first hit). The count is an upper bound of the hits; for words of 3+ characters the two
    are nearly always equal."""
    if connection.vendor != "postgresql":
        return None
    sql, params = _run_search(run, search).values("id")[:1].query.sql_with_params()
    with _plan(enable_seqscan="off", enable_indexscan="off"), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    # None when the planner read another index (a table too small for the trigram index to pay).
    return max(_index_rows(plan[0]["Plan"]), default=None)


SEARCH_INDEX = (
    "rollout_search_run_trgm"  # migration 0008: GIN (run_id, UPPER(search_text) gin_trgm_ops)
)


def _index_rows(node: dict[str, Any], index: str = SEARCH_INDEX) -> Iterator[int]:
    """Actual rows of an index's bitmap scans in an EXPLAIN (ANALYZE, FORMAT JSON) plan."""
    if node.get("Node Type") == "Bitmap Index Scan" and node.get("Index Name") == index:
        yield int(node.get("Actual Rows", 0))
    for child in node.get("Plans", ()):
        yield from _index_rows(child, index)


def _run_size(run: Run) -> int:
    """The run's rollouts, from the per-step statistics ingestion keeps (one row per step)."""
    total = StepStat.objects.filter(run=run, component_id=0).aggregate(n=Sum("n_rollouts"))["n"]
    return int(total or 0)


def _fetch_hits(run: Run, search: SearchQuery, cap: int | None = None) -> list[int]:
    """The ids of the run's matching rollouts (up to cap + 1), through the trigram index alone."""
    with _plan(enable_seqscan="off", enable_indexscan="off"):
        ids = _run_search(run, search).values_list("id", flat=True)
        return list(ids if cap is None else ids[: cap + 1])


def _probe(
    run: Run, search: SearchQuery, limit: int = 50, size: int | None = None
) -> tuple[list[int] | None, int | None]:
    """(ids, None) when fetching every hit is the cheaper plan; else (None, budget): walk the sort
    order (_walk), checking at most `budget` rows (None: no bound) before fetching after all.
    `size`: the run's rollouts when the caller has read them (_run_size).

    Both plans cost rechecks (a detoast and an UPPER of the document). Fetching every hit costs one
    per index candidate, C; walking the sort order costs about (limit + 1) / selectivity = (limit +
    1) x run size / hits. So: fetch when C <= sqrt((limit + 1) x run size) (7,100 at a million
    rollouts, where both cost ~7,100 rechecks: the worst case), walk otherwise, for at most C rows:
    a word with few hits among many candidates (common trigrams) is then fetched, at no more than
    twice the cheaper plan's cost. Off Postgres (no count), the old rule: fetch up to SEARCH_PROBE +
    1, walk past that. The index leads with run_id (btree_gin), so other runs cost nothing."""
    candidates = _candidates(run, search)
    if candidates is None:
        ids = _fetch_hits(run, search, SEARCH_PROBE)
        return (ids, None) if len(ids) <= SEARCH_PROBE else (None, None)
    size = _run_size(run) if size is None else size
    cap = max(SEARCH_PROBE, math.isqrt((limit + 1) * size))
    return (_fetch_hits(run, search), None) if candidates <= cap else (None, candidates)


WALK_FIRST, WALK_MAX = (
    100,
    3000,
)  # rows checked per round of _walk: doubling from the first to the last
DENSE = 20  # a first round with 1 hit in DENSE rows or more (5%) keeps walking: the page is near


def _walk(
    qs: QuerySet,
    value_field: str,
    id_field: str,
    q: ExplorerQuery,
    start: tuple[str | None, int] | None = None,
    budget: int | None = None,
) -> tuple[list[tuple[int, Any]], tuple[str | None, int] | None]:
    """Rows in keyset order from q.cursor (or `start`), fetched without the search in rounds, kept
    when their rollout matches, until q.limit + 1 are kept or `budget` rows were checked: the plan
    cannot turn into a recheck of every hit. Returns the kept rows and where the next round starts
    (None: the end of the order)."""
    assert q.search is not None
    hits: list[tuple[int, Any]] = []
    cursor, n = start or (q.cursor, WALK_FIRST)
    checked = 0
    while len(hits) <= q.limit and (budget is None or checked < budget):
        chunk = keyset_fetch(qs, value_field, id_field, q.order, cursor, n)
        with _plan(
            enable_bitmapscan="off", enable_seqscan="off"
        ):  # by primary key, never the trigram index
            found = set(
                Rollout.objects.filter(id__in=[c[0] for c in chunk])
                .filter(_search_q(q.search, ""))
                .values_list("id", flat=True)
            )
        hits += [c for c in chunk if c[0] in found]
        checked += len(chunk)
        if len(chunk) < n:
            return hits, None
        cursor, n = encode_cursor(chunk[-1][1], chunk[-1][0]), min(2 * n, WALK_MAX)
    return hits, (cursor, n)


def _search_page(
    run: Run, qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery
) -> list[tuple[int, Any]]:
    """q.limit + 1 matching rows in keyset order. Postgres serves most searches from the word index
    (_word_search_page); the rest, and SQLite, by the cheaper of two plans over the trigram index
    (_probe says why). One round of the walk comes first: a frequent word fills the page there,
    before the index is asked to count candidates (a count that costs in proportion to them: 0.1 s
    for a word in all of 100k)."""
    assert q.search is not None
    plan = _word_plan(run, q.search)
    if plan is not None:
        return _word_search_page(run, qs, value_field, id_field, q, plan)
    hits, resume = _walk(qs, value_field, id_field, q, budget=WALK_FIRST)
    if len(hits) > q.limit or resume is None:
        return hits[: q.limit + 1]
    if len(hits) * DENSE >= WALK_FIRST:
        return (hits + _walk(qs, value_field, id_field, q, start=resume)[0])[: q.limit + 1]
    size = _run_size(run) if connection.vendor == "postgresql" else 0  # read once per search
    ids, budget = _probe(run, q.search, q.limit, size)
    if ids is None:
        more, resume = _walk(qs, value_field, id_field, q, start=resume, budget=budget)
        hits += more
        if len(hits) > q.limit or resume is None or budget is None:
            return hits[: q.limit + 1]
        ids = _fetch_hits(run, q.search)  # the walk has cost what fetching does: fetch after all
    return _hits_page(qs, value_field, id_field, q, ids, size)


def _with_ids(qs: QuerySet, id_field: str, ids: list[int], lookup: bool = True) -> QuerySet:
    """qs narrowed to rows whose `id_field` is in `ids`: one array parameter on Postgres (tens of
    thousands of ids would be as many parameters), IN elsewhere. lookup=False: a condition no
    index can serve (`id + 0`), only a filter on another scan."""
    if connection.vendor != "postgresql":
        return qs.filter(**{f"{id_field}__in": ids})
    column = qs.model._meta.get_field(id_field).column
    plus = "" if lookup else " + 0"
    # bigint[]: an int8 = int4 comparison is never hashed (Postgres hashes a long ANY list only
    # when both sides hash alike): 12,000 ids compared one by one took 0.25 s for 5,000 rows.
    sql = f"{connection.ops.quote_name(qs.model._meta.db_table)}.{column}{plus} = ANY(%s::bigint[])"
    return qs.filter(RawSQL(sql, (list(ids),), output_field=BooleanField()))


WALK_HITS = 2  # hits past WALK_HITS x sqrt(run size): walk the sort index for them (_hits_page)


def _hits_page(
    qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery, ids: list[int], size: int
) -> list[tuple[int, Any]]:
    """The page of `ids` (every hit of a search) in keyset order. Few hits: each is looked up and
    the lot sorted (~25 us a hit at a million realistic rollouts: a heap visit). Many: the sort
    index is walked with the ids as a hashed filter, ~51 x run size / hits entries (~1 us each),
    the cheaper past ~2 x sqrt(run size) hits (2,000 at a million rollouts). The id condition is
    written `id + 0 = ANY(...)` so it can only filter the walk, never drive a lookup by id (12,000
    lookups and a sort took 0.3 s for a word in 1.6% of a million rollouts; the walk 3 ms). `size`:
    the run's rollouts (_run_size)."""
    walk = connection.vendor == "postgresql" and len(ids) > WALK_HITS * math.isqrt(size)
    found = _with_ids(qs, id_field, ids, lookup=not walk)
    settings = {"enable_bitmapscan": "off"} if walk else {}
    with _plan(**settings):
        return keyset_fetch(found, value_field, id_field, q.order, q.cursor, q.limit + 1)


# The word index (migration 0010): each rollout's distinct words (text.search_words), prefixed by
# their run, in a GIN index; each run's vocabulary (SearchWord) under a trigram index. A term's runs
# of letters and digits (text.term_runs) are looked up in the vocabulary: the rollouts holding any
# word that contains a run are exactly those whose text contains the run, so the index answers a
# one-word term with no document rechecked, and narrows any other term to real candidates.
WORDS_INDEX = "rollout_search_words"
VOCAB_CAP = 2000  # words containing one run: past this the run is not used to narrow the search
# A fetched hit costs a heap visit (~a few us); a row the walk checks costs a recheck of its text
# (~0.1-0.3 ms at ~11 KB): the ratio of the two prices the plans of an exact word search.
RECHECK_PER_FETCH = 50


@dataclass(frozen=True)
class WordPlan:
    tsquery: str  # AND over the runs of OR over the words containing each; "": no word matches
    exact: bool  # the index's hits are the search's hits (one-word terms, no exclusions)


def _vocabulary(cur: Any, run: Run, run_text: str) -> list[str]:
    """The run's stored words containing `run_text` (up to VOCAB_CAP + 1). Runs hold only A-Z and
    0-9: no LIKE escaping, and the words need no tsquery quoting."""
    cur.execute(
        "SELECT word FROM rollouts_searchword WHERE run_id = %s::bigint AND word LIKE %s LIMIT %s",
        [run.id, f"%{run_text}%", VOCAB_CAP + 1],
    )
    return [w for (w,) in cur.fetchall()]


def _word_plan(run: Run, search: SearchQuery) -> WordPlan | None:
    """The word-index query for a search (Postgres), or None when no term has a run of 3+ letters
    and digits that the vocabulary narrows (the trigram plans serve it). A one-word exclusion is
    answered by the index too (`& !(...)`); any other is rechecked against the text."""
    if connection.vendor != "postgresql":
        return None
    clauses, exact = [], all(map(text.is_one_word, search.include))
    with connection.cursor() as cur:
        for run_text in dict.fromkeys(r for t in search.include for r in text.term_runs(t)):
            words = _vocabulary(cur, run, run_text)
            if not words:  # no stored word contains it: only rollouts stored without words can
                return WordPlan("", True)
            if len(words) > VOCAB_CAP:
                exact = False
                continue
            clauses.append("(" + " | ".join(text.words_lexeme(run.id, w) for w in words) + ")")
        if not clauses:
            return None
        for term in search.exclude:
            words = _vocabulary(cur, run, term.upper()) if text.is_one_word(term) else None
            if words is None or len(words) > VOCAB_CAP:
                exact = False  # rechecked against the text
            elif words:  # none: no stored rollout holds it, nothing to exclude
                clauses.append("!(" + " | ".join(text.words_lexeme(run.id, w) for w in words) + ")")
    return WordPlan(" & ".join(clauses), exact)


def _words_match(plan: WordPlan) -> RawSQL:
    """The word index's condition. Its lexemes carry their run (text.words_lexeme), so it needs no
    run filter: another run's rollouts never match."""
    sql = "rollouts_rollout.search_words @@ %s::tsquery"
    return RawSQL(sql, (plan.tsquery,), output_field=BooleanField())


def _word_hits(run: Run, search: SearchQuery, plan: WordPlan) -> list[int]:
    """The ids of the run's rollouts the word index finds, rechecked against their text unless the
    plan is exact; plus the rollouts without words (written another way than ingestion, or with
    too many words), found by their text through a partial index."""
    run_id = Cast(Value(run.id), BigIntegerField())  # bigint: see _run_search
    unindexed = Rollout.objects.filter(run_id=run_id, search_words__isnull=True)
    with _plan(enable_seqscan="off", enable_indexscan="off"):
        ids = list(unindexed.filter(_search_q(search, "")).values_list("id", flat=True))
        if plan.tsquery:
            hits = Rollout.objects.filter(_words_match(plan))  # run-scoped by the lexemes' prefix
            if not plan.exact:
                hits = hits.filter(_search_q(search, ""))
            ids += hits.values_list("id", flat=True)
        return ids


def _word_count(plan: WordPlan) -> int:
    """How many rollouts the word index finds (the hits of an exact plan, else candidates), from
    its bitmap scan run once under EXPLAIN ANALYZE (no row is read)."""
    qs = Rollout.objects.filter(_words_match(plan)).values("id")[:1]
    sql, params = qs.query.sql_with_params()
    with _plan(enable_seqscan="off", enable_indexscan="off"), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params)
        tree = cur.fetchone()[0]
    tree = json.loads(tree) if isinstance(tree, str) else tree
    return max(_index_rows(tree[0]["Plan"], WORDS_INDEX), default=0)


def _word_search_page(
    run: Run, qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery, plan: WordPlan
) -> list[tuple[int, Any]]:
    """Fetch every hit and sort them through the sort index, or walk the sort order checking rows,
    whichever costs less. An exact plan's hits cost a heap visit each, RECHECK_PER_FETCH times
    cheaper than a walk's recheck: fetch when C <= sqrt((limit + 1) x run size x that ratio)
    (50,000 at a million rollouts: a word in up to 5% of them). Otherwise the candidates are
    rechecked as the trigram plans do (_probe)."""
    assert q.search is not None
    count = _word_count(plan) if plan.tsquery else 0
    size = _run_size(run)
    scale = (q.limit + 1) * max(size, 1) * (RECHECK_PER_FETCH if plan.exact else 1)
    if count > max(SEARCH_PROBE, math.isqrt(scale)):
        hits, resume = _walk(qs, value_field, id_field, q, budget=None if plan.exact else count)
        if len(hits) > q.limit or resume is None or plan.exact:
            return hits[: q.limit + 1]
    return _hits_page(qs, value_field, id_field, q, _word_hits(run, q.search, plan), size)


RANGE_SHARE = 0.2  # a step range of at most this share of the run is read whole (_range_first)


def _range_first(run: Run, q: ExplorerQuery, value_field: str) -> bool:
    """Whether a step range's page is read from the range (its rows through rollout_run_step or
    score_step, which carry the sort values, then the top of them sorted) instead of walking the
    sort index. The walk skips every row of the other steps that sorts before the range's: when
    the values climb over the run, as reward does, the best of the first steps come after all
    the rest (0.15 us an entry, 78 ms at 1M rollouts, and growing with the run); reading the range
    costs 0.3-0.45 us a row of the range, whatever the order. A range of at most RANGE_SHARE of the
    run is read (<= ~30 ms at 1M rollouts, 10 ms for 11 steps of 500); a wider one is walked, at
    least one entry in five being a hit on average. Postgres only (the INCLUDE columns)."""
    if connection.vendor != "postgresql" or value_field == "step":
        return False
    if q.step_min is None and q.step_max is None:
        return False
    counts = StepStat.objects.filter(run=run, component_id=0).aggregate(
        run=Sum("n_rollouts"), range=Sum("n_rollouts", filter=_step_range(q, "step"))
    )
    return (counts["range"] or 0) <= RANGE_SHARE * (counts["run"] or 0)


def _step_range(q: ExplorerQuery, step_field: str) -> Q:
    """q's step range on `step_field` (empty when it has none)."""
    cond = Q()
    if q.step_min is not None:
        cond &= Q(**{f"{step_field}__gte": q.step_min})
    if q.step_max is not None:
        cond &= Q(**{f"{step_field}__lte": q.step_max})
    return cond


def _filters(
    run: Run,
    q: ExplorerQuery,
    comps: dict[str, RewardComponent],
    prefix: str,
    step_field: str = "step",
) -> Q:
    """Filters on Rollout fields; `prefix` is "" for a Rollout queryset, "rollout__" for
    RewardScore. `step_field`: Rollout and RewardScore carry step; ReplayScore does not
    ("rollout__step")."""
    cond = _step_range(q, step_field)
    if q.split:
        cond &= Q(**{f"{prefix}split": q.split})
    if q.zero_std_only:
        cond &= Q(**{f"{prefix}group__zero_std": True})
    return cond


def _range_exists(
    ranges: dict[str, tuple[float | None, float | None]],
    scores: QuerySet,
    comps: dict[str, RewardComponent],
    outer: str,
) -> list[Exists]:
    """One EXISTS per component range over `scores` (RewardScore, or one
    replay's ReplayScore rows)."""
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
    """The query's replay, checked: one of this run's, with stored values for what
    the query uses."""
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


def _annotation_filters(q: ExplorerQuery, outer: str) -> list[Exists]:
    """The label / annotated filters on the rollout id field `outer`, through
    Rollout.annotations."""
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


def _page_hits(
    run: Run, q: ExplorerQuery, comps_list: list[RewardComponent]
) -> tuple[list[tuple[int, Any]], str | None]:
    """The page's (rollout id, sort value) in keyset order, and the next page's cursor."""
    comps = {c.name: c for c in comps_list}
    replay = _replay(run, q)
    if replay is not None and q.sort.startswith(REPLAY_PREFIX):
        from webapp.replays.models import (
            ReplayScore,
        )  # the (replay, component, value, rollout) index

        qs = ReplayScore.objects.filter(
            replay=replay, component=comps[q.sort[len(REPLAY_PREFIX) :]]
        )
        qs = qs.filter(_filters(run, q, comps, "rollout__", step_field="rollout__step"))
        outer = "rollout_id"
    elif q.sort in comps:
        qs = RewardScore.objects.filter(run=run, component=comps[q.sort])
        qs = qs.filter(_filters(run, q, comps, "rollout__"))
        outer = "rollout_id"
    elif q.sort in TOKEN_SORTS:  # the (run, <summary>, rollout) index of RolloutTokens
        qs = RolloutTokens.objects.filter(run=run).filter(_filters(run, q, comps, "rollout__"))
        outer = "rollout_id"
    else:
        qs = Rollout.objects.filter(run=run).filter(_filters(run, q, comps, ""))
        outer = "id"
    replay_ranges = (
        _range_exists(q.replay_ranges, replay.scores.all(), comps, outer) if replay else []
    )
    for ex in [
        *_range_exists(q.ranges, RewardScore.objects.all(), comps, outer),
        *replay_ranges,
        *_token_ranges(q, outer),
        *_annotation_filters(q, outer),
    ]:
        qs = qs.filter(ex)
    tokens = q.sort in TOKEN_SORTS
    value_field = (
        q.sort[len(TOKEN_PREFIX) :] if tokens else "value" if outer == "rollout_id" else q.sort
    )
    if q.search is None:
        by_index = replay is not None or tokens or not _range_first(run, q, value_field)
        hits = keyset_fetch(qs, value_field, outer, q.order, q.cursor, q.limit + 1, by_index)
    else:
        hits = _search_page(run, qs, value_field, outer, q)
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


# One detoast and one UPPER per row: the page's documents average ~11 KB (up to ~400 KB), and each
# reference to search_text in an expression detoasted it again (five times a row, 100 ms a page).
_SNIPPET_SQL = """
SELECT id, GREATEST(at - %s, 1), SUBSTR(doc, GREATEST(at - %s, 1), %s) FROM (
    SELECT id, doc, STRPOS(UPPER(doc), %s) AS at FROM (
        SELECT id, search_text || '' AS doc FROM rollouts_rollout WHERE id = ANY(%s) OFFSET 0
    ) AS fetched OFFSET 0
) AS located"""


def _list_rollouts(ids: list[int], search: SearchQuery | None) -> dict[int, Rollout]:
    """The page's rollouts with the list columns only (never transcript, state or search text); for
    a search, the database cuts a snippet around the first match of the most specific term (one
    character more than shown, to tell whether the document goes on)."""
    qs = Rollout.objects.only(*Rollout.LIST_FIELDS)
    if search is None:
        return qs.in_bulk(ids)
    if connection.vendor != "postgresql":
        pos = StrIndex(Upper("search_text"), Value(search.first.upper()))
        qs = qs.annotate(snippet_from=Greatest(pos - SNIPPET_BEFORE, Value(1))).annotate(
            snippet_text=Substr("search_text", F("snippet_from"), SNIPPET_CHARS + 1)
        )
        return qs.in_bulk(ids)
    rows = qs.in_bulk(ids)
    with connection.cursor() as cur:
        cur.execute(
            _SNIPPET_SQL,
            [SNIPPET_BEFORE, SNIPPET_BEFORE, SNIPPET_CHARS + 1, search.first.upper(), list(ids)],
        )
        for rid, start, text in cur.fetchall():
            rows[rid].snippet_from, rows[rid].snippet_text = start, text
    return rows


def _snippet(r: Rollout, search: SearchQuery | None) -> SafeString | None:
    if search is None:
        return None
    text = r.snippet_text or ""
    return highlight(text[:SNIPPET_CHARS], search, r.snippet_from > 1, len(text) > SNIPPET_CHARS)


def _hydrate(
    hits: list[tuple[int, Any]],
    comps: list[RewardComponent],
    sorted_comp: RewardComponent | None,
    search: SearchQuery | None = None,
) -> list[ExplorerRow]:
    ids = [h[0] for h in hits]
    by_id = _list_rollouts(ids, search)
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
            snippet=_snippet(by_id[rid], search),
        )
        for rid, v in hits
        if rid in by_id
    ]


def matching_rollouts(
    run: Run, q: ExplorerQuery, components: list[RewardComponent]
) -> list[QuerySet]:
    """Every rollout of the run that the query's filters and search hold (its sort, order, cursor,
    limit and replay ignored), as disjoint Rollout querysets whose union is the answer (a behaviour,
    webapp/behaviours, counts them per step). The same search as the pages: on Postgres the word
    index's hits (rechecked unless the plan is exact) plus the rollouts stored without words; the
    trigram or plain text condition otherwise."""
    comps = {c.name: c for c in components}
    base = Rollout.objects.filter(run=run).filter(_filters(run, q, comps, ""))
    for ex in [
        *_range_exists(q.ranges, RewardScore.objects.all(), comps, "id"),
        *_annotation_filters(q, "id"),
    ]:
        base = base.filter(ex)
    if q.search is None:
        return [base]
    plan = _word_plan(run, q.search)
    if plan is None:
        return [base.filter(_search_q(q.search, ""))]
    parts = [base.filter(search_words__isnull=True).filter(_search_q(q.search, ""))]
    if plan.tsquery:
        hits = base.filter(_words_match(plan))
        parts.append(hits if plan.exact else hits.filter(_search_q(q.search, "")))
    return parts

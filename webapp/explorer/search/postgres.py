"""The search backend for Postgres: a cost-based planner over two indexes. The word index answers
every term with a run of 3+ ASCII letters or digits (a word's rollouts, counted by the index
alone); the trigram index, over the tokens holding a non-ASCII character only (migration 0014),
the rest, its candidates counted by running its bitmap scan once under EXPLAIN ANALYZE. Each plan
fetches every hit or walks the sort order, whichever costs fewer rechecks (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import BigIntegerField, BooleanField, QuerySet, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from webapp.explorer.params import ExplorerQuery
from webapp.explorer.search import base
from webapp.explorer.search.base import Hits, SearchBackend, run_search, run_size, search_q
from webapp.rollouts import text
from webapp.rollouts.models import Rollout, StepStat
from webapp.rollouts.text import SNIPPET_BEFORE, SNIPPET_CHARS, SearchQuery
from webapp.runs.models import Run

# Migration 0014: GIN (run_id, rd_search_nonascii(search_text) trgm): the upper-cased tokens of the
# text that hold a non-ASCII character (text.nonascii_pieces), empty for an ASCII-only text.
SEARCH_INDEX = "rollout_search_nonascii"
WALK_HITS = 2  # hits past WALK_HITS x sqrt(run size): walk the sort index for them (narrow)
# A step range whose per-step tops would hold more entries than this (steps x page size) walks
# the sort index instead (the step range checked inside it): a wide range at a large page size (an
# export's) costs less walked than merged.
MERGED_ENTRIES = 100_000

# The word index (migration 0010): each rollout's distinct words (text.search_words), prefixed by
# their run, in a GIN index; each run's vocabulary (SearchWord) under a trigram index. A term's runs
# of letters and digits (text.term_runs) are looked up in the vocabulary: the rollouts holding any
# word that contains a run are exactly those whose text contains the run, so the index answers a
# one-word term with no document rechecked, and narrows any other term to real candidates.
WORDS_INDEX = "rollout_search_words"
VOCAB_CAP = 2000  # words containing one run: past this the run is not used to narrow the search
# ... unless every run of the search is past it and no term has a non-ASCII piece: then the run in
# the fewest words narrows it, up to this many (a common run: its rollouts are rechecked).
VOCAB_FALLBACK = 20_000
# A fetched hit costs a heap visit (~a few us); a row the walk checks costs a recheck of its text
# (~0.1-0.3 ms at ~11 KB): the ratio of the two prices the plans of an exact word search.
RECHECK_PER_FETCH = 50

# One detoast and one UPPER per row: the page's documents average ~11 KB (up to ~400 KB), and each
# reference to search_text in an expression detoasted it again (five times a row, 100 ms a page).
_SNIPPET_SQL = """
SELECT id, GREATEST(at - %s, 1), SUBSTR(doc, GREATEST(at - %s, 1), %s) FROM (
    SELECT id, doc, STRPOS(UPPER(doc), %s) AS at FROM (
        SELECT id, search_text || '' AS doc FROM rollouts_rollout WHERE id = ANY(%s) OFFSET 0
    ) AS fetched OFFSET 0
) AS located"""


@dataclass(frozen=True)
class WordPlan:
    tsquery: str  # AND over the runs of OR over the words containing each; "": no word matches
    exact: bool  # the index's hits are the search's hits (one-word terms, no exclusions)


def _index_rows(node: dict[str, Any], index: str = SEARCH_INDEX) -> Iterator[int]:
    """Actual rows of an index's bitmap scans in an EXPLAIN (ANALYZE, FORMAT JSON) plan."""
    if node.get("Node Type") == "Bitmap Index Scan" and node.get("Index Name") == index:
        yield int(node.get("Actual Rows", 0))
    for child in node.get("Plans", ()):
        yield from _index_rows(child, index)


def _vocabulary(cur: Any, run: Run, run_text: str, cap: int = VOCAB_CAP) -> list[str]:
    """The run's stored words containing `run_text` (up to cap + 1). Runs hold only A-Z and
    0-9: no LIKE escaping, and the words need no tsquery quoting."""
    cur.execute(
        "SELECT word FROM rollouts_searchword WHERE run_id = %s::bigint AND word LIKE %s LIMIT %s",
        [run.id, f"%{run_text}%", cap + 1],
    )
    return [w for (w,) in cur.fetchall()]


def index_q(search: SearchQuery) -> RawSQL | None:
    """The trigram index's condition for a search: every non-ASCII piece of its terms inside the
    text's non-ASCII tokens (implied by the search's own condition, which still decides). None
    when no term has one: the index has nothing to offer."""
    pieces = [p for term in search.include for p in text.nonascii_pieces(term)]
    if not pieces:
        return None
    like = "rd_search_nonascii(rollouts_rollout.search_text) LIKE UPPER(%s)"
    patterns = tuple(
        "%" + p.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        for p in dict.fromkeys(pieces)
    )
    return RawSQL(" AND ".join([like] * len(patterns)), patterns, output_field=BooleanField())


def _words_match(plan: WordPlan) -> RawSQL:
    """The word index's condition. Its lexemes carry their run (text.words_lexeme), so it needs no
    run filter: another run's rollouts never match."""
    sql = "rollouts_rollout.search_words @@ %s::tsquery"
    return RawSQL(sql, (plan.tsquery,), output_field=BooleanField())


class PostgresSearch(SearchBackend):
    @contextlib.contextmanager
    def plan(self, **settings: str) -> Iterator[None]:
        """Planner settings for the queries inside (SET LOCAL, undone at the transaction's end)."""
        with transaction.atomic(), connection.cursor() as cur:
            # Plans priced past a disabled node cross jit_above_cost: half a second compiling a
            # 5 ms query.
            cur.execute("SET LOCAL jit = off")
            for name, value in settings.items():
                # names and values are ours, never the request's
                cur.execute(f"SET LOCAL {name} = {value}")
            yield

    def plan_size(self, run: Run) -> int:
        return run_size(run)

    def candidates(self, run: Run, search: SearchQuery) -> int | None:
        """How many of the run's rollouts the trigram index offers for the search's words, before
        any is rechecked against its text. Postgres cannot estimate a LIKE on long text (ANALYZE
        skips values over 1 KB), and a recheck costs a detoast and an UPPER of the whole document
        (~0.1-0.3 ms at 11 KB): counting the hits themselves would cost as much as fetching them.
        The index's own count comes from running its bitmap scan once, under EXPLAIN ANALYZE with
        LIMIT 1 (the bitmap is built whole before the first row is read; the heap is then read
        only up to the first hit). The count is an upper bound of the hits; for words of 3+
        characters the two are nearly always equal. None when the planner read another index (a
        table too small for the trigram index to pay, or a search without a non-ASCII piece)."""
        cond = index_q(search)
        if cond is None:
            return None
        sql, params = run_search(run, search).filter(cond).values("id")[:1].query.sql_with_params()
        with self.plan(enable_seqscan="off", enable_indexscan="off"), connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params)
            plan = cur.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        return max(_index_rows(plan[0]["Plan"]), default=None)

    def probe(
        self, run: Run, search: SearchQuery, limit: int, size: int
    ) -> tuple[list[int] | None, int | None]:
        """Both plans cost rechecks (a detoast and an UPPER of the document). Fetching every hit
        costs one per index candidate, C; walking the sort order costs about (limit + 1) /
        selectivity = (limit + 1) x run size / hits. So: fetch when C <= sqrt((limit + 1) x run
        size) (7,100 at a million rollouts, where both cost ~7,100 rechecks: the worst case), walk
        otherwise, for at most C rows: a word with few hits among many candidates (common
        trigrams) is then fetched, at no more than twice the cheaper plan's cost. No count (the
        planner chose another index): fetch up to SEARCH_PROBE + 1, walk past that. The index
        leads with run_id (btree_gin), so other runs cost nothing."""
        candidates = self.candidates(run, search)
        if candidates is None and index_q(search) is None:
            return None, None  # no index narrows it: walk the sort order (no rows fetched first)
        if candidates is None:
            ids = self.fetch_hits(run, search, base.SEARCH_PROBE)
            return (ids, None) if len(ids) <= base.SEARCH_PROBE else (None, None)
        cap = max(base.SEARCH_PROBE, math.isqrt((limit + 1) * size))
        return (self.fetch_hits(run, search), None) if candidates <= cap else (None, candidates)

    def fetch_hits(self, run: Run, search: SearchQuery, cap: int | None = None) -> list[int]:
        """Through the trigram index alone (when the search has a non-ASCII piece)."""
        cond = index_q(search)
        if cond is None:
            return super().fetch_hits(run, search, cap)
        ids = run_search(run, search).filter(cond).values_list("id", flat=True)
        with self.plan(enable_seqscan="off", enable_indexscan="off"):
            return list(ids if cap is None else ids[: cap + 1])

    def recheck(self, ids: list[int], search: SearchQuery) -> set[int]:
        with self.plan(enable_bitmapscan="off", enable_seqscan="off"):  # never the trigram index
            return super().recheck(ids, search)

    def narrow(
        self, qs: QuerySet, id_field: str, ids: list[int], size: int
    ) -> tuple[QuerySet, dict[str, str]]:
        """Few hits: each is looked up and the lot sorted (~25 us a hit at a million realistic
        rollouts: a heap visit). Many: the sort index is walked with the ids as a hashed filter,
        ~51 x run size / hits entries (~1 us each), the cheaper past ~2 x sqrt(run size) hits
        (2,000 at a million rollouts). The id condition is written `id + 0 = ANY(...)` so it can
        only filter the walk, never drive a lookup by id (12,000 lookups and a sort took 0.3 s for
        a word in 1.6% of a million rollouts; the walk 3 ms). `size`: the run's rollouts."""
        walk = len(ids) > WALK_HITS * math.isqrt(size)
        column = qs.model._meta.get_field(id_field).column
        plus = " + 0" if walk else ""
        # bigint[]: an int8 = int4 comparison is never hashed (Postgres hashes a long ANY list only
        # when both sides hash alike): 12,000 ids compared one by one took 0.25 s for 5,000 rows.
        table = connection.ops.quote_name(qs.model._meta.db_table)
        sql = f"{table}.{column}{plus} = ANY(%s::bigint[])"
        found = qs.filter(RawSQL(sql, (list(ids),), output_field=BooleanField()))
        return found, ({"enable_bitmapscan": "off"} if walk else {})

    def search_page(
        self, run: Run, qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery
    ) -> Hits:
        """Most searches from the word index (word_search_page); the rest by the trigram plans."""
        assert q.search is not None
        plan = self.word_plan(run, q.search)
        if plan is not None:
            return self.word_search_page(run, qs, value_field, id_field, q, plan)
        return super().search_page(run, qs, value_field, id_field, q)

    def word_plan(self, run: Run, search: SearchQuery) -> WordPlan | None:
        """The word-index query for a search, or None when no term has a run of 3+ letters and
        digits that the vocabulary narrows and a term has a non-ASCII piece (the trigram plans
        serve it), or when nothing narrows it (the sort order is walked). When every run is in
        more than VOCAB_CAP words, the one in the fewest narrows it (up to VOCAB_FALLBACK). A
        one-word exclusion is answered by the index too (`& !(...)`); any other is rechecked
        against the text."""
        clauses, exact, common = [], all(map(text.is_one_word, search.include)), []
        with connection.cursor() as cur:
            for run_text in dict.fromkeys(r for t in search.include for r in text.term_runs(t)):
                words = _vocabulary(cur, run, run_text)
                if not words:  # no stored word contains it: only rollouts stored without words can
                    return WordPlan("", True)
                if len(words) > VOCAB_CAP:
                    exact = False
                    common.append(run_text)
                    continue
                clauses.append("(" + " | ".join(text.words_lexeme(run.id, w) for w in words) + ")")
            if not clauses and (not common or index_q(search) is not None):
                return None
            if not clauses:
                words = min((_vocabulary(cur, run, r, VOCAB_FALLBACK) for r in common), key=len)
                if len(words) > VOCAB_FALLBACK:
                    return None
                clauses.append("(" + " | ".join(text.words_lexeme(run.id, w) for w in words) + ")")
            for term in search.exclude:
                words = _vocabulary(cur, run, term.upper()) if text.is_one_word(term) else None
                if words is None or len(words) > VOCAB_CAP:
                    exact = False  # rechecked against the text
                elif words:  # none: no stored rollout holds it, nothing to exclude
                    lexemes = " | ".join(text.words_lexeme(run.id, w) for w in words)
                    clauses.append("!(" + lexemes + ")")
        return WordPlan(" & ".join(clauses), exact)

    def word_hits(self, run: Run, search: SearchQuery, plan: WordPlan) -> list[int]:
        """The ids of the run's rollouts the word index finds, rechecked against their text unless
        the plan is exact; plus the rollouts without words (written another way than ingestion, or
        with too many words), found by their text through a partial index."""
        run_id = Cast(Value(run.id), BigIntegerField())  # bigint: see base.run_search
        unindexed = Rollout.objects.filter(run_id=run_id, search_words__isnull=True)
        with self.plan(enable_seqscan="off", enable_indexscan="off"):
            ids = list(unindexed.filter(search_q(search, "")).values_list("id", flat=True))
            if plan.tsquery:
                hits = Rollout.objects.filter(_words_match(plan))  # run-scoped by the lexemes
                if not plan.exact:
                    hits = hits.filter(search_q(search, ""))
                ids += hits.values_list("id", flat=True)
            return ids

    def word_count(self, plan: WordPlan) -> int:
        """How many rollouts the word index finds (the hits of an exact plan, else candidates),
        from its bitmap scan run once under EXPLAIN ANALYZE (no row is read)."""
        qs = Rollout.objects.filter(_words_match(plan)).values("id")[:1]
        sql, params = qs.query.sql_with_params()
        with self.plan(enable_seqscan="off", enable_indexscan="off"), connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params)
            tree = cur.fetchone()[0]
        tree = json.loads(tree) if isinstance(tree, str) else tree
        return max(_index_rows(tree[0]["Plan"], WORDS_INDEX), default=0)

    def word_search_page(
        self,
        run: Run,
        qs: QuerySet,
        value_field: str,
        id_field: str,
        q: ExplorerQuery,
        plan: WordPlan,
    ) -> Hits:
        """Fetch every hit and sort them through the sort index, or walk the sort order checking
        rows, whichever costs less. An exact plan's hits cost a heap visit each, RECHECK_PER_FETCH
        times cheaper than a walk's recheck: fetch when C <= sqrt((limit + 1) x run size x that
        ratio) (50,000 at a million rollouts: a word in up to 5% of them). Otherwise the
        candidates are rechecked as the trigram plans do (probe)."""
        assert q.search is not None
        count = self.word_count(plan) if plan.tsquery else 0
        size = run_size(run)
        scale = (q.limit + 1) * max(size, 1) * (RECHECK_PER_FETCH if plan.exact else 1)
        if count > max(base.SEARCH_PROBE, math.isqrt(scale)):
            budget = None if plan.exact else count
            hits, resume = self.walk(qs, value_field, id_field, q, budget=budget)
            if len(hits) > q.limit or resume is None or plan.exact:
                return hits[: q.limit + 1]
        ids = self.word_hits(run, q.search, plan)
        return self.hits_page(qs, value_field, id_field, q, ids, size)

    def matching(self, run: Run, base_qs: QuerySet, search: SearchQuery) -> list[QuerySet]:
        """The word index's hits (rechecked unless the plan is exact) plus the rollouts stored
        without words; the trigram condition when the word index cannot serve the search."""
        plan = self.word_plan(run, search)
        if plan is None:
            cond = index_q(search)
            parts = super().matching(run, base_qs, search)
            return parts if cond is None else [qs.filter(cond) for qs in parts]
        parts = [base_qs.filter(search_words__isnull=True).filter(search_q(search, ""))]
        if plan.tsquery:
            hits = base_qs.filter(_words_match(plan))
            parts.append(hits if plan.exact else hits.filter(search_q(search, "")))
        return parts

    def exact_count(self, run: Run, search: SearchQuery) -> int | None:
        plan = self.word_plan(run, search)
        if plan is not None and plan.exact and plan.tsquery:
            return self.word_count(plan)
        return None

    def range_steps(self, run: Run, q: ExplorerQuery) -> list[int] | None:
        """The range's steps, from the per-step statistics (one row a step): a page sorted by a
        component, the reward, the advantage or the length is then each step's top, merged
        (score_step and rollout_run_step_<field> are keyed by step, then value): steps x page size
        entries, whatever the run's size (docs/performance.md has the figures at 10M). Past
        MERGED_ENTRIES entries, None: the sort index is walked."""
        if q.step_min is None and q.step_max is None:
            return None
        rows = StepStat.objects.filter(q.step_range("step"), run=run, component_id=0)
        most = MERGED_ENTRIES // (q.limit + 1)
        steps = list(rows.order_by("step").values_list("step", flat=True)[: most + 1])
        return None if len(steps) > most else steps

    def snippet_rows(self, qs: QuerySet, ids: list[int], search: SearchQuery) -> dict[int, Rollout]:
        rows = qs.in_bulk(ids)
        with connection.cursor() as cur:
            cur.execute(
                _SNIPPET_SQL,
                [
                    SNIPPET_BEFORE,
                    SNIPPET_BEFORE,
                    SNIPPET_CHARS + 1,
                    search.first.upper(),
                    list(ids),
                ],
            )
            for rid, start, snippet in cur.fetchall():
                rows[rid].snippet_from, rows[rid].snippet_text = start, snippet
        return rows

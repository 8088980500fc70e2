"""The search backend interface and what every backend shares: the walk over the sort order that
checks rows against the search, and the trigram plans (_probe, fetch or walk) built on the
backend's answers. A backend answers what depends on its database: how many candidates an index
offers, planner settings, how a page's snippet is cut, and whether a step range is read first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db.models import BigIntegerField, Q, QuerySet, Sum, Value
from django.db.models.functions import Cast

from webapp.explorer.paging import encode_cursor, keyset_fetch
from webapp.explorer.params import ExplorerQuery
from webapp.rollouts.models import Rollout, StepStat
from webapp.rollouts.text import SearchQuery
from webapp.runs.models import Run

SEARCH_PROBE = 300  # hits always fetched outright, whatever the run's size (the index's candidates)
# Rows checked per round of walk: doubling from the first to the last.
WALK_FIRST, WALK_MAX = 100, 3000
DENSE = 20  # a first round with 1 hit in DENSE rows or more (5%) keeps walking: the page is near


def search_q(search: SearchQuery, prefix: str) -> Q:
    """Case-insensitive substrings of the whole rollout's search text. Postgres: UPPER(...) LIKE,
    checked on the rows an index offers (postgres.py); SQLite: a scan (the demo's size)."""
    cond = Q()
    for term in search.include:
        cond &= Q(**{f"{prefix}search_text__icontains": term})
    for term in search.exclude:
        cond &= ~Q(**{f"{prefix}search_text__icontains": term})
    return cond


def run_search(run: Run, search: SearchQuery) -> QuerySet:
    # run_id as bigint: btree_gin has no int8 = int4 operator, and an int4 literal leaves run_id out
    # of the index condition (2.2 s instead of 0.5 ms for a word common in another run).
    run_id = Cast(Value(run.id), BigIntegerField())
    return Rollout.objects.filter(run_id=run_id).filter(search_q(search, ""))


def run_size(run: Run) -> int:
    """The run's rollouts, from the per-step statistics ingestion keeps (one row per step)."""
    total = StepStat.objects.filter(run=run, component_id=0).aggregate(n=Sum("n_rollouts"))["n"]
    return int(total or 0)


Hits = list[tuple[int, Any]]  # (id, sort value) rows in keyset order


class SearchBackend:
    """What the explorer asks of a database about searches and plans. Subclasses answer probe
    and snippet_rows; the rest has a default every database can run."""

    @contextlib.contextmanager
    def plan(self, **settings: str) -> Iterator[None]:
        """Planner settings for the queries inside (none by default)."""
        yield

    def plan_size(self, run: Run) -> int:
        """The run's size as the search plans weigh it (0: they do not)."""
        return 0

    def range_steps(self, run: Run, q: ExplorerQuery) -> list[int] | None:
        """The run's steps in the query's step range when its page is a merge of per-step tops
        (paging.per_step_fetch); None: read it another way (no range, or no such plan here)."""
        return None

    def probe(
        self, run: Run, search: SearchQuery, limit: int, size: int
    ) -> tuple[list[int] | None, int | None]:
        """(ids, None) when fetching every hit is the cheaper plan; else (None, budget): walk the
        sort order, checking at most `budget` rows (None: no bound) before fetching after all."""
        raise NotImplementedError

    def fetch_hits(self, run: Run, search: SearchQuery, cap: int | None = None) -> list[int]:
        """The ids of the run's matching rollouts (up to cap + 1)."""
        ids = run_search(run, search).values_list("id", flat=True)
        return list(ids if cap is None else ids[: cap + 1])

    def recheck(self, ids: list[int], search: SearchQuery) -> set[int]:
        """Which of the rollouts `ids` the search holds, each looked up by primary key."""
        found = Rollout.objects.filter(id__in=ids).filter(search_q(search, ""))
        return set(found.values_list("id", flat=True))

    def hits_page(
        self,
        qs: QuerySet,
        value_field: str,
        id_field: str,
        q: ExplorerQuery,
        ids: list[int],
        size: int,
    ) -> Hits:
        """The page of `ids` (every hit of a search) in keyset order. `size`: the run's size
        (plan_size)."""
        found, settings = self.narrow(qs, id_field, ids, size)
        with self.plan(**settings):
            return keyset_fetch(found, value_field, id_field, q.order, q.cursor, q.limit + 1)

    def narrow(
        self, qs: QuerySet, id_field: str, ids: list[int], size: int
    ) -> tuple[QuerySet, dict[str, str]]:
        """qs narrowed to the rows whose `id_field` is in `ids`, and the planner settings to read
        it under."""
        return qs.filter(**{f"{id_field}__in": ids}), {}

    def search_page(
        self, run: Run, qs: QuerySet, value_field: str, id_field: str, q: ExplorerQuery
    ) -> Hits:
        """q.limit + 1 matching rows in keyset order, by the cheaper of two plans (probe says
        which). One round of the walk comes first: a frequent word fills the page there, before
        the index is asked to count candidates (a count that costs in proportion to them: 0.1 s
        for a word in all of 100k)."""
        assert q.search is not None
        hits, resume = self.walk(qs, value_field, id_field, q, budget=WALK_FIRST)
        if len(hits) > q.limit or resume is None:
            return hits[: q.limit + 1]
        if len(hits) * DENSE >= WALK_FIRST:
            return (hits + self.walk(qs, value_field, id_field, q, start=resume)[0])[: q.limit + 1]
        size = self.plan_size(run)  # read once per search
        ids, budget = self.probe(run, q.search, q.limit, size)
        if ids is None:
            more, resume = self.walk(qs, value_field, id_field, q, start=resume, budget=budget)
            hits += more
            if len(hits) > q.limit or resume is None or budget is None:
                return hits[: q.limit + 1]
            ids = self.fetch_hits(run, q.search)  # the walk cost what fetching does: fetch now
        return self.hits_page(qs, value_field, id_field, q, ids, size)

    def walk(
        self,
        qs: QuerySet,
        value_field: str,
        id_field: str,
        q: ExplorerQuery,
        start: tuple[str | None, int] | None = None,
        budget: int | None = None,
    ) -> tuple[Hits, tuple[str | None, int] | None]:
        """Rows in keyset order from q.cursor (or `start`), fetched without the search in rounds,
        kept when their rollout matches, until q.limit + 1 are kept or `budget` rows were checked:
        the plan cannot turn into a recheck of every hit. Returns the kept rows and where the next
        round starts (None: the end of the order)."""
        assert q.search is not None
        hits: Hits = []
        cursor, n = start or (q.cursor, WALK_FIRST)
        checked = 0
        while len(hits) <= q.limit and (budget is None or checked < budget):
            chunk = keyset_fetch(qs, value_field, id_field, q.order, cursor, n)
            found = self.recheck([c[0] for c in chunk], q.search)
            hits += [c for c in chunk if c[0] in found]
            checked += len(chunk)
            if len(chunk) < n:
                return hits, None
            cursor, n = encode_cursor(chunk[-1][1], chunk[-1][0]), min(2 * n, WALK_MAX)
        return hits, (cursor, n)

    def matching(self, run: Run, base: QuerySet, search: SearchQuery) -> list[QuerySet]:
        """`base` narrowed to the search, as disjoint querysets whose union is the answer."""
        return [base.filter(search_q(search, ""))]

    def exact_count(self, run: Run, search: SearchQuery) -> int | None:
        """The search's hits among the rollouts stored with words, counted by an index alone
        when it answers the search exactly; None when it cannot."""
        return None

    def list_rollouts(self, ids: list[int], search: SearchQuery | None) -> dict[int, Rollout]:
        """The page's rollouts with the list columns only (never transcript, state or search
        text); for a search, each carries snippet_from (1-based) and snippet_text: the text
        around the first match of the most specific term, one character more than shown (to
        tell whether the document goes on). The view layer marks it up."""
        qs = Rollout.objects.only(*Rollout.LIST_FIELDS)
        if search is None:
            return qs.in_bulk(ids)
        return self.snippet_rows(qs, ids, search)

    def snippet_rows(self, qs: QuerySet, ids: list[int], search: SearchQuery) -> dict[int, Rollout]:
        raise NotImplementedError

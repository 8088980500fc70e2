"""The search backend for SQLite (and any database without one of its own): no index to count
candidates, so a search fetches up to SEARCH_PROBE + 1 hits and walks the sort order past that;
the snippet is cut by the ORM's STRPOS and SUBSTR."""

from __future__ import annotations

from django.db.models import F, QuerySet, Value
from django.db.models.functions import Greatest, StrIndex, Substr, Upper

from webapp.explorer.search import base
from webapp.explorer.search.base import SearchBackend
from webapp.rollouts.models import Rollout
from webapp.rollouts.text import SNIPPET_BEFORE, SNIPPET_CHARS, SearchQuery
from webapp.runs.models import Run


class SQLiteSearch(SearchBackend):
    def probe(
        self, run: Run, search: SearchQuery, limit: int, size: int
    ) -> tuple[list[int] | None, int | None]:
        ids = self.fetch_hits(run, search, base.SEARCH_PROBE)
        return (ids, None) if len(ids) <= base.SEARCH_PROBE else (None, None)

    def snippet_rows(self, qs: QuerySet, ids: list[int], search: SearchQuery) -> dict[int, Rollout]:
        pos = StrIndex(Upper("search_text"), Value(search.first.upper()))
        qs = qs.annotate(snippet_from=Greatest(pos - SNIPPET_BEFORE, Value(1))).annotate(
            snippet_text=Substr("search_text", F("snippet_from"), SNIPPET_CHARS + 1)
        )
        return qs.in_bulk(ids)

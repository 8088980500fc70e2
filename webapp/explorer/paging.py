"""Keyset paging: the cursor a page hands out and the walk that reads the next page from it.

Keyset order is (value, id) with NULL treated as larger than every number: ascending puts NULLs
last, descending puts them first. That is Postgres's native B-tree order, so both directions are a
plain forward or backward scan of the (run, component, value, rollout) or (run, field, id) index.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any

from django.db.models import (
    BooleanField,
    Q,
    QuerySet,
)
from django.db.models.expressions import RawSQL

from webapp.errors import FieldError


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


def _segments(
    qs: QuerySet, vf: str, idf: str, asc: bool, cursor: str | None
) -> Iterator[tuple[QuerySet, list[str]]]:
    """Keyset order's segments from the cursor on: each one's rows (the cursor's bound applied
    to the first) and its sort keys. NULLs form their own segment (last ascending, first
    descending), fetched by a separate query: one `value > v OR (value = v AND id > last)`
    predicate mixed with `IS NULL` would make Postgres scan the index from its start, so every
    page would cost as much as OFFSET. Each segment's predicate carries the redundant bound
    `value >= v` (or `<=`) that lets the scan start at the cursor."""
    segments = ["value", "null"] if asc else ["null", "value"]
    start_segment, v, last = segments[0], None, None
    if cursor:
        v, last = decode_cursor(cursor)
        start_segment = "null" if v is None else "value"
    op = "gt" if asc else "lt"
    for seg in segments[segments.index(start_segment) :]:
        at_cursor = cursor is not None and seg == start_segment
        part = qs.filter(**{f"{vf}__isnull": seg == "null"})
        if at_cursor and seg == "null":
            part = part.filter(**{f"{idf}__{op}": last})
        elif at_cursor:
            part = part.filter(**{f"{vf}__{op}e": v}).filter(
                Q(**{f"{vf}__{op}": v}) | Q(**{f"{idf}__{op}": last})
            )
        yield part, ([idf] if seg == "null" else [vf, idf])


def keyset_fetch(
    qs: QuerySet,
    value_field: str,
    id_field: str,
    order: str,
    cursor: str | None,
    limit: int,
) -> list[tuple[int, Any]]:
    """Up to `limit` (id, value) rows after `cursor` in keyset order (_segments): a walk of the
    sort index from the cursor."""
    asc = order == "asc"
    rows: list[tuple[int, Any]] = []
    for part, keys in _segments(qs, value_field, id_field, asc, cursor):
        part = part.order_by(*[k if asc else f"-{k}" for k in keys])
        rows += list(part.values_list(id_field, value_field)[: limit - len(rows)])
        if len(rows) >= limit:
            break
    return rows


def per_step_fetch(
    qs: QuerySet,
    value_field: str,
    id_field: str,
    order: str,
    cursor: str | None,
    limit: int,
    steps: list[int],
) -> list[tuple[int, Any]]:
    """keyset_fetch's rows for a query confined to `steps`, as a merge of each step's first
    `limit` rows (Postgres: one LATERAL query a segment). The first `limit` rows of the whole
    order are among the steps' firsts, so the answer is keyset_fetch's; with an index keyed
    (..., step, value, id) each step costs one index descent and `limit` entries: steps x limit
    in all, whatever the run's or the range's size."""
    from django.db import connection

    asc = order == "asc"
    direction = "ASC" if asc else "DESC"
    step_col = qs.model._meta.get_field("step").column
    table = connection.ops.quote_name(qs.model._meta.db_table)
    in_step = RawSQL(f"{table}.{step_col} = per_step.step", (), output_field=BooleanField())
    rows: list[tuple[int, Any]] = []
    for part, keys in _segments(qs, value_field, id_field, asc, cursor):
        want = limit - len(rows)
        part = part.filter(in_step).order_by(*[k if asc else f"-{k}" for k in keys])
        sql, params = part.values_list(id_field, value_field)[:want].query.sql_with_params()
        outer = ", ".join(f"found.{'v' if k == value_field else 'i'} {direction}" for k in keys)
        with connection.cursor() as cur:
            # per_step.step: the LATERAL's outer step, which in_step compares each row's with
            cur.execute(
                f"SELECT found.i, found.v FROM unnest(%s::int[]) AS per_step(step) "
                f"CROSS JOIN LATERAL ({sql}) AS found(i, v) ORDER BY {outer} LIMIT %s",
                [list(steps), *params, want],
            )
            rows += cur.fetchall()
        if len(rows) >= limit:
            break
    return rows

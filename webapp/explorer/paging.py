"""Keyset paging: the cursor a page hands out and the walk that reads the next page from it.

Keyset order is (value, id) with NULL treated as larger than every number: ascending puts NULLs
last, descending puts them first. That is Postgres's native B-tree order, so both directions are a
plain forward or backward scan of the (run, component, value, rollout) or (run, field, id) index.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from django.db.models import (
    BigIntegerField,
    ExpressionWrapper,
    F,
    Field,
    FloatField,
    Q,
    QuerySet,
    Value,
)
from django.db.models.expressions import OrderBy

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
    rows are found by the filters' index (a step range's, range_first) and the top of them sorted.
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

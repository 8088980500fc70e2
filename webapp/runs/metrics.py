"""Validated storage of per-step trainer metrics (TRL's logged keys verbatim)."""

from __future__ import annotations

import math
from typing import Any

from django.db import connection, transaction

from webapp.errors import FieldError
from webapp.rollouts.validation import MAX_INT
from webapp.runs.models import Run, StepMetric

MAX_NAME = 200


def _unknown(obj: dict[str, Any], allowed: tuple[str, ...], path: str) -> list[dict[str, str]]:
    """Errors for keys a client may have misspelt: stored as given, they would vanish
    without a word."""
    out = []
    for key in obj:
        if key not in allowed:
            name = str(key)[:100] or '""'
            out.append(
                {
                    "field": f"{path}.{name}" if path else name,
                    "error": f"unknown field; expected {', '.join(allowed)}",
                }
            )
    return out


def validate_metrics(body: Any) -> list[tuple[int, str, float | None]]:
    if not isinstance(body, dict) or not isinstance(body.get("metrics"), list):
        raise FieldError("metrics", "must be a list of {step, values}")
    rows: list[tuple[int, str, float | None]] = []
    errors = _unknown(body, ("metrics",), "")
    for i, m in enumerate(body["metrics"]):
        p = f"metrics[{i}]"
        if not isinstance(m, dict):
            errors.append({"field": p, "error": "must be an object with step and values"})
            continue
        errors += _unknown(m, ("step", "values"), p)
        step, values = m.get("step"), m.get("values")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_INT:
            errors.append(
                {
                    "field": f"{p}.step",
                    "error": f"must be a non-negative integer (at most {MAX_INT})",
                }
            )
        if not isinstance(values, dict):
            errors.append({"field": f"{p}.values", "error": "must be an object of name -> number"})
            continue
        for name, v in values.items():
            if not name or len(name) > MAX_NAME:
                errors.append(
                    {
                        "field": f"{p}.values",
                        "error": f"metric names must be 1..{MAX_NAME} characters",
                    }
                )
            elif v is None:
                rows.append((step, name, None))
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                errors.append({"field": f"{p}.values.{name}", "error": "must be a number or null"})
            elif not math.isfinite(v):
                rows.append(
                    (step, name, None)
                )  # trainers do log inf/NaN (a diverged loss): kept as missing
            else:
                rows.append((step, name, float(v)))
    if errors:
        raise FieldError.of(errors)
    return rows


@transaction.atomic
def record_metrics(run: Run, body: Any) -> int:
    """Upsert metrics: the same (run, name, step) sent twice keeps the latest value."""
    rows = validate_metrics(body)
    if not rows:
        return 0
    latest = {(step, name): v for step, name, v in rows}
    objs = [StepMetric(run=run, step=s, name=n, value=v) for (s, n), v in latest.items()]
    if connection.vendor in ("postgresql", "sqlite"):
        StepMetric.objects.bulk_create(
            objs,
            update_conflicts=True,
            unique_fields=["run", "name", "step"],
            update_fields=["value"],
            batch_size=1000,
        )
    else:  # pragma: no cover
        for o in objs:
            StepMetric.objects.update_or_create(
                run=run, step=o.step, name=o.name, defaults={"value": o.value}
            )
    return len(objs)

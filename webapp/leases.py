"""The one lease queue for background work: rows that workers claim, hold for a while and give back.

A `LeaseQueue` names a model's status values (ready, held) and its lease fields: the holder, the
token (the claim time: a row claimed again carries a new one, so a late holder's writes miss) and
the beat (renewed while working). A held row whose beat is older than `stale_seconds` is stale:
queues with `reclaim` hand it out again, others leave the caller to fail it. `claim_next` uses
SELECT ... FOR UPDATE SKIP LOCKED where the database has it (Postgres), so claimers never wait on
each other; elsewhere (SQLite, one writer at a time) a conditional UPDATE claims, and a lost race
moves on to the next row.

Users: job runs (webapp/runs/models.py), replay chunks and summaries (webapp/replays/queue.py).
docs/architecture.md shows how a new kind of work uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

_ALL = Q()  # no scope: every row of the model


@dataclass(frozen=True)
class LeaseQueue:
    model: type[models.Model]
    ready: tuple[str, ...]  # status values a row waits in to be claimed
    held: str  # status value while a holder works on it
    token: str  # datetime field set at claim: the lease's identity
    beat: str  # datetime field renewed by the holder; expiry counts from it
    stale_seconds: float | Callable[[], float]  # a callable is read at each use (settings)
    holder: str | None = None  # char field naming the holder, when the model has one
    reclaim: bool = False  # stale rows are claimable again (else the caller fails them)
    order: tuple[str, ...] = ("pk",)  # which ready row is claimed first

    def stale_before(self) -> datetime:
        seconds = self.stale_seconds() if callable(self.stale_seconds) else self.stale_seconds
        return timezone.now() - timedelta(seconds=seconds)

    def _held(self) -> Q:
        return Q(status=self.held)

    def claimable(self) -> Q:
        """Rows a claim may take now: ready ones, and stale held ones when the queue reclaims."""
        ready = Q(status__in=self.ready)
        if not self.reclaim:
            return ready
        return ready | (self._held() & Q(**{f"{self.beat}__lt": self.stale_before()}))

    def stale(self, scope: Q = _ALL) -> models.QuerySet:
        """Held rows whose holder stopped renewing (presumed dead)."""
        return self.model.objects.filter(
            scope, self._held(), **{f"{self.beat}__lt": self.stale_before()}
        )

    def live(self, scope: Q = _ALL) -> models.QuerySet:
        """Held rows whose holder renewed within the stale limit."""
        return self.model.objects.filter(
            scope, self._held(), **{f"{self.beat}__gte": self.stale_before()}
        )

    def _claim_fields(self, holder: str | None, extra: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        fields: dict[str, Any] = {"status": self.held, self.token: now, self.beat: now, **extra}
        if self.holder is not None:
            fields[self.holder] = (holder or "")[:200]
        return fields

    def claim_row(self, pk: Any, holder: str | None = None, **extra: Any) -> bool:
        """Claim this very row if it is claimable (a concurrent writer is waited for, then the
        condition re-checked): False when another claimer got there first."""
        return self._update_if_claimable(pk, self._claim_fields(holder, extra))

    def _update_if_claimable(self, pk: Any, fields: dict[str, Any]) -> bool:
        return self.model.objects.filter(self.claimable(), pk=pk).update(**fields) == 1

    def claim_next(
        self, scope: Q = _ALL, holder: str | None = None, **extra: Any
    ) -> models.Model | None:
        """The first claimable row of `scope` in `order`, claimed; None when none is left."""
        if connection.features.has_select_for_update_skip_locked:
            with transaction.atomic():
                row = (
                    self.model.objects.select_for_update(skip_locked=True)
                    .filter(scope, self.claimable())
                    .order_by(*self.order)
                    .first()
                )
                if row is not None:
                    # Locked by us and still claimable: the update cannot miss.
                    fields = self._claim_fields(holder, extra)
                    self._update_if_claimable(row.pk, fields)
                    _set(row, fields)
                return row
        while True:
            row = self.model.objects.filter(scope, self.claimable()).order_by(*self.order).first()
            if row is None:
                return None
            fields = self._claim_fields(holder, extra)
            if self._update_if_claimable(row.pk, fields):
                _set(row, fields)
                return row
            # Another claimer took it between our read and our update: try the next one.

    def _mine(self, row: models.Model) -> models.QuerySet:
        return self.model.objects.filter(pk=row.pk, **{self.token: getattr(row, self.token)})

    def renew(self, row: models.Model) -> bool:
        """Heartbeat: push the row's expiry on. False when the row is gone or was claimed again
        (another token)."""
        now = timezone.now()
        if not self._mine(row).update(**{self.beat: now}):
            return False
        setattr(row, self.beat, now)
        return True

    def release(self, row: models.Model, **fields: Any) -> bool:
        """Give the row back with `fields` (its finished status, results) if this lease still
        holds it; False when it went stale and another holder claimed it (its result counts)."""
        return self._mine(row).filter(self._held()).update(**fields) == 1


def _set(row: models.Model, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(row, name, value)

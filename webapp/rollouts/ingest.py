"""The one ingestion service: every path (API, importers, the recorder's database sink) calls
`ingest_groups(run, {"groups": [...]})`.

A batch is validated whole (validation.py), then its statistics (ingest_stats.py), rows
(rows.py) and writes (ingest_write.py: COPY on Postgres) run in one transaction: stored
completely or not at all. Idempotent on (run, step, group key): a retried batch stores nothing
twice. The steps are described in docs/architecture.md, "Ingestion".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, OperationalError, transaction

from webapp.errors import FieldError
from webapp.rollouts import ingest_stats, rows
from webapp.rollouts.ingest_write import (
    add_vocabulary,
    insert,
    reserve_ids,
    upsert_step_stats,
)
from webapp.rollouts.models import Group, RewardComponent, Rollout
from webapp.rollouts.validation import GroupIn, validate_batch
from webapp.runs.deletion import hold_for_ingest
from webapp.runs.models import Run
from webapp.tokens import ingest as tokens_ingest
from webapp.tokens.validation import vocab_size

RETRIES = 3
__all__ = ["IngestResult", "ingest_groups"]


@dataclass(frozen=True)
class IngestResult:
    groups: int  # newly stored
    rollouts: int
    skipped_groups: int  # already stored (a retried batch)


def ingest_groups(run: Run, body: Any) -> IngestResult:
    """Validate and store a batch of groups for `run`. All or nothing; idempotent on (step, key)."""
    comps = run.components()
    groups = validate_batch(body, {c.name for c in comps}, vocab_size(run.config))
    for attempt in range(RETRIES):
        try:
            result = _store(run, groups, comps)
            if result.groups:
                from webapp.behaviours.services import after_ingest  # behaviours build on rollouts

                after_ingest(run)
            return result
        except (IntegrityError, OperationalError) as e:
            # A concurrent batch with some of the same groups committed first (unique violation) or
            # wrote them in another order (deadlock): our transaction rolled back whole, and the
            # retry skips the groups that are now stored.
            if isinstance(e, IntegrityError) and not Run.objects.filter(id=run.id).exists():
                # Deleted while we wrote (its job is being stopped): a refusal, not a crash
                # in the trainer.
                raise FieldError("run", f"run {run.id} was deleted") from None
            if attempt == RETRIES - 1 or not _lost_race(e):
                raise
    raise AssertionError("unreachable")


def _lost_race(e: Exception) -> bool:
    import psycopg.errors as pg

    return isinstance(e, IntegrityError) or isinstance(
        e.__cause__, (pg.DeadlockDetected, pg.SerializationFailure)
    )


@transaction.atomic
def _store(run: Run, groups: list[GroupIn], comps: list[RewardComponent]) -> IngestResult:
    hold_for_ingest(run.id)  # waits for a delete being marked; refuses a run marked deleted
    new = _unstored(run, groups)
    if not new:
        return IngestResult(groups=0, rollouts=0, skipped_groups=len(groups))
    s = ingest_stats.of_batch(run, new, comps)
    n = len(s.group_of)
    group_ids, rollout_ids = reserve_ids(Group, len(new)), reserve_ids(Rollout, n)
    insert(rows.batch_rows(run.id, new, comps, s, group_ids, rollout_ids))
    upsert_step_stats(run.id, ingest_stats.step_stat_rows(s, comps))
    tokens_ingest.store(run.id, new, rollout_ids)  # webapp/tokens: its arrays and step sums
    add_vocabulary(run.id, [r.search_words for g in new for r in g.rollouts])  # last: it says why
    return IngestResult(groups=len(new), rollouts=n, skipped_groups=len(groups) - len(new))


def _unstored(run: Run, groups: list[GroupIn]) -> list[GroupIn]:
    """The batch's groups that the run does not hold yet (a retried batch holds some or all)."""
    if not groups:
        return []
    stored = set(
        Group.objects.filter(
            run=run, step__in={g.step for g in groups}, key__in={g.key for g in groups}
        ).values_list("step", "key")
    )
    return [g for g in groups if (g.step, g.key) not in stored]

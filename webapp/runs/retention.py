"""Transcript retention: for finished runs older than N days, keep whole transcripts only for the
rollouts people used (annotated, queued, in a dataset) and a deterministic sample; drop the
rest's text. `manage.py retain_transcripts` (with --dry-run) is the way in. Pruned rollouts keep
scores, previews and their final completion, so charts, diagnostics and sorts are unchanged;
search no longer finds them. What is kept and lost, in detail: docs/operations.md, "Module
notes".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection, models, transaction
from django.db.models.deletion import Collector
from django.utils import timezone

from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run

MARKER = "[transcript removed by retention"
GROUPS_PER_BATCH = 200
SAMPLE_MODULUS = 1000


@dataclass
class RunPlan:
    run_id: int
    name: str
    rollouts: int = 0
    prune: int = 0
    kept_used: int = 0  # annotated, queued or in a dataset
    kept_sample: int = 0
    already: int = 0
    text_bytes: int = 0  # of what is (or would be) pruned; Postgres only
    layers: dict[str, int] = field(default_factory=dict)  # one-to-one rows deleted


def old_runs(days: int) -> list[Run]:
    cutoff = timezone.now() - timedelta(days=days)
    return list(
        Run.objects.live().filter(status__in=Run.FINISHED, finished_at__lt=cutoff).order_by("id")
    )


def in_sample(rollout_id: int, percent: float) -> bool:
    """A fixed pseudo-random `percent` of rollouts (Knuth's multiplicative hash of the id): the
    same ones on every run of the command, spread over steps and groups."""
    return (rollout_id * 2654435761) % 2**32 % SAMPLE_MODULUS < percent * SAMPLE_MODULUS / 100


def used_rollouts(ids: list[int]) -> set[int]:
    """Rollouts people worked with: annotated, in a review queue, or in a dataset."""
    from webapp.annotations.models import Annotation, DatasetRecord, QueueItem

    used = set(Annotation.objects.filter(rollout_id__in=ids).values_list("rollout_id", flat=True))
    used |= set(QueueItem.objects.filter(rollout_id__in=ids).values_list("rollout_id", flat=True))
    for col in ("source_rollout_id", "chosen_rollout_id"):
        used |= set(DatasetRecord.objects.filter(**{f"{col}__in": ids}).values_list(col, flat=True))
    return used


def layers() -> list[tuple[type[models.Model], str]]:
    """Models one-to-one with Rollout (a per-rollout layer of its transcript), hidden ones too."""
    return [
        (rel.related_model, rel.field.name)
        for rel in Rollout._meta.get_fields(include_hidden=True)
        if rel.auto_created and not rel.concrete and rel.one_to_one
    ]


def retain(run: Run, sample_percent: float, dry_run: bool) -> RunPlan:
    plan = RunPlan(run.id, run.name)
    marker = f"{MARKER} on {timezone.now():%Y-%m-%d}: not annotated, not in the kept sample]"
    last = 0
    while True:
        groups = list(
            Group.objects.filter(run=run, id__gt=last)
            .order_by("id")
            .values_list("id", flat=True)[:GROUPS_PER_BATCH]
        )
        if not groups:
            break
        last = groups[-1]
        with transaction.atomic():
            _batch(groups, plan, sample_percent, marker, dry_run)
    if not dry_run and plan.prune:
        summary = dict(run.summary or {})
        summary["retention"] = {
            "at": timezone.now().isoformat(timespec="seconds"),
            "pruned": plan.prune + plan.already,
            "kept_used": plan.kept_used,
            "kept_sample": plan.kept_sample,
            "sample_percent": sample_percent,
        }
        Run.objects.filter(id=run.id).update(summary=summary)
    return plan


def _batch(groups: list[int], plan: RunPlan, percent: float, marker: str, dry_run: bool) -> None:
    rows = list(
        Rollout.objects.filter(group_id__in=groups).values_list("id", "transcript__0__content")
    )
    ids = [rid for rid, _ in rows]
    used = used_rollouts(ids)
    prune = []
    for rid, first in rows:
        plan.rollouts += 1
        if isinstance(first, str) and first.startswith(MARKER):
            plan.already += 1
        elif rid in used:
            plan.kept_used += 1
        elif in_sample(rid, percent):
            plan.kept_sample += 1
        else:
            prune.append(rid)
    plan.prune += len(prune)
    if not prune:
        return
    plan.text_bytes += _text_bytes(prune)
    if dry_run:
        for model, fk in layers():
            n = model._base_manager.filter(**{f"{fk}__in": prune}).count()
            plan.layers[model._meta.label] = plan.layers.get(model._meta.label, 0) + n
        return
    for model, fk in layers():
        collector = Collector(using=connection.alias, origin=Rollout)
        collector.collect(model._base_manager.filter(**{f"{fk}__in": prune}))
        _, counts = collector.delete()
        label = model._meta.label
        plan.layers[label] = plan.layers.get(label, 0) + counts.get(label, 0)
    Rollout.objects.filter(id__in=prune).update(
        transcript=[{"role": "system", "content": marker}], state=None, search_text=""
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:  # an empty word list, not NULL (NULL means "recheck")
            cur.execute(
                "UPDATE rollouts_rollout SET search_words = ''::tsvector WHERE id = ANY(%s)",
                [prune],
            )


def _text_bytes(ids: list[int]) -> int:
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_column_size(transcript) + pg_column_size(search_text) "
            "+ coalesce(pg_column_size(state), 0)), 0) FROM rollouts_rollout WHERE id = ANY(%s)",
            [ids],
        )
        return int(cur.fetchone()[0])

"""Annotation state changes, review queues, progress and agreement; the annotated and bad-case
rollout ids the diagnostics detector "reward rises but annotated quality does not" reads."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from webapp.accounts.roles import has_role
from webapp.annotations import agreement as agreement_math
from webapp.annotations.models import (
    ActivityEvent,
    Annotation,
    ItemAssignment,
    Label,
    QueueAssignee,
    QueueItem,
    ReviewQueue,
)
from webapp.errors import FieldError
from webapp.explorer.params import MAX_LIMIT, ExplorerQuery
from webapp.explorer.query import explore
from webapp.rollouts.models import Rollout
from webapp.rollouts.text import normalize_newlines
from webapp.runs.models import Run

# --- annotations ----------------------------------------------------------------------------------


def save_annotation(
    rollout: Rollout,
    author: AbstractBaseUser,
    *,
    label: Label,
    note: str = "",
    corrected_completion: str = "",
    first_wrong_turn: int | None = None,
    error_category: str = "",
) -> tuple[Annotation, bool]:
    """Create or update `author`'s own annotation of `rollout` (never anyone else's).
    Returns (row, created)."""
    note, corrected_completion = normalize_newlines(note), normalize_newlines(corrected_completion)
    fields = {
        "label": label,
        "note": note,
        "corrected_completion": corrected_completion,
        "first_wrong_turn": first_wrong_turn,
        "error_category": error_category,
    }
    for attempt in range(2):
        try:
            with transaction.atomic():
                ann = (
                    Annotation.objects.select_for_update()
                    .filter(rollout=rollout, author=author)
                    .first()
                )
                created = ann is None
                if created:
                    ann = Annotation.objects.create(rollout=rollout, author=author, **fields)
                else:
                    for name, value in fields.items():
                        setattr(ann, name, value)
                    ann.updated_at = timezone.now()
                    ann.save()
                # Done now: an earlier skip of this rollout in any queue no longer
                # counts as skipped.
                ItemAssignment.objects.filter(
                    item__rollout=rollout, user=author, skipped_at__isnull=False
                ).update(skipped_at=None)
                ActivityEvent.objects.create(
                    actor=author,
                    rollout_id=rollout.id,
                    label_slug=label.slug,
                    action=ActivityEvent.Action.CREATED
                    if created
                    else ActivityEvent.Action.UPDATED,
                )
            return ann, created
        except IntegrityError:
            # The same author's other request (a double submit) created the row first:
            # update it instead.
            if attempt:
                raise
    raise AssertionError("unreachable")


def can_delete(user: AbstractBaseUser, ann: Annotation) -> bool:
    return ann.author_id == user.pk or has_role(user, "admin")


def delete_annotation(ann: Annotation, actor: AbstractBaseUser) -> None:
    with transaction.atomic():
        ActivityEvent.objects.create(
            actor=actor,
            action=ActivityEvent.Action.DELETED,
            rollout_id=ann.rollout_id,
            label_slug=ann.label.slug,
            detail=f"annotation by {ann.author}",
        )
        ann.delete()


def annotated_rollout_ids(run: Run | int) -> set[int]:
    """Ids of the run's rollouts that anyone annotated (the denominator of the bad-case share)."""
    run_id = run if isinstance(run, int) else run.id
    return set(
        Annotation.objects.filter(rollout__run_id=run_id).values_list("rollout_id", flat=True)
    )


def bad_case_rollout_ids(run: Run | int) -> set[int]:
    """Ids of the run's rollouts that at least one person annotated with a bad label."""
    run_id = run if isinstance(run, int) else run.id
    return set(
        Annotation.objects.filter(rollout__run_id=run_id, label__is_bad=True)
        .values_list("rollout_id", flat=True)
        .distinct()
    )


# --- review queues --------------------------------------------------------------------------------


def select_rollouts(
    run: Run, source: str, params: dict[str, str], limit: int, seed: int | None
) -> list[int]:
    """The rollout ids a queue (or an export) takes: the top `limit` of an explorer view, or a
    seeded random sample of the run. Raises FieldError naming the bad explorer parameter."""
    if source == ReviewQueue.Source.RANDOM:
        ids = list(Rollout.objects.filter(run=run).order_by("id").values_list("id", flat=True))
        return random.Random(seed or 0).sample(ids, min(limit, len(ids)))
    names = [c.name for c in run.components()]
    q = ExplorerQuery.from_params(
        {k: v for k, v in params.items() if k not in ("cursor", "limit")}, names
    )
    q.limit = min(limit, MAX_LIMIT)
    out: list[int] = []
    while len(out) < limit:
        page = explore(run, q)
        out.extend(row.rollout.id for row in page.rows)
        if not page.next_cursor:
            break
        q.cursor = page.next_cursor
    return out[:limit]


@transaction.atomic
def create_queue(
    *,
    name: str,
    run: Run,
    source: str,
    params: dict[str, str],
    limit: int,
    seed: int | None,
    overlap: int,
    created_by: AbstractBaseUser,
    assignees: list[AbstractBaseUser],
) -> ReviewQueue:
    ids = select_rollouts(run, source, params, limit, seed)
    if not ids:
        raise FieldError("params", "this selection contains no rollouts")
    queue = ReviewQueue.objects.create(
        name=name,
        run=run,
        source=source,
        params=params,
        limit=limit,
        seed=seed,
        overlap=overlap,
        created_by=created_by,
    )
    QueueItem.objects.bulk_create(
        [QueueItem(queue=queue, rollout_id=rid, position=i) for i, rid in enumerate(ids)],
        batch_size=1000,
    )
    assign(queue, assignees, overlap)
    return queue


def round_robin(n_items: int, n_people: int, overlap: int) -> list[list[int]]:
    """For each item, the indexes of the `overlap` people who annotate it:
    consecutive people, wrapping.

    >>> round_robin(4, 3, 2)
    [[0, 1], [2, 0], [1, 2], [0, 1]]
    """
    if n_people == 0:
        return [[] for _ in range(n_items)]
    if not 1 <= overlap <= n_people:
        raise FieldError("overlap", f"must be between 1 and the number of assignees ({n_people})")
    return [[(i * overlap + j) % n_people for j in range(overlap)] for i in range(n_items)]


@transaction.atomic
def assign(queue: ReviewQueue, users: list[AbstractBaseUser], overlap: int) -> None:
    """Replace the queue's assignees; each item goes to `overlap` of them, round-robin in the given
    order. Annotations already made stay: progress counts them wherever they were made."""
    QueueAssignee.objects.filter(queue=queue).delete()
    ItemAssignment.objects.filter(item__queue=queue).delete()
    users = list(dict.fromkeys(users))  # the same person twice would get one item twice
    plan = round_robin(queue.items.count(), len(users), overlap)
    QueueAssignee.objects.bulk_create(
        [QueueAssignee(queue=queue, user=u, position=i) for i, u in enumerate(users)]
    )
    item_ids = list(queue.items.order_by("position").values_list("id", flat=True))
    ItemAssignment.objects.bulk_create(
        [
            ItemAssignment(item_id=item_id, user=users[p])
            for item_id, people in zip(item_ids, plan, strict=True)
            for p in people
        ],
        batch_size=1000,
    )
    ReviewQueue.objects.filter(id=queue.id).update(overlap=overlap)
    queue.overlap = overlap


def _items_for(queue: ReviewQueue, user: AbstractBaseUser) -> QuerySet:
    """The user's assigned items, or every item when the user is not an assignee
    (anyone may help)."""
    mine = queue.items.filter(assignments__user=user)
    return mine if mine.exists() else queue.items.all()


def next_item(
    queue: ReviewQueue, user: AbstractBaseUser, after: int | None = None
) -> QueueItem | None:
    """The next item the user has not annotated: after `after` first, then from the start; items the
    user skipped come last, once nothing else is left."""
    done = Exists(Annotation.objects.filter(rollout_id=OuterRef("rollout_id"), author=user))
    skipped = Exists(
        ItemAssignment.objects.filter(item_id=OuterRef("id"), user=user, skipped_at__isnull=False)
    )
    pending = _items_for(queue, user).filter(~done).order_by("position")
    fresh = pending.filter(~skipped)
    for qs in (
        fresh.filter(position__gt=after) if after is not None else fresh.none(),
        fresh,
        pending.filter(position__gt=after) if after is not None else pending.none(),
        pending,
    ):
        item = qs.first()
        if item is not None:
            return item
    return None


def skip_item(item: QueueItem, user: AbstractBaseUser) -> None:
    ItemAssignment.objects.filter(item=item, user=user).update(skipped_at=timezone.now())
    ActivityEvent.objects.create(
        actor=user,
        action=ActivityEvent.Action.SKIPPED,
        rollout_id=item.rollout_id,
        detail=f"queue {item.queue_id} item {item.position}",
    )


@dataclass
class Progress:
    user: AbstractBaseUser
    assigned: int
    done: int
    skipped: int

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.assigned) if self.assigned else 0


def progress(queue: ReviewQueue) -> list[Progress]:
    out = []
    for a in queue.assignees.select_related("user").order_by("position"):
        done = Exists(
            Annotation.objects.filter(rollout_id=OuterRef("item__rollout_id"), author=a.user)
        )
        row = ItemAssignment.objects.filter(item__queue=queue, user=a.user).aggregate(
            assigned=Count("id"),
            done=Count("id", filter=Q(done)),
            skipped=Count("id", filter=Q(skipped_at__isnull=False) & ~Q(done)),
        )
        out.append(Progress(user=a.user, **row))
    return out


def queue_summary(queue: ReviewQueue) -> dict[str, int]:
    """Items, items with an annotation, items with at least `overlap` annotations."""
    return queue.items.annotate(n=Count("rollout__annotations")).aggregate(
        items=Count("id"),
        annotated=Count("id", filter=Q(n__gte=1)),
        complete=Count("id", filter=Q(n__gte=queue.overlap)),
    )


def queue_ratings(
    queue: ReviewQueue,
) -> tuple[dict[int, dict[str, str]], dict[int, list[Annotation]]]:
    """item rollout id -> {annotator username -> label slug}, and the annotations themselves."""
    anns = (
        Annotation.objects.filter(rollout__queue_items__queue=queue)
        .select_related("author", "label")
        .order_by("rollout_id", "author__username")
    )
    ratings: dict[int, dict[str, str]] = {}
    by_rollout: dict[int, list[Annotation]] = {}
    for a in anns:
        ratings.setdefault(a.rollout_id, {})[a.author.get_username()] = a.label.slug
        by_rollout.setdefault(a.rollout_id, []).append(a)
    return ratings, by_rollout


def queue_agreement(queue: ReviewQueue) -> dict[str, Any]:
    ratings, by_rollout = queue_ratings(queue)
    labels = list(Label.objects.order_by("position", "id"))
    result = agreement_math.agreement(ratings, [lab.slug for lab in labels])
    positions = dict(queue.items.values_list("rollout_id", "position"))
    return {
        "result": result,
        "labels": [(lab, result.per_label[lab.slug]) for lab in labels],
        "disagreements": [
            {"rollout_id": rid, "position": positions.get(rid), "annotations": by_rollout[rid]}
            for rid in sorted(result.disagreements, key=lambda r: positions.get(r, 0))
        ],
    }


def rollout_annotations(rollout: Rollout) -> list[Annotation]:
    return list(rollout.annotations.select_related("author", "label").order_by("created_at", "id"))

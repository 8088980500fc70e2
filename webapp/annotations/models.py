"""Labels, annotations of rollouts, review queues with assignments, activity, and exported datasets.

Invariants:
- one Annotation per (rollout, author): a person edits their own row and nobody else's (admins may
  delete);
- a queue's items are materialised when it is created, so a queue is a fixed list even as the run
  grows;
- each item is assigned to `overlap` of the queue's assignees, deterministically (round-robin);
- a Dataset's version counts per name (1, 2, ...); its records are immutable once written.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone


class Label(models.Model):
    """One entry of the failure-mode taxonomy. `is_bad`: annotating a rollout with it marks
    a bad case."""

    slug = models.SlugField(max_length=60, unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    color = models.CharField(
        max_length=7,
        default="#888888",  # #rrggbb; the pages put it in a style attribute
        validators=[RegexValidator(r"^#[0-9a-fA-F]{6}$", "must be #rrggbb")],
    )
    key = models.CharField(max_length=1, blank=True)  # keyboard shortcut in the focus view
    is_bad = models.BooleanField(default=True)
    position = models.IntegerField(default=0)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return self.name


class Annotation(models.Model):
    rollout = models.ForeignKey(
        "rollouts.Rollout", on_delete=models.CASCADE, related_name="annotations"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="annotations"
    )
    label = models.ForeignKey(Label, on_delete=models.PROTECT, related_name="annotations")
    note = models.TextField(blank=True)
    corrected_completion = models.TextField(
        blank=True
    )  # what the model should have said from first_wrong_turn on
    first_wrong_turn = models.IntegerField(null=True, blank=True)  # index into rollout.transcript
    error_category = models.CharField(
        max_length=100, blank=True
    )  # free-form sub-category of the label
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "author"], name="annotation_one_per_author")
        ]
        indexes = [models.Index(fields=["label", "rollout"], name="annotation_label_rollout")]

    def __str__(self) -> str:
        return f"{self.author_id} on rollout {self.rollout_id}: {self.label_id}"

    @property
    def has_correction(self) -> bool:
        return bool(self.corrected_completion.strip())


class ReviewQueue(models.Model):
    class Source(models.TextChoices):
        EXPLORER = "explorer"  # a saved explorer view: its query string and a limit
        RANDOM = "random"  # a seeded random sample of the run

    name = models.CharField(max_length=200)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="review_queues")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.EXPLORER)
    params = models.JSONField(default=dict, blank=True)  # explorer query params (str -> str)
    limit = models.IntegerField(default=200)
    seed = models.IntegerField(null=True, blank=True)
    overlap = models.IntegerField(default=1)  # each item is annotated by this many assignees
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name


class QueueItem(models.Model):
    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    rollout = models.ForeignKey(
        "rollouts.Rollout", on_delete=models.CASCADE, related_name="queue_items"
    )
    position = models.IntegerField()

    class Meta:
        ordering = ["queue_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "position"], name="queueitem_unique_position"),
            models.UniqueConstraint(fields=["queue", "rollout"], name="queueitem_unique_rollout"),
        ]


class QueueAssignee(models.Model):
    """A person working the queue; `position` fixes the round-robin order."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="assignees")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    position = models.IntegerField()

    class Meta:
        ordering = ["queue_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "user"], name="queueassignee_unique")
        ]


class ItemAssignment(models.Model):
    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="assignments")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    skipped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "user"], name="itemassignment_unique")
        ]
        indexes = [models.Index(fields=["user", "item"], name="itemassignment_user")]


class ActivityEvent(models.Model):
    """Who did what to which rollout, and when (the admin's activity page). Survives deletes."""

    class Action(models.TextChoices):
        CREATED = "created"
        UPDATED = "updated"
        DELETED = "deleted"
        SKIPPED = "skipped"
        EXPORTED = "exported"

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=16, choices=Action.choices)
    rollout_id = models.BigIntegerField(null=True)  # not a FK: the event outlives the rollout
    label_slug = models.CharField(max_length=60, blank=True)
    detail = models.CharField(max_length=300, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]


class Dataset(models.Model):
    class Kind(models.TextChoices):
        SFT = "sft"
        DPO = "dpo"

    class Format(models.TextChoices):
        STANDARD = (
            "standard"  # strings: SFT {"prompt","completion"}, DPO {"prompt","chosen","rejected"}
        )
        CONVERSATIONAL = "conversational"  # SFT {"messages"}, DPO lists of {"role","content"}

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.STANDARD)
    version = models.IntegerField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    source = models.JSONField(
        default=dict
    )  # what was exported: {"type", "run_id", ...} and skip counts
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="dataset_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version} ({self.kind})"


class DatasetRecord(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="records")
    position = models.IntegerField()
    data = (
        models.JSONField()
    )  # the TRL record: prompt/completion, messages, or prompt/chosen/rejected
    source_rollout = models.ForeignKey(
        "rollouts.Rollout", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    chosen_rollout = models.ForeignKey(
        "rollouts.Rollout", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    label = models.ForeignKey(Label, null=True, on_delete=models.SET_NULL, related_name="+")
    note = models.TextField(blank=True)
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["dataset_id", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["dataset", "position"], name="datasetrecord_unique_position"
            )
        ]

"""Reward replays: a run's stored transcripts re-scored with changed component versions.

The new values live beside the originals (ReplayScore, never RewardScore). A replay's selection is
fixed when it is created: its groups (all, a step window or a sample, up to the last group stored
then) are cut into chunks of whole groups, which workers claim one at a time, so more worker
processes finish sooner. A chunk's scores are written in one transaction with its "done" mark: a
failed chunk stores nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Replay(models.Model):
    class Status(models.TextChoices):
        """queued -> running -> summarising -> succeeded | failed; queued | running -> cancelled."""

        QUEUED = "queued"
        RUNNING = "running"
        SUMMARISING = "summarising"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="replays")
    name = models.CharField(max_length=200)
    versions = (
        models.JSONField()
    )  # [ComponentVersion.as_dict()]: component, target, params, source_hash
    selection = models.JSONField(
        default=dict
    )  # {"mode": all|steps|sample, "step_min", "step_max", "groups", "seed"}
    last_group_id = models.BigIntegerField(
        default=0
    )  # groups stored when the replay was created: id <= this
    run_was_live = models.BooleanField(
        default=False
    )  # the run was still training then: later steps are not in
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    total = models.IntegerField(default=0)  # rollouts selected
    done = models.IntegerField(default=0)  # rollouts whose chunk is stored
    failed = models.IntegerField(
        default=0
    )  # of those, rollouts where a version failed (value fails closed)
    n_chunks = models.IntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    summary = models.CharField(max_length=500, blank=True)  # one line, also the task's result
    results = models.BinaryField(
        null=True, editable=False
    )  # npz of the per-rollout arrays (results.RESULT_KEYS)
    stats = models.JSONField(
        default=dict, blank=True
    )  # headline numbers of the results (page and API)
    twin = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    summarising_at = models.DateTimeField(
        null=True, blank=True
    )  # a summary older than the stale limit is redone
    resumed_at = models.DateTimeField(
        null=True, blank=True
    )  # last re-queued as stalled (once per stale limit)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "created_at"], name="replay_run_created")]

    def __str__(self) -> str:
        return f"{self.name} (run {self.run_id})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def progress(self) -> float:
        return self.done / self.total if self.total else 1.0

    def components(self) -> list[str]:
        return [v["component"] for v in self.versions]

    def request_cancel(self) -> None:
        """Queued or running replays stop after the chunks in flight; what they stored stays."""
        Replay.objects.filter(id=self.id).update(cancel_requested=True)
        Replay.objects.filter(id=self.id, status=self.Status.QUEUED).update(
            status=self.Status.CANCELLED,
            finished_at=timezone.now(),
            summary="cancelled before it started",
        )
        self.refresh_from_db()


class ReplayChunk(models.Model):
    class Status(models.TextChoices):
        """pending -> running -> done | failed. A running chunk older than the stale limit
        is claimable again."""

        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    replay = models.ForeignKey(Replay, on_delete=models.CASCADE, related_name="chunks")
    index = models.IntegerField()
    group_ids = models.JSONField()  # whole groups: advantages are recomputed per group
    n_rollouts = models.IntegerField(default=0)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    worker = models.CharField(max_length=200, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    n_failed = models.IntegerField(default=0)
    seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["replay_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["replay", "index"], name="replaychunk_unique_index")
        ]
        indexes = [models.Index(fields=["replay", "status", "index"], name="replaychunk_claim")]


class ReplayScore(models.Model):
    """A replayed value. `value` is never NULL or NaN: a failed call stores the component's
    fail-closed value (its declared minimum, else 0) with ok=False and the reason."""

    replay = models.ForeignKey(
        Replay, on_delete=models.CASCADE, related_name="scores", db_index=False
    )
    rollout = models.ForeignKey(
        "rollouts.Rollout",
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    component = models.ForeignKey(
        "rollouts.RewardComponent",
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    value = models.FloatField()
    ok = models.BooleanField(default=True)
    reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["replay", "rollout", "component"], name="replayscore_unique"
            )
        ]
        indexes = [
            models.Index(
                fields=["replay", "component", "value", "rollout"], name="replayscore_sort"
            ),
            # Deleting a run's rollouts deletes their replay scores by rollout (the reaper,
            # webapp/runs/deletion.py): without it, a scan of every replay score per batch.
            models.Index(fields=["rollout"], name="replayscore_rollout"),
        ]

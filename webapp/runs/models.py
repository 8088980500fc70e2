"""Runs (training, eval, import jobs) and the metrics their trainers log per step."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.jobs import RUN_KINDS
from webapp.leases import LeaseQueue

LOG_TAIL_CHARS = 20_000  # the run page shows the tail; full logs live in the run's output folder
STALE_BEATS = 6  # a run whose worker missed this many heartbeats is presumed lost


class RunQuerySet(models.QuerySet):
    def live(self) -> RunQuerySet:
        """Runs not marked deleted (webapp/runs/deletion.py): what pages and lists show."""
        return self.filter(deleted_at__isnull=True)


class Run(models.Model):
    # training.jobs.RUN_KINDS is the one table of kinds: Run.Kind.GRPO == "grpo", labels its titles
    Kind = models.TextChoices("Kind", [(k.upper(), (k, job.title)) for k, job in RUN_KINDS.items()])

    class Status(models.TextChoices):
        """queued -> running -> succeeded | failed | cancelled; queued -> cancelled.

        `import` runs fed by the API start `running` and stay so until marked finished.
        """

        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.IMPORT)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    environment = models.ForeignKey(
        "rollouts.Environment", null=True, blank=True, on_delete=models.PROTECT
    )
    config = models.JSONField(default=dict, blank=True)  # the resolved job config
    provenance = models.JSONField(
        default=dict, blank=True
    )  # git commit, component source hashes, versions
    # What the rewards and advantages of this run were computed with
    # (webapp/runs/reward_settings.py): weights by component, scale_rewards, aggregation, advantage
    # epsilon, group size, and the trainer's own settings as its recorder read them. Set at
    # creation, overwritten by the trainer's values.
    reward_settings = models.JSONField(default=dict, blank=True)
    base_model = models.CharField(max_length=500, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    progress = models.FloatField(default=0.0)  # 0..1
    current_step = models.IntegerField(default=0)
    total_steps = models.IntegerField(null=True, blank=True)
    eta_seconds = models.FloatField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True)
    output_dir = models.CharField(max_length=1000, blank=True)
    cancel_requested = models.BooleanField(default=False)
    worker = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set by deletion.request_delete: the run is hidden, refused by ingestion, reaped in batches.
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["kind", "status"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def kind_title(self) -> str:
        """What the pages call this run's kind (the table's title, read now: a kind registered
        after start-up is titled too)."""
        job = RUN_KINDS.get(self.kind)
        return job.title if job else self.kind

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    def components(self) -> list:
        """The run's reward components (RewardComponent rows) in environment order: the columns of
        its score matrix."""
        from webapp.rollouts.models import RewardComponent

        if self.environment_id is None:
            return []
        return list(
            RewardComponent.objects.filter(environment_id=self.environment_id).order_by(
                "position", "id"
            )
        )

    def save(self, *args: Any, **kwargs: Any) -> None:
        fields = kwargs.get("update_fields")
        if fields is None or "config" in fields:
            self._settle_weights()
            if fields is not None:
                kwargs["update_fields"] = {*fields, "reward_settings"}
        super().save(*args, **kwargs)

    def _settle_weights(self) -> None:
        """A job config's reward_weights (a launch form, an ablation twin, a client's config) are
        the run's reward settings: stored there alone, so the run has one answer."""
        from webapp.runs.reward_settings import settle_config_weights

        if "reward_weights" not in (self.config or {}):
            return
        names = [c.name for c in self.components()] if self.environment_id else None
        self.config, self.reward_settings = settle_config_weights(
            self.config, self.reward_settings or {}, names
        )

    def reward_weights(self, components: list | None = None) -> dict[str, float]:
        """{component: weight} this run's rewards were summed with: its reward settings (the
        trainer's, or what it was created or launched with), else the environment's defaults.
        The one source: a job config's reward_weights move into the settings when it is saved.
        `components` (RewardComponent rows) saves a query when the caller has them."""
        if components is None:
            components = self.components()
        own = (self.reward_settings or {}).get("weights") or {}
        return {c.name: float(own.get(c.name, c.weight)) for c in components}

    def advantage_settings(self) -> dict[str, Any]:
        """How this run's advantages were computed: {"scale_rewards", "aggregation",
        "advantage_epsilon", "group_size"} (group_size None when unknown), the run's settings over
        its job config over TRL's defaults."""
        from webapp.runs.reward_settings import advantage_settings

        return advantage_settings(self.reward_settings or {}, self.config or {})

    def claim(self, worker: str) -> bool:
        """queued -> running, atomically. False when another worker (or a cancel)
        got there first."""
        return RUN_LEASES.claim_row(self.id, worker) and self._refresh()

    def _refresh(self) -> bool:
        """Reload the row; False when it is gone (a run may be deleted while a worker or an
        import holds it)."""
        try:
            self.refresh_from_db()
        except Run.DoesNotExist:
            return False
        return True

    def _finish(self, status: str, error: str = "") -> bool:
        # Only a live run may finish: a late "succeeded" must not overwrite a cancel,
        # and vice versa.
        n = (
            Run.objects.filter(id=self.id)
            .exclude(status__in=self.FINISHED)
            .update(
                status=status, finished_at=timezone.now(), error=error[-LOG_TAIL_CHARS:], pid=None
            )
        )
        self._refresh()
        return n == 1

    def mark_succeeded(self) -> bool:
        ok = self._finish(self.Status.SUCCEEDED)
        if ok:
            Run.objects.filter(id=self.id).update(progress=1.0)
        return ok

    def mark_failed(self, error: str) -> bool:
        return self._finish(self.Status.FAILED, error)

    def mark_cancelled(self) -> bool:
        return self._finish(self.Status.CANCELLED)

    def request_cancel(self) -> None:
        """Queued runs are cancelled at once; running ones are signalled by their worker."""
        Run.objects.filter(id=self.id).update(cancel_requested=True)
        Run.objects.filter(id=self.id, status=self.Status.QUEUED).update(
            status=self.Status.CANCELLED, finished_at=timezone.now()
        )
        self._refresh()

    def append_log(self, text: str) -> None:
        tail = (self.log_tail + text)[-LOG_TAIL_CHARS:]
        Run.objects.filter(id=self.id).update(log_tail=tail)
        self.log_tail = tail

    def set_progress(self, step: int, total: int | None, eta: float | None = None) -> None:
        progress = min(1.0, step / total) if total else 0.0
        Run.objects.filter(id=self.id).update(
            current_step=step,
            total_steps=total,
            progress=progress,
            eta_seconds=eta,
            heartbeat_at=timezone.now(),
        )


# Job runs as a lease queue (webapp/leases.py): a worker claims a queued run, its watch loop renews
# heartbeat_at (so does each progress report), and a run whose worker stopped beating is failed
# (webapp/runs/services.py reap_stale_runs), never handed to another worker.
RUN_LEASES = LeaseQueue(
    Run,
    ready=(Run.Status.QUEUED,),
    held=Run.Status.RUNNING,
    token="started_at",
    beat="heartbeat_at",
    holder="worker",
    stale_seconds=lambda: settings.WORKER_HEARTBEAT_SECONDS * STALE_BEATS,
)


class StepMetric(models.Model):
    """One scalar a trainer logged at one step (TRL's keys verbatim: loss, kl, reward,
    rewards/x/std...)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    step = models.IntegerField()
    name = models.CharField(max_length=200)
    value = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "name", "step"], name="stepmetric_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.step} {self.name}={self.value}"


class WorkerHeartbeat(models.Model):
    """A Celery worker's last sign of life, shown on the runs page."""

    name = models.CharField(max_length=200, unique=True)
    device = models.CharField(max_length=100, blank=True)
    queues = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True)
    current_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name

    def is_alive(self, max_age_seconds: float) -> bool:
        return (timezone.now() - self.last_seen).total_seconds() <= max_age_seconds

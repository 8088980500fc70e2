"""Saved ablations: a spec (components dropped / re-weighted, aggregation) and
its recomputed results."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Ablation(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="ablations")
    name = models.CharField(max_length=200)
    spec = (
        models.JSONField()
    )  # {"drop": [...], "weights": {name: w}, "scale_rewards": ..., "aggregation": ...}
    results = models.JSONField(default=dict)  # training.diagnostics.ablate()'s output, plus timings
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    # The twin GRPO run launched with this reward ("training ablation"), if any.
    twin = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "created_at"], name="ablation_run_created")]

    def __str__(self) -> str:
        return f"{self.name} (run {self.run_id})"

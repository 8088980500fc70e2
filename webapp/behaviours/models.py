"""Behaviours: a named, saved explorer query (plus an optional regular expression) owned by an
environment, so it applies to every run of it; and its per-step sums on each run (BehaviourStep),
from which the rate, the advantage gap and the onset follow (training/behaviours.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

# Explorer parameters that describe the view's page, not which rollouts it holds: not saved.
PAGE_PARAMS = ("sort", "order", "cursor", "limit", "replay")


class Behaviour(models.Model):
    environment = models.ForeignKey(
        "rollouts.Environment", on_delete=models.CASCADE, related_name="behaviours"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # The explorer's query parameters (q, min_<component>, label, split, ...), as the explorer's
    # URL carries them (webapp/explorer/params.py ExplorerQuery.from_params).
    query = models.JSONField(default=dict)
    # Checked on the candidates the query finds (the `regex` module, with a time limit per rollout).
    pattern = models.CharField(max_length=500, blank=True)
    critical = models.BooleanField(default=False)  # the gate fails a run past max_rate
    max_rate = models.FloatField(null=True, blank=True)  # a fraction of a step's rollouts, 0..1
    # Bumped whenever the definition changes: stored steps of another version are recomputed.
    version = models.IntegerField(default=1)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "name"], name="behaviour_env_name")
        ]

    def __str__(self) -> str:
        return self.name

    def redefine(self, query: dict, pattern: str) -> None:
        """A new definition: the stored steps no longer describe it."""
        self.query, self.pattern, self.version = query, pattern, self.version + 1
        self.save(update_fields=["query", "pattern", "version"])
        self.steps.all().delete()


class BehaviourStep(models.Model):
    """Per (behaviour, run, step): the step's rollouts when computed (a step that gains rollouts is
    recomputed), the matches, and the advantage sums of both sides (means and a standard error
    follow). Written by webapp/behaviours/services.py, per step, never per page view."""

    behaviour = models.ForeignKey(Behaviour, on_delete=models.CASCADE, related_name="steps")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    step = models.IntegerField()
    version = models.IntegerField()  # the behaviour's version it was computed for
    n_rollouts = models.IntegerField()
    n_matches = models.IntegerField()
    adv_in = models.FloatField(default=0.0)  # sum of the matches' advantages
    sq_in = models.FloatField(default=0.0)  # sum of their squares
    n_adv_in = models.IntegerField(default=0)  # matches with an advantage
    adv_out = models.FloatField(default=0.0)  # the same for the rest of the step
    sq_out = models.FloatField(default=0.0)
    n_adv_out = models.IntegerField(default=0)
    regex_timeouts = models.IntegerField(default=0)  # candidates whose pattern check timed out

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["behaviour", "run", "step"], name="behaviourstep_unique"
            )
        ]

    def row(self) -> tuple:
        return (
            self.step,
            self.n_rollouts,
            self.n_matches,
            self.adv_in,
            self.sq_in,
            self.n_adv_in,
            self.adv_out,
            self.sq_out,
            self.n_adv_out,
        )

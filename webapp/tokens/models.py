"""Per-token data: a rollout's token arrays (one compressed row beside the rollout) and the
per-step token statistics of a run.

The second, optional layer of a rollout: nothing in webapp/rollouts reads these tables except
the explorer's token sorts, which join by rollout id. Both are written by the ingestion service
in the batch's transaction, from the `tokens` object a rollout may carry. The object, the
storage layout and why it was chosen: docs/tokens.md.
"""

from __future__ import annotations

import math

from django.db import models

from webapp.tokens import codec

LOW_ENTROPY = 0.01  # nats: a token below this is "near-zero entropy" (a collapsing policy's mark)
RATIO_LOW, RATIO_HIGH = 0.5, 2.0  # importance ratio exp(d) outside this band counts as off-policy
# RolloutTokens' summaries the explorer sorts and filters by (sort=tokens.<name>, indexed)
TOKEN_SORT_FIELDS = ("mismatch", "mean_entropy", "masked_fraction", "tool_unmasked")


class RolloutTokens(models.Model):
    """One rollout's token arrays (one-to-one, apart from the rollout row so that rollout pages
    never read them) and the summaries the explorer sorts and filters by."""

    rollout = models.OneToOneField(
        "rollouts.Rollout", primary_key=True, on_delete=models.CASCADE, related_name="tokens"
    )
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, db_index=False, related_name="+")
    step = models.IntegerField()
    n_tokens = models.IntegerField()
    fields = models.CharField(max_length=200)  # the arrays recorded, comma-separated, FIELDS order
    data = models.BinaryField()  # webapp/tokens/codec.py; storage EXTERNAL on Postgres (0001)
    # Per-rollout summaries from the float64 values sent, over the tokens the statistics count
    # (module docstring); NULL where the arrays they need were not sent.
    mismatch = models.FloatField(null=True)  # mean |trainer - sampler log-prob|
    max_mismatch = models.FloatField(null=True)  # max |trainer - sampler log-prob|
    mean_entropy = models.FloatField(null=True)
    masked_fraction = models.FloatField(null=True)  # tokens with loss_mask 0, of all tokens
    tool_unmasked = models.IntegerField(null=True)  # tokens of tool/environment turns in the loss

    class Meta:
        indexes = [
            models.Index(fields=["run", "mismatch", "rollout"], name="tokens_run_mismatch"),
            models.Index(fields=["run", "mean_entropy", "rollout"], name="tokens_run_entropy"),
            models.Index(fields=["run", "masked_fraction", "rollout"], name="tokens_run_masked"),
            models.Index(fields=["run", "tool_unmasked", "rollout"], name="tokens_run_tool"),
        ]

    def arrays(self) -> codec.TokenArrays:
        return codec.decode(bytes(self.data))


class TokenStepStat(models.Model):
    """Per (run, step) sufficient statistics of the step's tokens, added to at ingest (several
    batches may carry one step), so the dashboard and the API read one row per step. The means and
    fractions are properties; each is None when no token carried what it needs."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, db_index=False, related_name="+")
    step = models.IntegerField()
    n_rollouts = models.IntegerField(default=0)  # rollouts with tokens
    n_tokens = models.BigIntegerField(default=0)  # every token of them
    n_pairs = models.BigIntegerField(default=0)  # counted tokens with both sampler and trainer
    sum_abs_delta = models.FloatField(default=0.0)  # sum |d|
    sum_k3 = models.FloatField(
        default=0.0
    )  # sum exp(d) - 1 - d: k3 estimate of KL(sampler||trainer)
    n_ratio_out = models.BigIntegerField(default=0)  # exp(d) outside [RATIO_LOW, RATIO_HIGH]
    max_abs_delta = models.FloatField(null=True)
    n_entropy = models.BigIntegerField(default=0)  # counted tokens with an entropy
    sum_entropy = models.FloatField(default=0.0)
    n_low_entropy = models.BigIntegerField(default=0)  # entropy < LOW_ENTROPY
    n_mask = models.BigIntegerField(default=0)  # tokens with a loss mask (counted or not)
    n_masked = models.BigIntegerField(default=0)  # of those, loss_mask 0
    n_tool_unmasked = models.BigIntegerField(default=0)  # tool/environment-turn tokens in the loss

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="tokenstepstat_unique")]

    @staticmethod
    def _ratio(num: float, den: float) -> float | None:
        return num / den if den and math.isfinite(num) else None

    @property
    def mean_abs_delta(self) -> float | None:
        return self._ratio(self.sum_abs_delta, self.n_pairs)

    @property
    def k3(self) -> float | None:
        return self._ratio(self.sum_k3, self.n_pairs)

    @property
    def ratio_out_fraction(self) -> float | None:
        return self._ratio(self.n_ratio_out, self.n_pairs)

    @property
    def mean_entropy(self) -> float | None:
        return self._ratio(self.sum_entropy, self.n_entropy)

    @property
    def low_entropy_fraction(self) -> float | None:
        return self._ratio(self.n_low_entropy, self.n_entropy)

    @property
    def masked_fraction(self) -> float | None:
        return self._ratio(self.n_masked, self.n_mask)

    def as_dict(self) -> dict[str, float | int | None]:
        """The API's and the charts' view of the row (docs/api.md)."""
        return {
            "step": self.step,
            "rollouts": self.n_rollouts,
            "tokens": self.n_tokens,
            "mismatch_tokens": self.n_pairs,
            "mean_abs_delta": self.mean_abs_delta,
            "k3": self.k3,
            "ratio_out_fraction": self.ratio_out_fraction,
            "max_abs_delta": self.max_abs_delta,
            "entropy_tokens": self.n_entropy,
            "mean_entropy": self.mean_entropy,
            "low_entropy_fraction": self.low_entropy_fraction,
            "mask_tokens": self.n_mask,
            "masked_fraction": self.masked_fraction,
            "tool_unmasked": self.n_tool_unmasked,
        }

"""Which model a GRPO launch starts from: the environment's latest SFT output by default, and a
warning before queueing one from an untrained base (the offline tiny model writes no valid answer:
a GRPO run from it has zero reward and every group zero-std, so nothing to learn).

The signal probe (training/probe.py) is the check: it samples the base model without updating and
says "do SFT first" when no completion succeeds. A probe already run on this base model and
environment is quoted; otherwise the form says so and asks for a confirmation before queueing.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.db.models import F
from django.urls import reverse

from webapp.runs.models import Run

TINY_PREFIX = "tiny:"  # the offline tiny model: random weights, never trained
UNTRAINED_ADVICE = "untrained base: expect no signal, run the probe first"


def latest_sft_output(env: str) -> Run | None:
    """The environment's latest SFT run that succeeded (its model is `run:<id>`)."""
    return (
        Run.objects.live()
        .filter(kind=Run.Kind.SFT, status=Run.Status.SUCCEEDED, environment__name=env)
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .first()
    )


def default_base_model(kind: str, env: str) -> tuple[str, Run | None]:
    """(base model, the SFT run it comes from or None): GRPO starts from the latest SFT output
    when the environment has one, anything else from the offline tiny model."""
    if kind == Run.Kind.GRPO:
        sft = latest_sft_output(env)
        if sft is not None:
            return f"run:{sft.id}", sft
    return f"{TINY_PREFIX}{env}", None


def is_untrained(base_model: str) -> bool:
    return base_model.strip().startswith(TINY_PREFIX)


@dataclass
class BaseCheck:
    """What the launch page says about a GRPO run's base model."""

    untrained: bool
    probe: Run | None  # the latest succeeded probe of this base model on this environment
    probe_url: str  # the probe form, filled with this base model and environment
    sft: Run | None  # an SFT output to start from instead

    @property
    def probe_says_ready(self) -> bool:
        verdict = ((self.probe.summary or {}).get("verdict") or "") if self.probe else ""
        return verdict.startswith("ready")

    @property
    def needs_confirmation(self) -> bool:
        return self.untrained and not self.probe_says_ready


def check_base(kind: str, env: str, base_model: str) -> BaseCheck | None:
    """None unless a GRPO run is about to start from an untrained base."""
    if kind != Run.Kind.GRPO or not is_untrained(base_model or ""):
        return None
    probe = (
        Run.objects.live()
        .filter(
            kind=Run.Kind.PROBE,
            status=Run.Status.SUCCEEDED,
            environment__name=env,
            base_model=base_model.strip(),
        )
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .first()
    )
    url = (
        reverse("jobs-launch", args=["probe"])
        + "?"
        + urlencode({"environment": env, "base_model": base_model.strip()})
    )
    return BaseCheck(True, probe, url, latest_sft_output(env))

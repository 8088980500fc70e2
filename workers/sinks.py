"""The database sink: a training job's recorder writes through the same ingestion service
as the API."""

from __future__ import annotations

import logging
from typing import Any

from training.sinks import Groups, storable
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run

log = logging.getLogger(__name__)


class DatabaseSink:
    """Implements training.sinks.Sink against the Django models of one run."""

    def __init__(self, run_id: int) -> None:
        self.run = Run.objects.get(id=run_id)

    def write_groups(self, groups: Groups) -> None:
        try:
            # storable(): a NUL a tokenizer decoded must not make ingestion refuse the whole batch
            ingest_groups(self.run, {"groups": storable(groups)})
        except FieldError as e:
            # A recorder bug must not kill a training run; it must be loud in the run's log.
            self.log(f"ingestion refused a batch of {len(groups)} groups: {e.errors[:3]}")
            log.error("ingestion refused a batch for run %s: %s", self.run.id, e.errors[:3])

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        record_metrics(self.run, {"metrics": [{"step": step, "values": values}]})

    def write_settings(self, settings: dict[str, Any]) -> None:
        """The trainer's reward settings become the run's (they win over the
        launch config's, logged)."""
        from webapp.runs import reward_settings

        names = [c.name for c in self.run.components()]
        try:
            clean = reward_settings.validate(storable(settings), names)
        except FieldError as e:
            self.log(f"the trainer's reward settings were refused: {e}")
            log.error("reward settings refused for run %s: %s", self.run.id, e)
            return
        reward_settings.apply(self.run, clean, clean.get("source") or "trainer")

    def log(self, line: str) -> None:
        self.run.append_log(line.rstrip("\n") + "\n")

    def progress(self, step: int, total: int) -> None:
        self.run.set_progress(step, total, eta=_eta(self.run, step, total))

    def close(self) -> None:
        pass


def _eta(run: Run, step: int, total: int) -> float | None:
    from django.utils import timezone

    if not run.started_at or step <= 0 or not total:
        return None
    elapsed = (timezone.now() - run.started_at).total_seconds()
    return elapsed / step * max(0, total - step)

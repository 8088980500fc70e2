"""The bridge from a Run row to a training/ job: the job's config dataclass, resolved
from the run."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings

from training.jobs import config_class
from webapp.runs.launch import output_dir, resolve_model
from webapp.runs.models import Run

__all__ = ["job_config", "output_dir"]


def job_config(run: Run) -> Any:
    """The job dataclass for `run`: run.config filtered to the class's fields, with the app's own
    conventions translated (reward_weights by name -> list in component order, chains -> paths)."""
    cls = config_class(run.kind)
    names = {f.name for f in dataclasses.fields(cls)}
    data = {k: v for k, v in (run.config or {}).items() if k in names}
    data["output_dir"] = str(output_dir(run))
    if "base_model" in names:
        data["base_model"] = resolve_model(run.base_model or data.get("base_model", ""))
    # The run's own weights (Run.reward_weights: its reward settings, where a launch's weights are
    # stored, else the environment's defaults), as the list in component order the trainer takes.
    # A list left in a config that Run.save could not map (no environment) is kept as written.
    if (
        "reward_weights" in names
        and run.environment_id
        and not isinstance(data.get("reward_weights"), list)
    ):
        data["reward_weights"] = list(run.reward_weights().values())
    if run.environment_id and "env" in names:
        data["env"] = run.environment.name
    parent = run.parent if run.parent_id else None
    if parent is not None and parent.kind == "teacher" and "data" in names and not data.get("data"):
        data["data"] = (parent.summary or {}).get(
            "dataset", ""
        )  # SFT on the teacher's kept trajectories
    if "device" in names and settings.WORKER_DEVICE != "auto":
        data["device"] = settings.WORKER_DEVICE
    return cls.from_dict(data)

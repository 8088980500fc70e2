"""The bridge from a Run row to a training/ job: which module and config class, and the resolved config."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from django.conf import settings

from webapp.runs.models import Run

JOBS: dict[str, tuple[str, str]] = {
    "sft": ("training.sft", "SFTJobConfig"),
    "grpo": ("training.grpo", "GRPOJobConfig"),
    "dpo": ("training.dpo", "DPOJobConfig"),
    "eval": ("training.eval", "EvalJobConfig"),
    "teacher": ("training.teacher", "TeacherJobConfig"),
    "probe": ("training.probe", "ProbeJobConfig"),
}
TINY_PREFIX = "tiny:"  # base_model "tiny:diagram" = the offline tiny model built for that environment


def job_module(kind: str) -> Any:
    if kind not in JOBS:
        raise ValueError(f"kind: {kind!r} is not a job kind ({', '.join(JOBS)})")
    return importlib.import_module(JOBS[kind][0])


def config_class(kind: str) -> type:
    return getattr(job_module(kind), JOBS[kind][1])


def runs_on_several_gpus(kind: str) -> bool:
    """The trainers (TrainJobConfig: SFT, GRPO, DPO) can run one process per GPU; eval, teacher and
    probe jobs would run N identical copies."""
    from training.config import TrainJobConfig

    return issubclass(config_class(kind), TrainJobConfig)


def output_dir(run: Run) -> Path:
    return Path(settings.RUNS_DIR) / str(run.id)


RUN_PREFIX = "run:"  # base_model "run:12" = the model that run 12 trained (chains: SFT -> GRPO -> eval)


def resolve_model(base_model: str) -> str:
    """Translate the app's model references into a path; anything else (a folder, a hub id) as given."""
    if base_model.startswith(TINY_PREFIX):
        from training.tiny import ensure_tiny_model

        return str(ensure_tiny_model(base_model[len(TINY_PREFIX):], Path(settings.MODELS_DIR)))
    if base_model.startswith(RUN_PREFIX):
        run = Run.objects.get(id=int(base_model[len(RUN_PREFIX):]))
        out = Path(run.output_dir or output_dir(run))
        return str(out / "model") if (out / "model").is_dir() else str(out)
    return base_model


def job_config(run: Run) -> Any:
    """The job dataclass for `run`: run.config filtered to the class's fields, with the app's own
    conventions translated (reward_weights by name -> list in component order, chains -> paths)."""
    cls = config_class(run.kind)
    names = {f.name for f in dataclasses.fields(cls)}
    data = {k: v for k, v in (run.config or {}).items() if k in names}
    data["output_dir"] = str(output_dir(run))
    if "base_model" in names:
        data["base_model"] = resolve_model(run.base_model or data.get("base_model", ""))
    weights = (run.config or {}).get("reward_weights")
    if "reward_weights" in names and isinstance(weights, dict) and run.environment_id:
        comps = run.environment.components.order_by("position", "id").values_list("name", "weight")
        data["reward_weights"] = [float(weights.get(n, w)) for n, w in comps]
    if run.environment_id and "env" in names:
        data["env"] = run.environment.name
    parent = run.parent if run.parent_id else None
    if parent is not None and parent.kind == "teacher" and "data" in names and not data.get("data"):
        data["data"] = (parent.summary or {}).get("dataset", "")  # SFT on the teacher's kept trajectories
    if "device" in names and settings.WORKER_DEVICE != "auto":
        data["device"] = settings.WORKER_DEVICE
    return cls.from_dict(data)

"""The one list of job kinds: kind -> title, config dataclass and `main`.

The launch forms, the CLI, the worker and the queue router all read it; a new job kind is one entry
here plus its module (`<kind>.py` with a config dataclass and `main(config, sink, progress)`).
Modules are imported on first use: listing the kinds must not load torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobKind:
    kind: str
    title: str  # what the pages call it
    module: str  # importable module holding the config class and main()
    config_name: str
    cpu_when_scripted: bool = False  # a scripted teacher needs no GPU: it goes to the default queue

    def config_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.config_name)

    def main(self) -> Callable[..., dict[str, Any]]:
        return importlib.import_module(self.module).main


JOBS: dict[str, JobKind] = {
    job.kind: job
    for job in (
        JobKind("sft", "SFT", "training.sft", "SFTJobConfig"),
        JobKind("grpo", "GRPO", "training.grpo", "GRPOJobConfig"),
        JobKind("dpo", "DPO", "training.dpo", "DPOJobConfig"),
        JobKind("eval", "Eval", "training.eval", "EvalJobConfig"),
        JobKind(
            "teacher",
            "Teacher trajectories",
            "training.teacher",
            "TeacherJobConfig",
            cpu_when_scripted=True,
        ),
        JobKind("probe", "Signal probe", "training.probe", "ProbeJobConfig"),
    )
}


def get_job(kind: str) -> JobKind:
    """The registry entry; a ValueError naming the kind (and the known ones) otherwise."""
    if kind not in JOBS:
        raise ValueError(f"kind: {kind!r} is not a job kind ({', '.join(JOBS)})")
    return JOBS[kind]


def config_class(kind: str) -> type:
    return get_job(kind).config_class()


def runs_on_several_gpus(kind: str) -> bool:
    """The trainers (TrainJobConfig: SFT, GRPO, DPO) can run one process per GPU; eval, teacher and
    probe jobs would run N identical copies."""
    from training.config import TrainJobConfig

    return issubclass(config_class(kind), TrainJobConfig)

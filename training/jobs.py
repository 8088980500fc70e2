"""The one table of run kinds: kind -> title, traits, config dataclass and `main`.

The run model's choices, the launch forms, the run pages, the CLI, the worker and the queue router
all read it; a new job kind is one entry here plus its module (`<kind>.py` with a config dataclass
and `main(config, sink, progress)`). `import` is the one kind that is not a job: its runs are fed by
a trainer elsewhere. Modules are imported on first use: listing the kinds must not load torch.
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
    module: str  # module with the config class and main() (".sft": in this package); "" for imports
    config_name: str
    cpu_when_scripted: bool = False  # a scripted teacher needs no GPU: it goes to the default queue
    produces_model: bool = False  # its output is a model another job can start from ("run:<id>")
    records_rollouts: bool = False  # stores rollouts, so the run page has a reward-health verdict
    no_verdict: str = ""  # why a kind without rollouts has no verdict (shown in its place)
    launchable: bool = True  # a job the workers run; False for runs fed from elsewhere
    one_step: bool = False  # its result is one step's: the run page shows a table, not charts

    def config_class(self) -> type:
        return getattr(importlib.import_module(self.module, __package__), self.config_name)

    def main(self) -> Callable[..., dict[str, Any]]:
        return importlib.import_module(self.module, __package__).main


RUN_KINDS: dict[str, JobKind] = {
    job.kind: job
    for job in (
        JobKind(
            "teacher",
            "Teacher trajectories",
            ".teacher",
            "TeacherJobConfig",
            cpu_when_scripted=True,
            one_step=True,
            no_verdict="Teacher trajectories are filtered by reward, not trained on it: there is "
            "no reward-health verdict.",
        ),
        JobKind(
            "sft",
            "SFT",
            ".sft",
            "SFTJobConfig",
            produces_model=True,
            no_verdict="SFT runs train on a dataset and store no rollouts by design: there is no "
            "reward-health verdict.",
        ),
        JobKind(
            "grpo",
            "GRPO",
            ".grpo",
            "GRPOJobConfig",
            produces_model=True,
            records_rollouts=True,
        ),
        JobKind(
            "dpo",
            "DPO",
            ".dpo",
            "DPOJobConfig",
            produces_model=True,
            no_verdict="DPO runs train on preference pairs and store no rollouts by design: there "
            "is no reward-health verdict.",
        ),
        JobKind("eval", "Eval", ".eval", "EvalJobConfig", records_rollouts=True, one_step=True),
        JobKind(
            "probe",
            "Signal probe",
            ".probe",
            "ProbeJobConfig",
            no_verdict="A probe samples once to judge the signal: its verdict is at the top of the "
            "page.",
        ),
        JobKind("import", "Import", "", "", records_rollouts=True, launchable=False),
    )
}
# The kinds the workers run, in launch-menu order.
JOBS: dict[str, JobKind] = {k: job for k, job in RUN_KINDS.items() if job.launchable}


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
    from .config import TrainJobConfig

    return issubclass(config_class(kind), TrainJobConfig)

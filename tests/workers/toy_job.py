"""A toy job kind for tests/workers/test_job_kinds.py: a config dataclass and a main(), which is
all a new job kind needs besides its row in training.jobs.RUN_KINDS."""

from __future__ import annotations

from dataclasses import dataclass

from training.config import JobConfig, help_field


@dataclass
class ToyJobConfig(JobConfig):
    """Counts to `n` and logs each number."""

    requires_model = False
    n: int = help_field(3, "how far to count")


def main(config: ToyJobConfig, sink=None, progress=None) -> dict:
    for i in range(config.n):
        if sink is not None:
            sink.log(f"toy counted {i + 1}")
    return {"kind": "toy", "counted": config.n}

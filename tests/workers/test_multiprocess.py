"""A job under several processes, as `accelerate launch --multi_gpu` runs it on a multi-GPU host.

No GPU exists here, so two CPU processes under torchrun (gloo) stand in for two GPUs: the same
`python -m workers.job RUN_ID` in each process, RANK / WORLD_SIZE set, TRL's distributed gather.
(accelerate itself, asked for 2 processes on a host without GPUs, quietly runs one; the worker
refuses that case instead, tested in test_launch.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import database_url_for_children

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_two_process_grpo_job_records_both_processes_rollouts_once(transactional_db, tmp_path):
    from training.environments import get_environment
    from training.tiny import ensure_tiny_model
    from webapp.rollouts.models import Group, Rollout
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import Run, StepMetric
    from workers.tasks import child_env

    tiny = ensure_tiny_model("diagram", tmp_path / "tiny-cache")
    env = environment_from_training(get_environment("diagram"))
    config = {
        "max_steps": 2,
        "num_prompts": 4,
        "num_generations": 4,
        # One prompt's group per process per step: 2 groups a step in all
        "per_device_batch_size": 4,
        "max_completion_length": 16,
        "logging_steps": 1,
        "num_gpus": 2,
    }
    run = create_run(
        name="two processes", kind="grpo", environment=env, config=config, base_model=str(tiny)
    )
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    child = dict(
        child_env(),
        DATABASE_URL=database_url_for_children(),
        RD_RUNS_DIR=str(tmp_path / "runs"),
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "workers.job",
            str(run.id),
        ],
        cwd=ROOT,
        env=child,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run.refresh_from_db()
    groups = list(Group.objects.filter(run=run).order_by("step", "key"))
    assert [g.step for g in groups] == [1, 1, 2, 2]  # both processes' prompts, gathered by TRL
    assert len({(g.step, g.key) for g in groups}) == 4  # each recorded once, by process 0 alone
    assert Rollout.objects.filter(run=run).count() == 16
    for g in groups:
        advantages = [r.advantage for r in g.rollouts.all()]
        assert len(advantages) == 4 and abs(sum(advantages)) < 1e-4  # TRL's group-normalised values
    assert run.log_tail.count("starting grpo job") == 1 and run.log_tail.count("finished:") == 1
    assert run.summary["global_step"] == 2 and run.config["resolved"]["per_device_batch_size"] == 4
    assert set(StepMetric.objects.filter(run=run, name="loss").values_list("step", flat=True)) == {
        1,
        2,
    }

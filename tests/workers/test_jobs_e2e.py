"""Training jobs end to end: launched through the view, run by a real Celery worker process on the
configured broker, in a child process, on the tiny offline model; recorded rollout by rollout."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.broker]

TINY_GRPO = {
    "cfg_max_steps": 2,  # two optimizer steps: two recorded generations
    "cfg_num_prompts": 4,  # each step samples 2 prompts
    "cfg_num_generations": 4,  # smallest group with within-group variance
    "cfg_per_device_batch_size": 8,  # 2 prompts x 4 completions
    "cfg_max_completion_length": 16,  # short rollouts: generation dominates CPU time
    "cfg_logging_steps": 1,
    # TRL writes its own advantages to parquet: the reference we compare to
    "cfg_log_completions": True,
}


def launch_data(kind: str, **overrides) -> dict:
    """POST data for the launch form: every field's initial value, then the overrides."""
    from webapp.runs.forms import LaunchForm

    form = LaunchForm(kind, initial={"environment": "diagram", "base_model": "tiny:diagram"})
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                data[name] = "on"
            continue
        data[name] = value
    data.update(name=f"e2e {kind}", num_gpus=1)
    if kind == "grpo":  # from the untrained tiny model on purpose: confirmed (base_models)
        data["launch_anyway"] = "on"
    for k, v in overrides.items():
        if v is False:
            data.pop(k, None)
        else:
            data[k] = "on" if v is True else v
    return data


def _launch(client, kind: str, **overrides):
    from webapp.runs.models import Run

    res = client.post(f"/jobs/launch/{kind}/", launch_data(kind, **overrides))
    assert res.status_code == 302, res.content.decode()[:3000]
    return Run.objects.latest("id")


def _finished(run):
    run.refresh_from_db()
    return run.status in ("succeeded", "failed", "cancelled") and run


def test_it_runs_a_grpo_job_and_stores_trls_own_advantages(worker_process, client_as):
    import pandas as pd

    from webapp.rollouts.models import Group, Rollout
    from webapp.runs.models import StepMetric

    run = _launch(client_as("trainer"), "grpo", **TINY_GRPO)
    run = wait_for(lambda: _finished(run), timeout=400, interval=1)
    assert run.status == "succeeded", f"{run.error}\n{run.log_tail}"
    assert run.progress == 1.0 and run.current_step == 2

    assert Group.objects.filter(run=run).count() == 4
    rollouts = list(Rollout.objects.filter(run=run).prefetch_related("scores__component"))
    assert len(rollouts) == 16
    assert all(
        {s.component.name for s in r.scores.all()}
        == {"json_valid", "schema_valid", "semantic_coverage", "layout_quality"}
        for r in rollouts
    )

    files = sorted((Path(run.output_dir) / "completions").glob("completions_*.parquet"))
    assert files, "TRL wrote no completions parquet"
    checked = 0
    for f in files:
        df = pd.read_parquet(f)
        for step, completion, advantage in zip(
            df["step"], df["completion"], df["advantage"], strict=True
        ):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            ours = [r.advantage for r in rollouts if r.step == step and r.completion == text]
            assert ours and min(abs(a - advantage) for a in ours) < 1e-5
            checked += 1
    assert checked >= 8

    for step in (1, 2):
        trl_reward = StepMetric.objects.get(run=run, step=step, name="reward").value
        ours = [r.reward for r in rollouts if r.step == step and r.reward is not None]
        assert sum(ours) / len(ours) == pytest.approx(trl_reward, abs=1e-5)


def test_it_cancels_a_running_job(worker_process, client_as):
    long_run = dict(TINY_GRPO, cfg_max_steps=200, cfg_log_completions=False)
    client = client_as("trainer")
    run = _launch(client, "grpo", **long_run)
    wait_for(lambda: (run.refresh_from_db() or run.status == "running") and run.pid, timeout=120)
    pid = run.pid
    assert client.post(f"/jobs/{run.id}/cancel/").status_code == 302
    run = wait_for(lambda: _finished(run), timeout=120, interval=0.5)
    assert run.status == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_it_fails_a_killed_job_and_keeps_its_rollouts(worker_process, client_as):
    from webapp.rollouts.models import Rollout

    long_run = dict(TINY_GRPO, cfg_max_steps=200, cfg_log_completions=False)
    run = _launch(client_as("trainer"), "grpo", **long_run)
    wait_for(lambda: Rollout.objects.filter(run=run).exists(), timeout=240, interval=1)
    run.refresh_from_db()
    os.kill(run.pid, signal.SIGKILL)  # what the kernel's OOM killer does
    run = wait_for(lambda: _finished(run), timeout=60, interval=0.5)
    assert run.status == "failed" and "signal 9" in run.error
    assert Rollout.objects.filter(run=run).count() >= 8


def test_it_refuses_an_invalid_config_naming_the_field(client_as, db):
    from webapp.runs.models import Run

    res = client_as("trainer").post(
        "/jobs/launch/grpo/", launch_data("grpo", **dict(TINY_GRPO, cfg_per_device_batch_size=6))
    )
    assert res.status_code == 200
    assert b"multiple of num_generations" in res.content
    assert not Run.objects.exists()


def test_it_forbids_a_viewer_to_launch(client_as, db):
    assert client_as("viewer").get("/jobs/launch/grpo/").status_code == 403
    assert client_as("trainer").get("/jobs/launch/grpo/").status_code == 200

"""Queueing: routing by kind, chains that wait for their parent, the demo chain queued once."""

import pytest

from webapp.runs.models import Run


def test_it_queues_the_demo_chain_once_with_parents_and_models(db, monkeypatch, make_user):
    from webapp.runs import launch

    make_user("demo", "admin")
    sent: list[int] = []
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: sent.append(run_id) or "gpu")
    lines = launch.queue_demo_chain()
    runs = {r.name: r for r in Run.objects.all()}
    assert len(runs) == len(lines) - 1 == 6
    teacher, sft, grpo = runs["demo · teacher"], runs["demo · sft"], runs["demo · grpo"]
    before, after = runs["demo · eval before sft"], runs["demo · eval after grpo"]
    middle = runs["demo · eval after sft"]
    assert middle.parent == sft and middle.base_model == f"run:{sft.id}"
    assert sorted(sent) == sorted([teacher.id, before.id])  # the others wait for their parent
    assert (
        sft.parent == teacher
        and sft.base_model == "tiny:diagram"
        and sft.config["start_after_parent"]
    )
    assert grpo.parent == sft and grpo.base_model == f"run:{sft.id}"
    assert after.parent == grpo and after.base_model == f"run:{grpo.id}"
    assert lines[-1].endswith(f"/jobs/compare/?run={before.id}&run={middle.id}&run={after.id}")
    again = launch.queue_demo_chain()
    assert again[0].startswith("demo training chain already queued") and again[1] == lines[-1]
    assert Run.objects.count() == 6


def test_it_feeds_sft_the_teachers_dataset_and_grpo_the_sft_model(db, tmp_path, settings):
    from training.environments import get_environment
    from webapp.rollouts.services import create_run, environment_from_training
    from workers.jobs import job_config

    settings.RUNS_DIR = tmp_path
    env = environment_from_training(get_environment("diagram"))
    teacher = create_run(name="t", kind="teacher", environment=env, config={"teacher": "scripted"})
    teacher.summary = {"dataset": str(tmp_path / "sft.jsonl")}
    teacher.save()
    sft = create_run(
        name="s",
        kind="sft",
        environment=env,
        config={"full_finetune": True, "ablation_of": 3},
        parent=teacher,
        base_model="/models/x",
    )
    cfg = job_config(sft)
    assert cfg.data == str(tmp_path / "sft.jsonl") and cfg.base_model == "/models/x"
    assert cfg.output_dir == str(tmp_path / str(sft.id))
    (tmp_path / str(sft.id) / "model").mkdir(parents=True)
    grpo = create_run(
        name="g",
        kind="grpo",
        environment=env,
        config={"reward_weights": {"json_valid": 0.0}},
        parent=sft,
        base_model=f"run:{sft.id}",
    )
    cfg = job_config(grpo)
    assert cfg.base_model == str(tmp_path / str(sft.id) / "model")
    names = [c.name for c in env.components.order_by("position", "id")]
    assert cfg.reward_weights[names.index("json_valid")] == 0.0 and len(cfg.reward_weights) == 4


def test_it_overlays_runs_on_the_compare_page_as_a_list_of_figures(client_as, run):
    import json
    import re

    from tests.conftest import make_group
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(
        run,
        {
            "groups": [
                make_group(s, "k", [{"correct": 1.0}, {"correct": float(s % 2)}]) for s in range(3)
            ]
        },
    )
    html = client_as("viewer").get(f"/jobs/compare/?run={run.id}").content.decode()
    raw = re.search(
        r'<script id="compare-figures" type="application/json">(.*?)</script>', html, re.S
    ).group(1)
    figures = json.loads(raw)
    assert isinstance(figures, list) and figures[0]["data"][0]["x"] == [0, 1, 2]
    assert {f["layout"]["title"]["text"] for f in figures[1:]} >= {"correct mean"}
    bad = client_as("viewer").get("/jobs/compare/?run=x")
    assert bad.status_code == 400


def test_it_sets_held_out_evals_side_by_side_on_the_compare_page(client_as, env3):
    import json
    import re

    from tests.conftest import make_group
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run

    def eval_run(name, groups, kind="eval"):
        run = create_run(
            name=name, kind=kind, environment=env3, config={}, base_model=f"model-{name}"
        )
        ingest_groups(run, {"groups": [{**g, "split": "holdout"} for g in groups]})
        return run

    # before: 2 groups, correct 0/2 and 1/2; after: one group of 4 with 3 correct, and
    # format always met
    before = eval_run(
        "before",
        [
            make_group(0, "a", [{"correct": 0.0, "format": 1.0}] * 2),
            make_group(0, "b", [{"correct": 1.0, "format": 1.0}, {"correct": 0.0, "format": 0.0}]),
        ],
    )
    after = eval_run(
        "after",
        [
            make_group(
                5, "a", [{"correct": 1.0, "format": 1.0}] * 3 + [{"correct": 0.0, "format": 1.0}]
            )
        ],
    )
    r = client_as("viewer").get(f"/jobs/compare/?run={after.id}&run={before.id}")
    evals = r.context["evals"]
    assert [row["run"].id for row in evals["rows"]] == [after.id, before.id]  # the order asked for
    assert evals["names"] == ["correct", "format"]
    by_name = {row["run"].name: row for row in evals["rows"]}
    assert by_name["before"]["means"] == [pytest.approx(0.25), pytest.approx(0.75)]
    assert by_name["after"]["means"] == [pytest.approx(0.75), pytest.approx(1.0)]
    assert (by_name["before"]["groups"], by_name["before"]["rollouts"]) == (2, 4)
    html = r.content.decode()
    assert "Held-out evals" in html and "model-before" in html
    raw = re.search(
        r'<script id="eval-figure" type="application/json">(.*?)</script>', html, re.S
    ).group(1)
    bars = json.loads(raw)["data"]
    assert [b["type"] for b in bars] == ["bar", "bar"] and bars[1]["y"] == [
        pytest.approx(0.25),
        pytest.approx(0.75),
    ]
    # Training runs alone: no eval section.
    grpo = eval_run("grpo", [make_group(0, "a", [{"correct": 1.0}, {"correct": 0.0}])], kind="grpo")
    assert client_as("viewer").get(f"/jobs/compare/?run={grpo.id}").context["evals"] is None


def test_job_children_let_idle_openmp_threads_sleep_unless_told_otherwise(monkeypatch):
    from workers.tasks import child_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = child_env()
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["PYTHONUNBUFFERED"] == "1"
    assert env["RD_WORKER_PID"].isdigit()
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # an operator's explicit choice wins
    assert child_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_it_runs_a_several_gpu_job_under_accelerate_and_refuses_one_it_cannot_place(
    env3, settings, monkeypatch
):
    from webapp.rollouts.services import create_run
    from workers.tasks import _child_command, run_job

    one = create_run(name="one", kind="grpo", environment=env3, config={})
    assert _child_command(one, gpus_here=0)[1:] == ["-m", "workers.job", str(one.id)]
    four = create_run(name="four", kind="grpo", environment=env3, config={"num_gpus": 4})
    cmd = _child_command(four, gpus_here=8)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in cmd
    assert cmd[cmd.index("--num_processes") + 1] == "4" and cmd[-3:] == [
        "-m",
        "workers.job",
        str(four.id),
    ]
    assert (
        int(cmd[cmd.index("--main_process_port") + 1]) > 0
    )  # a free port each: jobs side by side on a host
    with pytest.raises(ValueError, match=r"^num_gpus: the job asks for 4 GPUs, this worker has 2$"):
        _child_command(four, gpus_here=2)
    evals = create_run(name="eval", kind="eval", environment=env3, config={"num_gpus": 2})
    with pytest.raises(
        ValueError, match=r"^num_gpus: only SFT, GRPO and DPO jobs run on several GPUs, not eval$"
    ):
        _child_command(evals, gpus_here=8)
    # On this CPU worker the run fails with that reason instead of silently training in one process.
    settings.WORKER_DEVICE = "cpu"
    settings.RUNS_DIR = settings.VAR_DIR / "test-runs"
    monkeypatch.setattr(
        "django.db.close_old_connections", lambda: None
    )  # it would close the test's transaction
    assert "failed" in run_job.apply(args=[four.id]).get()
    four.refresh_from_db()
    assert four.status == "failed" and four.error.startswith(
        "num_gpus: the job asks for 4 GPUs, this worker has 0"
    )


def test_its_launch_form_keeps_several_gpus_for_the_trainers(db):
    from tests.workers.test_jobs_e2e import launch_data
    from webapp.runs.forms import LaunchForm

    form = LaunchForm("eval", launch_data("eval", num_gpus=2))
    assert (
        not form.is_valid()
        and "only SFT, GRPO and DPO jobs run on several GPUs" in form.errors["num_gpus"][0]
    )
    assert LaunchForm("eval", launch_data("eval", num_gpus=1)).is_valid()
    grpo = LaunchForm("grpo", launch_data("grpo", num_gpus=2))
    assert grpo.is_valid(), grpo.errors and grpo.cleaned_data["num_gpus"] == 2


def test_it_sends_the_job_by_name_only_after_the_run_is_committed(
    transactional_db, monkeypatch, env3
):
    from django.db import transaction

    from webapp.celery import app
    from webapp.runs.launch import launch_run

    sent: list[tuple] = []
    monkeypatch.setattr(
        app, "send_task", lambda name, args, queue: sent.append((name, args, queue))
    )
    with transaction.atomic():
        run = launch_run(name="g", kind="grpo", environment=env3, config={})
        assert sent == []  # a worker must not get an id it cannot read yet
    assert sent == [("workers.tasks.run_job", [run.id], "gpu")]
    teacher = launch_run(name="t", kind="teacher", environment=env3, config={"teacher": "scripted"})
    assert sent[-1] == ("workers.tasks.run_job", [teacher.id], "default")  # scripted: no GPU needed
    child = launch_run(name="c", kind="sft", environment=env3, config={}, parent=teacher)
    assert child.config["start_after_parent"] and len(sent) == 2  # waits for its parent


def test_it_refuses_an_unknown_job_kind_before_creating_anything(db, env3):
    from webapp.runs.launch import launch_run

    with pytest.raises(ValueError, match="kind: 'ppo' is not a job kind"):
        launch_run(name="x", kind="ppo", environment=env3, config={})
    assert not Run.objects.exists()


def test_webapp_never_imports_workers():
    """The dependency direction: workers imports webapp and training; webapp sends tasks by name."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "webapp"
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [
                f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] == "workers"
            ]
    assert offenders == []


def test_a_failed_stage_fails_every_run_chained_behind_it_not_only_its_children(
    db, monkeypatch, make_user
):
    """Seen on the GPU machine: SFT failed, its children (eval, GRPO) were failed 'not started', and
    the eval queued behind GRPO stayed queued forever (a cascade one level deep)."""
    from webapp.runs import launch
    from workers.tasks import _after

    make_user("demo", "admin")
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")
    launch.queue_demo_chain()
    runs = {r.name: r for r in Run.objects.all()}
    sft = runs["demo · sft"]
    Run.objects.filter(id=sft.id).update(status=Run.Status.RUNNING)
    sft.refresh_from_db()
    sft.mark_failed("boom")
    _after(sft)
    behind = ["demo · eval after sft", "demo · grpo", "demo · eval after grpo"]
    states = {name: Run.objects.get(id=runs[name].id) for name in behind}
    assert {name: r.status for name, r in states.items()} == dict.fromkeys(behind, "failed")
    assert states["demo · eval after grpo"].error.startswith(
        f"not started: parent run {runs['demo · grpo'].id} failed"
    )

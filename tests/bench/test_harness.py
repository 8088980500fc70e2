"""The benchmarks' shared harness: databases by name, the load average beside each figure, ratios,
timing and progress (one line per 10% when the output is not a terminal)."""

from __future__ import annotations

import os
import re

import pytest

from bench import harness
from bench.harness import TenPercent, track

on_postgres = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
    reason="needs DATABASE_URL=postgres://...",
)


@on_postgres
def test_it_creates_and_drops_a_database_by_name():
    name = f"{harness.database_name()}_harness_{os.getpid()}"
    try:
        assert harness.create_database(name) is True
        assert harness.database_exists(name)
        assert harness.create_database(name) is False  # already there: left alone
    finally:
        harness.drop_database(name)
    assert not harness.database_exists(name)
    harness.drop_database(name)  # dropping what is gone is fine


def test_it_finds_a_seeded_run_again_by_name(db):
    run = harness.bench_run("bench-harness-test", "bench-harness", config={"num_generations": 8})
    assert harness.bench_run("bench-harness-test", "bench-harness") == run
    assert [c.name for c in run.components()] == list(harness.COMPONENT_NAMES)
    assert (run.kind, run.status) == ("grpo", "running")


def test_it_ingests_batches_with_progress(db, capsys):
    import numpy as np

    from bench.pages import STEPS, synthetic_step

    run = harness.bench_run("bench-harness-ingest", "bench-4c", harness.COMPONENTS)
    rng = np.random.default_rng(0)
    batches = ([*synthetic_step(s, 2, rng)] for s in (0, STEPS - 1))
    assert harness.ingest_batches(run, batches, 32, "seeding") > 0
    assert run.rollouts.count() == 32
    assert capsys.readouterr().out.splitlines()[-1].startswith("seeding: 100% (32/32")


def test_it_refuses_a_database_that_is_not_postgres(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "sqlite:///db.sqlite3")
    with pytest.raises(SystemExit, match="Postgres"):
        harness.require_postgres()


def test_it_names_another_database_on_the_same_server(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rd_x?sslmode=disable")
    assert harness.database_name() == "rd_x"
    assert harness.database_url("rd_y") == "postgres://postgres@127.0.0.1:5432/rd_y?sslmode=disable"


def test_it_prints_the_load_average_beside_a_figure(capsys):
    harness.report("explorer p1: 12.3 ms")
    assert re.fullmatch(r"explorer p1: 12\.3 ms  \(load \d+\.\d\d\)\n", capsys.readouterr().out)
    assert re.fullmatch(
        r"load average: \d+\.\d\d \d+\.\d\d \d+\.\d\d \(\d+ CPUs, shared with other work\)",
        harness.load_line(),
    )


def test_it_formats_ratios():
    assert harness.ratio(3.0, 2.0) == "1.50x"
    assert harness.ratio(1.0, 3.0, 1) == "0.3x"
    assert harness.ratio(1.0, 0.0) == "n/a"


def test_it_times_after_the_warmup_and_keeps_the_last_result():
    calls = []
    t = harness.timed(lambda: calls.append(1) or len(calls), repeat=3, warmup=2)
    assert len(calls) == 5 and t.result == 5
    assert 0 <= t.best <= t.median and t.ms == t.median * 1000


def test_it_changes_a_component_without_touching_the_shared_list():
    changed = harness.components(format={"weight": 0.5})
    assert [c["weight"] for c in changed] == [1.0, 0.5, 0.5, 0.1]
    assert harness.COMPONENTS[1]["weight"] == 0.2
    assert tuple(c["name"] for c in changed) == harness.COMPONENT_NAMES


def test_it_prints_a_line_per_ten_percent(capsys):
    bar = TenPercent(1000, "seeding")
    for _ in range(100):
        bar.update(10)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[1].split("%")[0].strip() for line in lines] == [
        str(10 * k) for k in range(1, 11)
    ]


def test_it_prints_one_line_when_a_step_crosses_several_tenths(capsys):
    bar = TenPercent(3, "batches")
    for _ in range(3):
        bar.update(1)
    assert [line.split("(")[0] for line in capsys.readouterr().out.splitlines()] == [
        "batches: 30% ",
        "batches: 60% ",
        "batches: 100% ",
    ]


def test_it_tracks_an_iterable_without_a_terminal(capsys):
    assert list(track(range(20), "rows")) == list(range(20))
    assert len(capsys.readouterr().out.splitlines()) == 10

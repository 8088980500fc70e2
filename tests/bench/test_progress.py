"""Benchmarks print one progress line per 10% when their output is not a terminal."""

from __future__ import annotations

from bench.progress import TenPercent, track


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

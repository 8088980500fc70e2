"""Every benchmark runs as the README says: `python bench/x.py` and `python -m bench.x` (here with
--help, which parses its arguments and stops before touching a database)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SCRIPTS = ("__init__", "harness", "progress")  # modules the scripts import
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in NOT_SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_starts_as_a_file_and_as_a_module(name, tmp_path):
    for argv in ([str(ROOT / "bench" / f"{name}.py")], ["-m", f"bench.{name}"]):
        done = subprocess.run(
            [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert "usage:" in done.stdout, argv

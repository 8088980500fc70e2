"""What other apps, the workers and the benchmarks call on replays. The package's parts
(selection, scoring, queue, results, twin) are described in docs/replay.md; inside the package
and in tests of one part, import that module itself."""

from __future__ import annotations

from webapp.replays.queue import enqueue, parallel, resume, resume_stalled, stalled, work
from webapp.replays.results import load_results, regress, report
from webapp.replays.selection import create_replay
from webapp.replays.twin import launch_training

__all__ = [
    "create_replay",
    "enqueue",
    "launch_training",
    "load_results",
    "parallel",
    "regress",
    "report",
    "resume",
    "resume_stalled",
    "stalled",
    "work",
]

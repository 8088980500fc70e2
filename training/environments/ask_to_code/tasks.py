"""Task bank of the ask-to-code environment, read at import from `tasks.json` beside this module.

Each task's public statement deliberately omits one detail (an edge case, a format, a bound). The
simulated user knows `detail` and reveals it when a question touches one of `topics`. `solution` is
the reference (the teacher submits it, and the expected outputs of the hidden tests are computed
from it, so the two can never disagree); `naive` is the plausible guess made without asking, which
fails the tests that depend on the missing detail. Only `inputs` are hidden tests' arguments.

The split is by family (`HOLDOUT_FAMILIES`), so held-out prompts test transfer of the *behaviour*
(ask first), not recall of the same kind of detail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("tasks.json")  # shipped in the wheel (pyproject package-data)


@dataclass(frozen=True)
class Task:
    key: str
    family: str
    func_name: str
    signature: str  # what the agent must define, e.g. "format_phone(digits: str) -> str"
    statement: str  # public: omits the detail
    detail: str  # hidden: what the user says when asked a relevant question
    topics: tuple[str, ...]  # lowercase keyword prefixes that make a question relevant
    question: str  # a relevant question (the scripted teacher asks it)
    solution: str
    naive: str
    inputs: tuple[tuple[Any, ...], ...]

    @cached_property
    def tests(self) -> list[tuple[tuple[Any, ...], Any]]:
        """(args, expected) pairs; expected values come from running the trusted reference here."""
        namespace: dict[str, Any] = {}
        exec(compile(self.solution, f"<solution {self.key}>", "exec"), namespace)  # trusted, ours
        fn = namespace[self.func_name]
        return [(args, fn(*args)) for args in self.inputs]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        """A task from its tasks.json entry: the function name is the signature's; the arguments
        of each hidden test become a tuple (JSON has only lists)."""
        return cls(
            key=d["key"],
            family=d["family"],
            func_name=d["signature"].split("(", 1)[0],
            signature=d["signature"],
            statement=d["statement"],
            detail=d["detail"],
            topics=tuple(d["topics"]),
            question=d["question"],
            solution=d["solution"],
            naive=d["naive"],
            inputs=tuple(tuple(args) for args in d["inputs"]),
        )


_data = json.loads(DATA.read_text(encoding="utf-8"))

HOLDOUT_FAMILIES = frozenset(_data["holdout_families"])
TASKS: list[Task] = [Task.from_json(d) for d in _data["tasks"]]
TASKS_BY_KEY: dict[str, Task] = {t.key: t for t in TASKS}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(t.family for t in TASKS))

# Questions about things no task leaves open: the user gives them a vague answer (tests check that
# none of these matches any task's topics).
IRRELEVANT_QUESTIONS: tuple[str, ...] = tuple(_data["irrelevant_questions"])

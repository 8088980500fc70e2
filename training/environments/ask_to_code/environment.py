"""The ask-to-code environment: a multi-turn `Environment` whose `reset` starts an `Episode`."""

from __future__ import annotations

import random
from typing import Any

from ..base import Component, Environment, Prompt, Split
from .episode import Episode
from .hidden_tests import hidden_test_result
from .parsing import _task, agent_turns, extract_code, is_relevant
from .policy import code_message
from .prompts import MAX_TURNS, stored_prompt, task_prompt
from .rewards import COMPONENTS, _first_code_turn
from .tasks import HOLDOUT_FAMILIES, TASKS


class AskToCodeEnv(Environment):
    name = "ask_to_code"
    description = (
        "Multi-turn coding with a simulated user: the task omits one detail; ask about it, "
        "then submit a ```python block that hidden unit tests grade in a sandbox."
    )

    multi_turn = True

    def __init__(self, max_turns: int = MAX_TURNS) -> None:
        self.components: list[Component] = list(COMPONENTS)
        self.max_turns = max_turns

    def prompts(self, split: Split, n: int, seed: int = 0) -> list[Prompt]:
        """n prompts of the split's task families, shuffled by `seed`. Past the bank's size the
        tasks repeat with a round suffix on the key, so group keys stay distinct within one step."""
        tasks = [t for t in TASKS if (t.family in HOLDOUT_FAMILIES) == (split == "holdout")]
        random.Random(seed).shuffle(tasks)
        out = []
        for i in range(n):
            task, rnd = tasks[i % len(tasks)], i // len(tasks)
            out.append(task_prompt(task, f"ask_to_code-{task.key}" + (f"-r{rnd}" if rnd else "")))
        return out

    def reset(self, prompt: Prompt) -> Episode:
        return Episode(prompt, self.max_turns)

    def stored_prompt(self, key: str, prompt: Any) -> Prompt | None:
        return stored_prompt(key, prompt)

    def state(self, prompt: Prompt, completion: Any) -> dict[str, Any]:
        task = _task(prompt)
        turns = agent_turns(completion)
        code_at = _first_code_turn(turns)
        state: dict[str, Any] = {
            "task": prompt.spec.get("task"),
            "family": prompt.spec.get("family"),
            "agent_turns": len(turns),
            "submitted": code_at is not None,
            "detail_revealed": bool(task) and any(is_relevant(task, t) for t in turns[:code_at]),
        }
        if task is not None and code_at is not None:
            r = hidden_test_result(task, extract_code(turns[code_at]) or "")
            state["tests"] = {"passed": r.passed, "total": r.total, "ran": r.ran, "error": r.error}
        return state

    def solve(self, prompt: Prompt) -> list[str]:
        """The scripted teacher's agent messages: the right question, then the reference code."""
        task = _task(prompt)
        assert task is not None, prompt.key
        return [task.question, code_message(task.solution)]

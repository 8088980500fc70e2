"""Ask-to-code prompts: a task's statement as the first user message after the system prompt,
and the rebuilding of a stored group's prompt from its key."""

from __future__ import annotations

import re
from typing import Any

from ..base import Prompt, Split
from .tasks import HOLDOUT_FAMILIES, TASKS_BY_KEY, Task

MAX_TURNS = 4  # agent turns per episode; a question on the last turn ends it without code

SYSTEM_PROMPT = (
    "You are a careful Python developer working with a user. The task below may leave out a detail "
    "that matters. You may ask the user clarifying questions in plain text, one per turn. When you "
    "are ready, reply with the complete function in a single ```python fenced block; submitting "
    f"code ends the conversation and hidden unit tests grade it. You have at most {MAX_TURNS} "
    "turns."
)


def _statement(task: Task) -> str:
    return f"Write a Python function `{task.signature}`. {task.statement}"


def task_messages(task: Task) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": _statement(task)},
    ]


def task_prompt(task: Task, key: str | None = None) -> Prompt:
    split: Split = "holdout" if task.family in HOLDOUT_FAMILIES else "train"
    spec = {"task": task.key, "family": task.family, "func_name": task.func_name}
    return Prompt(
        key=key or f"ask_to_code-{task.key}",
        text=_statement(task),
        split=split,
        spec=spec,
        messages=task_messages(task),
    )


def stored_prompt(key: str, prompt: Any) -> Prompt | None:
    """The Prompt of a stored group (for reward replay): its key names the task, with an optional
    round suffix (see AskToCodeEnv.prompts); None for a key that names no task."""
    task_key = re.sub(r"-r\d+$", "", key.removeprefix("ask_to_code-"))
    task = TASKS_BY_KEY.get(task_key) or TASKS_BY_KEY.get(key.removeprefix("ask_to_code-"))
    return None if task is None else task_prompt(task, key)

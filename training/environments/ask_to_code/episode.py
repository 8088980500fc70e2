"""One ask-to-code conversation with the simulated user: it answers a relevant question with the
omitted detail, anything else vaguely, and grades a submission with the hidden tests.

The transcript is a list of chat messages and is what gets stored and scored:
    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     optional "tool_calls": [{"name": "submit_code", "arguments": {"code": ...}}], optional "name"}
A submission is recorded as an assistant message with a `submit_code` tool call, followed by a
"tool" message named "unit_tests" holding the test summary. Scoring never trusts that summary: it
reruns the hidden tests on the submitted code (cached per task and code), since a transcript may
come from anywhere (a TRL completion, an import).
"""

from __future__ import annotations

from typing import Any

from ...sandbox import SandboxResult
from ..base import Prompt
from .hidden_tests import hidden_test_result, summarise
from .parsing import _task, extract_code, is_relevant
from .prompts import MAX_TURNS, task_messages
from .tasks import Task

VAGUE_ANSWERS = (
    "Hmm, I don't have a strong opinion on that; do what seems reasonable.",
    "That part doesn't matter much to me.",
    "Whatever you think is best there.",
)
OUT_OF_TURNS = "We're out of time: no code was submitted."


def _answer(task: Task, question: str, turn: int) -> str:
    if is_relevant(task, question):
        return f"Good question. {task.detail}"
    return VAGUE_ANSWERS[turn % len(VAGUE_ANSWERS)]


class Episode:
    """One conversation. `step` takes the agent's message and returns (reply, done); the reply is
    the user's answer, the unit-test summary after a submission, or the out-of-turns notice."""

    def __init__(self, prompt: Prompt, max_turns: int = MAX_TURNS) -> None:
        task = _task(prompt)
        if task is None:
            raise KeyError(f"prompt {prompt.key!r} has no known task")
        self.prompt = prompt
        self.task = task
        self.max_turns = max_turns
        self.transcript: list[dict[str, Any]] = [
            dict(m) for m in (prompt.messages or task_messages(task))
        ]
        self.turns = 0
        self.done = False
        self.result: SandboxResult | None = None

    def step(self, agent_message: str) -> tuple[str | None, bool]:
        if self.done:
            raise RuntimeError("episode is over")
        self.turns += 1
        code = extract_code(agent_message)
        if code is not None:
            self.transcript.append(
                {
                    "role": "assistant",
                    "content": agent_message,
                    "tool_calls": [{"name": "submit_code", "arguments": {"code": code}}],
                }
            )
            self.result = hidden_test_result(self.task, code)
            reply = summarise(self.result)
            self.transcript.append({"role": "tool", "name": "unit_tests", "content": reply})
            self.done = True
            return reply, True
        self.transcript.append({"role": "assistant", "content": agent_message})
        if self.turns >= self.max_turns:
            self.transcript.append({"role": "user", "content": OUT_OF_TURNS})
            self.done = True
            return OUT_OF_TURNS, True
        reply = _answer(self.task, agent_message, self.turns)
        self.transcript.append({"role": "user", "content": reply})
        return reply, False

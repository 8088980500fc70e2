"""The scripted ask-to-code agent: styles from the teacher's (the relevant question, then the
reference code) to reward-hacking exhibits (guessing, looping), for demo data and tests."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from ..base import Prompt
from .parsing import _task, agent_turns, message_text
from .tasks import IRRELEVANT_QUESTIONS

STYLES = ("solve", "ask_first", "guess", "loop", "ask_late", "irrelevant")
GOOD_STYLES = ("solve", "ask_first")


def code_message(code: str) -> str:
    return f"Here is my solution:\n```python\n{code.rstrip()}\n```"


class ScriptedAskPolicy:
    """Agent messages from a script, given the transcript so far (a pure function of it
    and the seed).

    Styles: "solve" (teacher: the relevant question, then the reference code); "ask_first" (the
    same, but a wrong guess now and then); "guess" (the naive code at once); "loop" (repeats the
    relevant question until out of turns: high asked_before_coding, no code, a reward-hacking
    exhibit only the loop penalty catches); "ask_late" (an off-topic question or two, then the
    relevant one, then code); "irrelevant" (an off-topic question, then the naive code)."""

    def __init__(self, style: str = "solve", seed: int = 0) -> None:
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r}; known: {', '.join(STYLES)}")
        self.style = style
        self.seed = seed

    def __call__(self, prompt: Prompt, transcript: Sequence[dict[str, Any]]) -> str:
        task = _task(prompt)
        assert task is not None, prompt.key
        turn = len(agent_turns(list(transcript)))  # 0-based index of the turn to produce
        rng = random.Random(
            f"{self.seed}:{prompt.key}:{self.style}"
        )  # str seed: stable across runs
        revealed = any(
            m.get("role") == "user" and task.detail in message_text(m) for m in transcript
        )
        code = task.solution if revealed else task.naive
        off_topic = rng.choice(IRRELEVANT_QUESTIONS)
        if self.style == "solve":
            return task.question if turn == 0 else code_message(code)
        if self.style == "ask_first":
            if turn == 0:
                return task.question
            return code_message(code if rng.random() < 0.75 else task.naive)
        if self.style == "guess":
            return code_message(task.naive)
        if self.style == "loop":
            return task.question
        if self.style == "ask_late":
            late = 1 + rng.randrange(2)  # the relevant question comes in turn 2 or 3
            if turn < late:
                return IRRELEVANT_QUESTIONS[
                    (IRRELEVANT_QUESTIONS.index(off_topic) + turn) % len(IRRELEVANT_QUESTIONS)
                ]
            return task.question if turn == late else code_message(code)
        # irrelevant
        return off_topic if turn == 0 else code_message(code)


AgentPolicy = Callable[[Prompt, Sequence[dict[str, Any]]], str]

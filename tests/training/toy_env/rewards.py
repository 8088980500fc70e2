"""The toy environment's reward components: pure functions of (prompt, completion) -> Score. A
completion is a string, or a chat transcript whose last assistant message is graded (how a replay
hands back a stored rollout)."""

from __future__ import annotations

from typing import Any

from training.environments.base import Prompt, Score


def answer_text(completion: Any) -> str:
    if isinstance(completion, list):
        said = [m.get("content", "") for m in completion if m.get("role") == "assistant"]
        return str(said[-1]) if said else ""
    return str(completion)


def shouted(prompt: Prompt, completion: Any, *, ignore_case: bool = False) -> Score:
    """1 when the completion is the word in capitals (in any case with `ignore_case`)."""
    want, text = prompt.spec["word"].upper(), answer_text(completion).strip()
    if ignore_case:
        want, text = want.lower(), text.lower()
    return Score(float(text == want), repr(text[:40]))


def brevity(prompt: Prompt, completion: Any) -> Score:
    """1 for a one-word completion, else 0."""
    words = len(answer_text(completion).split())
    return Score(float(words == 1), f"{words} words")

"""The toy environment's reward components: pure functions of (prompt, completion) -> Score."""

from __future__ import annotations

from typing import Any

from training.environments.base import Prompt, Score


def shouted(prompt: Prompt, completion: Any, *, ignore_case: bool = False) -> Score:
    """1 when the completion is the word in capitals (in any case with `ignore_case`)."""
    want, text = prompt.spec["word"].upper(), str(completion).strip()
    if ignore_case:
        want, text = want.lower(), text.lower()
    return Score(float(text == want), repr(text[:40]))


def brevity(prompt: Prompt, completion: Any) -> Score:
    """1 for a one-word completion, else 0."""
    words = len(str(completion).split())
    return Score(float(words == 1), f"{words} words")

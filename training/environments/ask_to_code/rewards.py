"""Reward components of ask-to-code, pure functions of (prompt, transcript) -> Score:

    correctness          1.0  outcome      fraction of hidden tests the first submitted code passes
    asked_before_coding  0.6  behavioural  a relevant question before the code (1, 0.5, 0.25...)
    guessing_penalty     0.4  penalty      -1 for code without any question before it
    loop_penalty         0.2  penalty      -1 when the last two agent turns are >80% similar

`score` never trusts a transcript's test summary: it reruns the hidden tests (cached).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from ..base import Component, Prompt, Score
from .hidden_tests import hidden_test_result, summarise
from .parsing import _task, agent_turns, extract_code, is_relevant

LOOP_SIMILARITY = 0.8  # difflib ratio above which the last two agent turns count as a loop


def _first_code_turn(turns: list[str]) -> int | None:
    return next((i for i, t in enumerate(turns) if extract_code(t) is not None), None)


def correctness(prompt: Prompt, transcript: Any) -> Score:
    """Fraction of hidden tests passed by the first submitted code (the episode ends there)."""
    task = _task(prompt)
    if task is None:
        return Score(math.nan, "prompt has no known task")
    turns = agent_turns(transcript)
    i = _first_code_turn(turns)
    if i is None:
        return Score(0.0, "no code submitted")
    result = hidden_test_result(task, extract_code(turns[i]) or "")
    # Every sandbox anomaly, ours included, is a failed submission (0 with the reason), never NaN: a
    # NaN drops out of the weighted sum and would beat an honest failure (issue 20).
    return Score(result.fraction, summarise(result))


def asked_before_coding(prompt: Prompt, transcript: Any) -> Score:
    """1.0 for a relevant question in the first agent turn, halving per later turn; 0 if no relevant
    question came before the code (asking after code is impossible: code ends the episode, but a
    hand-made transcript may try)."""
    task = _task(prompt)
    if task is None:
        return Score(math.nan, "prompt has no known task")
    turns = agent_turns(transcript)
    code_at = _first_code_turn(turns)
    before = turns if code_at is None else turns[:code_at]
    for i, turn in enumerate(before):
        if is_relevant(task, turn):
            return Score(0.5**i, f"relevant question in agent turn {i + 1}")
    if any(is_relevant(task, t) and extract_code(t) is None for t in turns):
        return Score(0.0, "relevant question only after the code")
    return Score(0.0, "no relevant question" if before else "no question before the code")


def guessing_penalty(prompt: Prompt, transcript: Any) -> Score:
    """-1 when code is submitted without any question before it."""
    turns = agent_turns(transcript)
    code_at = _first_code_turn(turns)
    if code_at == 0:
        return Score(-1.0, "code submitted without asking anything")
    return Score(
        0.0, "no code yet" if code_at is None else f"{code_at} question(s) before the code"
    )


def loop_penalty(prompt: Prompt, transcript: Any) -> Score:
    """-1 when the last two agent turns are more than 80% similar (difflib ratio)."""
    turns = agent_turns(transcript)
    if len(turns) < 2:
        return Score(0.0, "fewer than two agent turns")
    ratio = difflib.SequenceMatcher(None, turns[-2], turns[-1], autojunk=False).ratio()
    if ratio > LOOP_SIMILARITY:
        return Score(-1.0, f"last two agent turns {ratio:.0%} similar")
    return Score(0.0, f"last two agent turns {ratio:.0%} similar")


COMPONENTS: list[Component] = [
    Component(
        "correctness",
        1.0,
        correctness,
        "outcome",
        0.0,
        1.0,
        "Fraction of the hidden unit tests the submitted function passes (sandboxed).",
    ),
    Component(
        "asked_before_coding",
        0.6,
        asked_before_coding,
        "behavioural",
        0.0,
        1.0,
        "A relevant clarifying question before the code: 1 in the first turn, 0.5 second, 0.25 "
        "third.",
    ),
    Component(
        "guessing_penalty",
        0.4,
        guessing_penalty,
        "penalty",
        -1.0,
        0.0,
        "-1 when code is submitted without any question first.",
    ),
    Component(
        "loop_penalty",
        0.2,
        loop_penalty,
        "penalty",
        -1.0,
        0.0,
        "-1 when the last two agent turns are more than 80% similar.",
    ),
]

"""Ask before you code: a multi-turn coding environment with a simulated user.

Each task statement omits one detail. The simulated user knows the full spec and reveals the
detail only when the agent asks a relevant question (keyword/topic match); anything else gets a
vague answer. A ```python block ends the episode and hidden unit tests, run in
`training.sandbox`, score it.

Protocol (usable from a TRL multi-turn rollout and from a scripted policy):

    ep = env.reset(prompt)             # ep.transcript starts as prompt.messages (system + user)
    reply, done = ep.step(agent_msg)   # a question (plain text) or a code submission
    ...                                # until done; then env.score(prompt, ep.transcript)

The transcript is a list of chat messages and is what gets stored and scored:
    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     optional "tool_calls": [{"name": "submit_code", "arguments": {"code": ...}}], optional "name"}
A submission is recorded as an assistant message with a `submit_code` tool call, followed by a
"tool" message named "unit_tests" holding the test summary. `score` never trusts that summary: it
reruns the hidden tests on the submitted code (cached per task and code), since a transcript may
come from anywhere (a TRL completion, an import).

No Django here.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ..sandbox import SandboxResult, run_tests
from .ask_to_code_tasks import (
    HOLDOUT_FAMILIES,
    IRRELEVANT_QUESTIONS,
    TASKS,
    TASKS_BY_KEY,
    Task,
)
from .base import Component, Environment, Prompt, Score, Split

MAX_TURNS = 4  # agent turns per episode; a question on the last turn ends it without code
LOOP_SIMILARITY = 0.8  # difflib ratio above which the last two agent turns count as a loop
TEST_TIMEOUT_S = 2.0
CACHE_SIZE = (
    4096  # (task, code) -> SandboxResult; a GRPO step re-scores the same codes per component
)

SYSTEM_PROMPT = (
    "You are a careful Python developer working with a user. The task below may leave out a detail "
    "that matters. You may ask the user clarifying questions in plain text, one per turn. When you "
    "are ready, reply with the complete function in a single ```python fenced block; submitting "
    f"code ends the conversation and hidden unit tests grade it. You have at most {MAX_TURNS} "
    "turns."
)
VAGUE_ANSWERS = (
    "Hmm, I don't have a strong opinion on that; do what seems reasonable.",
    "That part doesn't matter much to me.",
    "Whatever you think is best there.",
)
OUT_OF_TURNS = "We're out of time: no code was submitted."

_CODE_RE = re.compile(r"```(python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Reading messages


def extract_code(message: str) -> str | None:
    """The code of a submission, or None when the message is a question. A ```python (or ```py)
    block is code, even unclosed (a truncated generation); a bare ``` block only when it
    defines a function."""
    for lang, body in _CODE_RE.findall(message or ""):
        if lang or re.search(r"^\s*def\s", body, re.MULTILINE):
            return body.strip() + "\n"
    return None


def _content(message: Any) -> str:
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, list):  # multimodal-style content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return content if isinstance(content, str) else str(content or "")


def agent_turns(transcript: Any) -> list[str]:
    """The agent's messages in order. Accepts a full transcript, a TRL conversational completion (a
    list of assistant messages) or a bare string (one turn)."""
    if isinstance(transcript, str):
        return [transcript]
    out = []
    for m in transcript or []:
        if isinstance(m, dict) and m.get("role") == "assistant":
            calls = m.get("tool_calls") or []
            code = next(
                (
                    c.get("arguments", {}).get("code")
                    for c in calls
                    if c.get("name") == "submit_code"
                ),
                None,
            )
            # A submit_code call without a fence in the content still counts as code.
            text = _content(m)
            out.append(text if code is None or extract_code(text) else f"```python\n{code}\n```")
    return out


def is_relevant(task: Task, question: str) -> bool:
    """Does the question touch the omitted detail? Topics match at a word start (prefix), so
    'round' matches 'rounding'; topics of one or two characters must match a whole word."""
    q = question.lower()
    for topic in task.topics:
        tail = r"(?![a-z0-9])" if len(topic) <= 2 else ""
        if re.search(r"(?<![a-z0-9])" + re.escape(topic) + tail, q):
            return True
    return False


def _task(prompt: Prompt) -> Task | None:
    return TASKS_BY_KEY.get(prompt.spec.get("task", ""))


# ---------------------------------------------------------------------------------------------
# Hidden tests, cached


_cache: OrderedDict[tuple[str, str], SandboxResult] = OrderedDict()
INFRASTRUCTURE_ERRORS = ("sandbox setup failed", "sandbox unavailable", "sandbox error")
_cache_lock = threading.Lock()


def hidden_test_result(task: Task, code: str) -> SandboxResult:
    """Run the task's hidden tests on `code` in the sandbox, at most once per (task, code)."""
    key = (task.key, hashlib.sha256(code.encode()).hexdigest())
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    result = run_tests(code, task.func_name, task.tests, timeout_s=TEST_TIMEOUT_S)
    if result.error and result.error.startswith(INFRASTRUCTURE_ERRORS):
        return (
            result  # maybe our infrastructure failed, not the code: scored 0 now, retried next time
        )
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return result


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def summarise(result: SandboxResult) -> str:
    """The unit_tests tool message: counts and the error kind only, never the expected values (the
    transcript may be exported as training data)."""
    text = f"{result.passed}/{result.total} hidden tests passed"
    if result.error:
        text += f"; {result.error[:200]}"
    return text


# ---------------------------------------------------------------------------------------------
# Reward components: pure functions of (prompt, transcript)


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


# ---------------------------------------------------------------------------------------------
# Episode


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
            dict(m) for m in (prompt.messages or _messages(task))
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


# ---------------------------------------------------------------------------------------------
# Environment


def _statement(task: Task) -> str:
    return f"Write a Python function `{task.signature}`. {task.statement}"


def _messages(task: Task) -> list[dict[str, Any]]:
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
        messages=_messages(task),
    )


def stored_prompt(key: str, prompt: Any) -> Prompt | None:
    """The Prompt of a stored group (for reward replay): its key names the task, with an optional
    round suffix (see AskToCodeEnv.prompts); None for a key that names no task."""
    task_key = re.sub(r"-r\d+$", "", key.removeprefix("ask_to_code-"))
    task = TASKS_BY_KEY.get(task_key) or TASKS_BY_KEY.get(key.removeprefix("ask_to_code-"))
    return None if task is None else task_prompt(task, key)


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
        return [task.question, _code_message(task.solution)]


# ---------------------------------------------------------------------------------------------
# Scripted policy, rollouts and demo records


STYLES = ("solve", "ask_first", "guess", "loop", "ask_late", "irrelevant")
GOOD_STYLES = ("solve", "ask_first")


def _code_message(code: str) -> str:
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
        revealed = any(m.get("role") == "user" and task.detail in _content(m) for m in transcript)
        code = task.solution if revealed else task.naive
        off_topic = rng.choice(IRRELEVANT_QUESTIONS)
        if self.style == "solve":
            return task.question if turn == 0 else _code_message(code)
        if self.style == "ask_first":
            if turn == 0:
                return task.question
            return _code_message(code if rng.random() < 0.75 else task.naive)
        if self.style == "guess":
            return _code_message(task.naive)
        if self.style == "loop":
            return task.question
        if self.style == "ask_late":
            late = 1 + rng.randrange(2)  # the relevant question comes in turn 2 or 3
            if turn < late:
                return IRRELEVANT_QUESTIONS[
                    (IRRELEVANT_QUESTIONS.index(off_topic) + turn) % len(IRRELEVANT_QUESTIONS)
                ]
            return task.question if turn == late else _code_message(code)
        # irrelevant
        return off_topic if turn == 0 else _code_message(code)


AgentPolicy = Callable[[Prompt, Sequence[dict[str, Any]]], str]


def run_episode(env: AskToCodeEnv, prompt: Prompt, policy: AgentPolicy) -> list[dict[str, Any]]:
    ep = env.reset(prompt)
    done = False
    while not done:
        _, done = ep.step(policy(prompt, ep.transcript))
    return ep.transcript


def _record_score(score: Score) -> dict[str, Any]:
    value = None if math.isnan(score.value) else float(score.value)
    return {"value": value, "reason": score.reason}


def rollout_record(
    env: AskToCodeEnv, prompt: Prompt, index: int, policy: ScriptedAskPolicy
) -> dict[str, Any]:
    transcript = run_episode(env, prompt, policy)
    scores = env.score(prompt, transcript)
    return {
        "index": index,
        "transcript": transcript,
        "rewards": {name: _record_score(s) for name, s in scores.items()},
        # whitespace tokens of the agent's turns: no tokenizer in the demo path
        "length": sum(len(t.split()) for t in agent_turns(transcript)),
        "truncated": False,
        "state": {**env.state(prompt, transcript), "policy_style": policy.style},
    }


def generate_groups(
    env: AskToCodeEnv | None = None,
    steps: int = 1,
    groups_per_step: int = 4,
    G: int = 6,
    seed: int = 0,
    split: Split = "train",
    styles: Sequence[str] = STYLES,
    skill_schedule: Callable[[int], float] | None = None,
    holdout_groups: int = 0,
) -> list[dict[str, Any]]:
    """Ingestion records: per step, `groups_per_step` groups of G scripted rollouts of one prompt
    (plus `holdout_groups` groups on fixed held-out prompts). Rollout i of a group uses a style
    drawn from `styles`, or, with `skill_schedule(step)` = p, a good style with probability p and
    another otherwise, so rewards can improve over a run. Deterministic in `seed`."""
    env = env or AskToCodeEnv()
    rng = random.Random(seed)
    train = env.prompts(split, steps * groups_per_step, seed)
    holdout = env.prompts("holdout", holdout_groups, seed) if holdout_groups else []
    bad = [s for s in styles if s not in GOOD_STYLES] or list(styles)
    records: list[dict[str, Any]] = []
    for step in range(steps):
        chosen = train[step * groups_per_step : (step + 1) * groups_per_step]
        for prompt in chosen + holdout:
            rollouts = []
            for i in range(G):
                if skill_schedule is not None:
                    pool = GOOD_STYLES if rng.random() < skill_schedule(step) else bad
                    style = rng.choice(list(pool))
                else:
                    style = styles[(i + rng.randrange(len(styles))) % len(styles)]
                policy = ScriptedAskPolicy(style, seed=rng.randrange(2**31))
                rollouts.append(rollout_record(env, prompt, i, policy))
            records.append(
                {
                    "step": step,
                    "key": prompt.key,
                    "prompt": prompt.text,
                    "split": prompt.split,
                    "rollouts": rollouts,
                }
            )
    return records

"""The ask-to-code environment: components on hand-made transcripts, the episode protocol, the task
bank, the scripted policies and the demo records. Code runs in the real sandbox (~0.1 s a run)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from training.environments import ask_to_code as atc
from training.environments.ask_to_code import (
    MAX_TURNS,
    STYLES,
    AskToCodeEnv,
    ScriptedAskPolicy,
    agent_turns,
    extract_code,
    generate_groups,
    is_relevant,
    run_episode,
    task_prompt,
)
from training.environments.ask_to_code.tasks import (
    HOLDOUT_FAMILIES,
    IRRELEVANT_QUESTIONS,
    TASKS,
    TASKS_BY_KEY,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TASK = TASKS_BY_KEY["safe_div"]  # naive code passes 2 of 4 hidden tests
PROMPT = task_prompt(TASK)
GOOD = f"```python\n{TASK.solution}```"
NAIVE = f"```python\n{TASK.naive}```"
RELEVANT = TASK.question
OFF_TOPIC = IRRELEVANT_QUESTIONS[0]


def _transcript(*agent: str) -> list[dict]:
    """A stored-style transcript: prompt messages, then each agent turn with a user reply."""
    out = list(PROMPT.messages or [])
    for msg in agent:
        out.append({"role": "assistant", "content": msg})
        out.append({"role": "user", "content": "..."})
    return out


def _values(transcript) -> dict[str, float]:
    return {k: s.value for k, s in AskToCodeEnv().score(PROMPT, transcript).items()}


def test_it_rewards_a_relevant_first_turn_question_most():
    v = _values(_transcript(RELEVANT, GOOD))
    assert v == {
        "correctness": 1.0,
        "asked_before_coding": 1.0,
        "guessing_penalty": 0.0,
        "loop_penalty": 0.0,
    }


def test_it_rewards_a_late_question_less():
    assert _values(_transcript(OFF_TOPIC, RELEVANT, GOOD))["asked_before_coding"] == 0.5
    assert (
        _values(_transcript(OFF_TOPIC, IRRELEVANT_QUESTIONS[1], RELEVANT, GOOD))[
            "asked_before_coding"
        ]
        == 0.25
    )


def test_it_penalises_code_without_a_question():
    v = _values(_transcript(NAIVE))
    assert v["guessing_penalty"] == -1.0 and v["asked_before_coding"] == 0.0


def test_it_gives_no_credit_for_irrelevant_questions_or_questions_after_code():
    v = _values(_transcript(OFF_TOPIC, NAIVE))
    assert v["asked_before_coding"] == 0.0 and v["guessing_penalty"] == 0.0
    s = AskToCodeEnv().score(PROMPT, _transcript(NAIVE, RELEVANT))["asked_before_coding"]
    assert s.value == 0.0 and "after the code" in s.reason


def test_it_penalises_a_loop():
    assert _values(_transcript(RELEVANT, RELEVANT))["loop_penalty"] == -1.0
    assert _values(_transcript(RELEVANT, RELEVANT + " Please?"))["loop_penalty"] == -1.0
    assert _values(_transcript(RELEVANT, GOOD))["loop_penalty"] == 0.0


def test_it_gives_partial_credit_for_partially_passing_code():
    s = AskToCodeEnv().score(PROMPT, _transcript(RELEVANT, NAIVE))["correctness"]
    assert s.value == 0.5 and s.reason.startswith("2/4 hidden tests passed")


def test_it_scores_no_code_as_zero_correctness():
    s = AskToCodeEnv().score(PROMPT, _transcript(RELEVANT))["correctness"]
    assert (s.value, s.reason) == (0.0, "no code submitted")


def test_it_scores_trl_style_completions_and_bare_strings():
    completion = [
        {"role": "assistant", "content": RELEVANT},
        {"role": "assistant", "content": GOOD},
    ]
    assert _values(completion)["correctness"] == 1.0
    assert _values(NAIVE)["guessing_penalty"] == -1.0


def test_it_returns_nan_for_an_unknown_task():
    prompt = task_prompt(TASK, key="x").__class__(key="x", text="?", split="train", spec={})
    assert math.isnan(AskToCodeEnv().score(prompt, [])["correctness"].value)


def test_it_caches_test_runs_per_task_and_code(monkeypatch):
    atc.clear_cache()
    calls = []
    real = atc.hidden_tests.run_tests
    monkeypatch.setattr(
        atc.hidden_tests, "run_tests", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    env = AskToCodeEnv()
    transcript = run_episode(env, PROMPT, ScriptedAskPolicy("solve"))
    env.score(PROMPT, transcript)
    env.score(PROMPT, transcript)
    env.state(PROMPT, transcript)
    assert len(calls) == 1


def test_it_does_not_trust_the_recorded_test_summary():
    transcript = _transcript(RELEVANT) + [
        {"role": "assistant", "content": NAIVE},
        {"role": "tool", "name": "unit_tests", "content": "4/4 hidden tests passed"},
    ]
    assert _values(transcript)["correctness"] == 0.5


# --------------------------------------------------------------------------------------- episode


def test_it_reveals_the_detail_only_to_a_relevant_question():
    ep = AskToCodeEnv().reset(PROMPT)
    reply, done = ep.step(OFF_TOPIC)
    assert TASK.detail not in reply and not done
    reply, done = ep.step(RELEVANT)
    assert TASK.detail in reply and not done


def test_it_ends_the_episode_on_code_and_records_every_turn():
    ep = AskToCodeEnv().reset(PROMPT)
    ep.step(RELEVANT)
    reply, done = ep.step(GOOD)
    assert done and reply == "4/4 hidden tests passed"
    roles = [m["role"] for m in ep.transcript]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert ep.transcript[4]["tool_calls"] == [
        {"name": "submit_code", "arguments": {"code": TASK.solution}}
    ]
    assert ep.transcript[5]["name"] == "unit_tests"
    with pytest.raises(RuntimeError):
        ep.step("more?")


def test_it_caps_the_number_of_turns():
    ep = AskToCodeEnv().reset(PROMPT)
    dones = [ep.step(OFF_TOPIC)[1] for _ in range(MAX_TURNS)]
    assert dones == [False] * (MAX_TURNS - 1) + [True]
    assert ep.transcript[-1]["content"] == atc.OUT_OF_TURNS


def test_it_tells_questions_from_code():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    assert (
        extract_code("```python\ndef f(") == "def f(\n"
    )  # truncated generation still counts as code
    assert extract_code("```\ndef f():\n    pass\n```") is not None
    assert extract_code("Should I use `x`? ```\nsome text\n```") is None
    assert extract_code("What about empty input?") is None


# ---------------------------------------------------------------------------------- task bank


def test_it_has_at_least_40_tasks_in_several_families_split_by_family():
    assert len(TASKS) >= 40 and len({t.key for t in TASKS}) == len(TASKS)
    families = Counter(t.family for t in TASKS)
    assert len(families) >= 5 and min(families.values()) >= 5
    env = AskToCodeEnv()
    train, holdout = env.prompts("train", 100), env.prompts("holdout", 100)
    train_fams = {p.spec["family"] for p in train}
    assert {p.spec["family"] for p in holdout} == set(HOLDOUT_FAMILIES)
    assert not train_fams & HOLDOUT_FAMILIES


def test_it_makes_deterministic_prompts_with_distinct_keys():
    env = AskToCodeEnv()
    assert [p.key for p in env.prompts("train", 50, seed=3)] == [
        p.key for p in env.prompts("train", 50, seed=3)
    ]
    assert len({p.key for p in env.prompts("train", 100)}) == 100
    p = env.prompts("train", 1)[0]
    assert p.messages[0]["role"] == "system" and p.messages[1]["content"] == p.text


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_it_has_a_relevant_teacher_question_and_vague_off_topic_questions(task):
    assert is_relevant(task, task.question)
    assert not any(is_relevant(task, q) for q in IRRELEVANT_QUESTIONS)
    assert task.func_name in task.solution and task.func_name in task.naive and len(task.tests) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_it_has_a_reference_that_passes_and_a_naive_guess_that_fails(task):
    good = atc.hidden_test_result(task, task.solution)
    naive = atc.hidden_test_result(task, task.naive)
    assert good.passed == good.total, good.failures
    assert naive.passed < naive.total


# ---------------------------------------------------------------------------------- policies


def test_it_scripts_each_style():
    env = AskToCodeEnv()
    got = {}
    for style in STYLES:
        t = run_episode(env, PROMPT, ScriptedAskPolicy(style, seed=1))
        got[style] = {k: s.value for k, s in env.score(PROMPT, t).items()}
    assert got["solve"] == {
        "correctness": 1.0,
        "asked_before_coding": 1.0,
        "guessing_penalty": 0.0,
        "loop_penalty": 0.0,
    }
    assert got["guess"]["guessing_penalty"] == -1.0 and got["guess"]["correctness"] < 1.0
    assert got["loop"]["loop_penalty"] == -1.0 and got["loop"]["correctness"] == 0.0
    assert (
        got["ask_late"]["asked_before_coding"] in (0.5, 0.25)
        and got["ask_late"]["correctness"] == 1.0
    )
    assert (
        got["irrelevant"]["asked_before_coding"] == 0.0
        and got["irrelevant"]["guessing_penalty"] == 0.0
    )


def test_it_has_a_teacher_solve_that_scores_full_marks():
    env = AskToCodeEnv()
    messages = iter(env.solve(PROMPT))
    t = run_episode(env, PROMPT, lambda prompt, transcript: next(messages))
    assert env.score(PROMPT, t)["correctness"].value == 1.0


def test_it_generates_groups_in_the_ingestion_format():
    records = generate_groups(steps=2, groups_per_step=1, G=4, seed=7)
    assert len(records) == 2 and records[0]["key"] != records[1]["key"]
    rec = records[0]
    assert set(rec) == {"step", "key", "prompt", "split", "rollouts"} and rec["split"] == "train"
    assert [r["index"] for r in rec["rollouts"]] == [0, 1, 2, 3]
    for r in rec["rollouts"]:
        assert set(r["rewards"]) == {
            "correctness",
            "asked_before_coding",
            "guessing_penalty",
            "loop_penalty",
        }
        assert all(
            isinstance(v["value"], float) and isinstance(v["reason"], str)
            for v in r["rewards"].values()
        )
        assert r["length"] == sum(len(t.split()) for t in agent_turns(r["transcript"]))
    # a mix of styles gives the group variance GRPO needs
    assert len({r["rewards"]["asked_before_coding"]["value"] for r in rec["rollouts"]}) > 1
    again = generate_groups(steps=1, groups_per_step=1, G=2, seed=7)[0]
    assert (
        again["rollouts"][0]["transcript"] == rec["rollouts"][0]["transcript"]
    )  # deterministic in seed


def test_it_never_imports_django():
    code = (
        "import sys, training.environments.ask_to_code, training.sandbox\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, check=True)

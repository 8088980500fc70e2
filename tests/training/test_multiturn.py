"""Multi-turn GRPO on ask_to_code (training/multiturn.py): the turn-by-turn episode driver, and a
GRPO job whose recorded groups carry whole transcripts.

The tiny model is random, so a scripted sampler plays half of each group: its rows ask, guess or
submit code, so the four components vary inside a group and the advantage comparison with TRL is
not vacuous. The other rows are sampled from the model through the real path. Shrinks are commented
with their reason.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from training.environments.ask_to_code import OUT_OF_TURNS, VAGUE_ANSWERS, AskToCodeEnv
from training.environments.ask_to_code.tasks import IRRELEVANT_QUESTIONS, TASKS, TASKS_BY_KEY
from training.sinks import MemorySink

COMPONENTS = {"correctness", "asked_before_coding", "guessing_penalty", "loop_penalty"}


@pytest.fixture(scope="module")
def ask_model(tmp_path_factory) -> str:
    from training.tiny import ensure_tiny_model

    return str(ensure_tiny_model("ask_to_code", tmp_path_factory.mktemp("tiny-ask")))


@pytest.fixture
def one_torch_thread():
    """Two shared cores: a second intra-op thread spin-waits against the other processes on the box
    (generation measured ~7x slower with two threads than with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _code(source: str) -> str:
    return f"```python\n{source}```"


SCRIPTS = {  # style -> the agent's messages for a task, turn by turn (the last one repeats)
    "solve": lambda t: [t.question, _code(t.solution)],
    "guess": lambda t: [_code(t.naive)],
    "loop": lambda t: [t.question],
    "irrelevant": lambda t: [IRRELEVANT_QUESTIONS[0], _code(t.naive)],
}


class ScriptedSampler:
    """A GenerateFn that plays SCRIPTS: row r gets `styles[r % len(styles)]` (None: the `fallback`
    sampler, i.e. the model). It finds the task from the statement in the context and counts each
    row's turns itself, so it needs nothing but what run_episodes gives any sampler."""

    def __init__(self, tokenizer, styles, fallback=None):
        self.tokenizer, self.styles, self.fallback = tokenizer, list(styles), fallback
        self.turns: dict[int, int] = {}

    def __call__(self, contexts, max_new_tokens, rows):
        out: list[list[int] | None] = [None] * len(rows)
        for k, (context, row) in enumerate(zip(contexts, rows, strict=True)):
            style = self.styles[row % len(self.styles)]
            if style is None:
                continue
            text = self.tokenizer.decode(context)
            task = next(t for t in TASKS if t.statement in text)
            turn = self.turns.get(row, 0)
            self.turns[row] = turn + 1
            script = SCRIPTS[style](task)
            ids = self.tokenizer.encode(
                script[min(turn, len(script) - 1)], add_special_tokens=False
            )
            out[k] = (ids + [self.tokenizer.eos_token_id])[:max_new_tokens]
        model_rows = [k for k, ids in enumerate(out) if ids is None]
        if model_rows:
            sampled = self.fallback(
                [contexts[k] for k in model_rows], max_new_tokens, [rows[k] for k in model_rows]
            )
            for k, ids in zip(model_rows, sampled, strict=True):
                out[k] = ids
        return out


def _play(ask_model, styles, prompt_key="safe_div", **limits):
    from transformers import AutoTokenizer

    from training.environments.ask_to_code import task_prompt
    from training.multiturn import run_episodes

    tokenizer = AutoTokenizer.from_pretrained(ask_model)
    env = AskToCodeEnv(max_turns=3)
    prompt = task_prompt(TASKS_BY_KEY[prompt_key])
    limits = {"max_turn_tokens": 200, "max_completion_length": 1000, **limits}
    rows = run_episodes(
        env, [prompt] * len(styles), tokenizer, ScriptedSampler(tokenizer, styles), **limits
    )
    return tokenizer, env, prompt, rows


def test_it_interleaves_policy_turns_and_user_replies_token_for_token(ask_model):
    tokenizer, env, prompt, rows = _play(ask_model, ["solve", "guess", "loop", "irrelevant"])
    task = TASKS_BY_KEY["safe_div"]

    for row in rows:
        assert row.done and len(row.env_mask) == len(row.completion_ids) and row.policy_tokens > 0
        # The ids TRL trains on are exactly the chat template's rendering of the transcript
        # (up to the last agent turn; the final reply is not appended): nothing the policy
        # wrote was re-tokenized.
        last_agent = max(i for i, m in enumerate(row.transcript) if m["role"] == "assistant")
        plain = [
            {"role": m["role"], "content": m["content"]} for m in row.transcript[: last_agent + 1]
        ]
        rendered = tokenizer.apply_chat_template(plain, tokenize=True, return_dict=False)
        assert (
            row.prompt_ids + row.completion_ids
            == rendered[: len(row.prompt_ids) + len(row.completion_ids)]
        )
        assert (
            tokenizer.decode(rendered[len(row.prompt_ids) + len(row.completion_ids) :]).strip()
            == ""
        )
        # The loss sees the agent's tokens only: the mask-1 runs decode to the agent's messages.
        runs, current = [], []
        for tok, m in zip(row.completion_ids, row.env_mask, strict=True):
            if m:
                current.append(tok)
            elif current:
                runs, current = runs + [current], []
        runs += [current] if current else []
        agent = [m["content"] for m in row.transcript if m["role"] == "assistant"]
        assert [tokenizer.decode(r, skip_special_tokens=True) for r in runs] == agent

    solve, guess, loop, irrelevant = (r.transcript for r in rows)
    assert [m["role"] for m in solve] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert (
        solve[3]["content"] == f"Good question. {task.detail}"
    )  # the simulated user reveals the detail
    assert solve[4]["tool_calls"][0]["name"] == "submit_code"
    assert solve[5]["name"] == "unit_tests" and solve[5]["content"] == "4/4 hidden tests passed"
    assert [m["role"] for m in guess] == ["system", "user", "assistant", "tool"]
    assert re.fullmatch(
        r"[0-3]/4 hidden tests passed", guess[3]["content"]
    )  # the naive guess fails some
    assert [m["role"] for m in loop][-1] == "user" and loop[-1]["content"] == OUT_OF_TURNS
    assert irrelevant[3]["content"] in VAGUE_ANSWERS

    scores = [{k: s.value for k, s in env.score(prompt, r.transcript).items()} for r in rows]
    assert scores[0] == {
        "correctness": 1.0,
        "asked_before_coding": 1.0,
        "guessing_penalty": 0.0,
        "loop_penalty": 0.0,
    }
    assert scores[1]["guessing_penalty"] == -1.0 and scores[2]["loop_penalty"] == -1.0


def test_it_closes_a_cut_turn_and_stops_at_the_token_budget(ask_model):
    from transformers import AutoTokenizer

    from training.multiturn import reply_suffix_ids

    task = TASKS_BY_KEY["safe_div"]
    tokenizer = AutoTokenizer.from_pretrained(ask_model)
    reply = reply_suffix_ids(
        tokenizer, {"role": "user", "content": f"Good question. {task.detail}"}
    )
    # 8 tokens a turn cut the question; the budget fits two cut turns and one reply, not
    # a second reply.
    budget = 2 * 8 + 1 + len(reply) + 1
    tokenizer, _, _, rows = _play(
        ask_model, ["loop"], max_turn_tokens=8, max_completion_length=budget
    )
    (row,) = rows
    assert not row.done and len(row.completion_ids) == budget - 1
    assert row.env_mask == [1] * 8 + [0] * (1 + len(reply)) + [1] * 8
    assert (
        row.completion_ids[8] == tokenizer.eos_token_id
        and row.completion_ids[9 : 9 + len(reply)] == reply
    )
    assert [m["role"] for m in row.transcript][2:] == ["assistant", "user", "assistant", "user"]
    assert (
        row.completion_ids[-1] != tokenizer.eos_token_id
    )  # the last turn was cut: TRL counts it truncated


@pytest.mark.slow
def test_it_runs_multi_turn_grpo_and_records_whole_transcripts(
    ask_model, tmp_path, monkeypatch, one_torch_thread
):
    from trl import GRPOTrainer

    from training import multiturn
    from training.grpo import GRPOJobConfig, main
    from training.stats import compute_advantages

    real_sampler = multiturn.trainer_generate

    def mixed(trainer):  # rows 0 and 1 of each group are scripted, rows 2 and 3 are the model's
        return ScriptedSampler(
            trainer.processing_class, ["solve", "guess", None, None], real_sampler(trainer)
        )

    monkeypatch.setattr(multiturn, "trainer_generate", mixed)
    trl_advantages: list[list[float]] = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        output = original(self, inputs)
        trl_advantages.append(output["advantages"].detach().cpu().tolist())
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)

    sink = MemorySink()
    summary = main(
        GRPOJobConfig(
            base_model=ask_model,
            output_dir=str(tmp_path / "grpo"),
            env="ask_to_code",  # multi_turn=None: on, because the environment has episodes
            max_steps=2,  # two steps: two recorded generations
            num_prompts=8,  # each step samples 2 of them
            num_generations=4,  # smallest group with within-group variance
            per_device_batch_size=8,  # 2 prompts x 4 episodes
            max_turns=3,  # enough for ask, answer, code
            max_turn_tokens=48,  # short model turns: generation dominates CPU time
            # Whole episode, replies included; scripted code may still be cut
            max_completion_length=256,
            record_state=True,
        ),
        sink=sink,
    )

    assert (
        summary["global_step"] == 2 and summary["groups_recorded"] == 4 and len(trl_advantages) == 2
    )
    assert [g["step"] for g in sink.groups] == [1, 1, 2, 2]
    for step, expected in zip([1, 2], trl_advantages, strict=True):
        rollouts = [r for g in sink.groups if g["step"] == step for r in g["rollouts"]]
        np.testing.assert_allclose([r["advantage"] for r in rollouts], expected, atol=1e-5)
        matrix = np.array(
            [
                [
                    r["rewards"][c]["value"]
                    for c in (
                        "correctness",
                        "asked_before_coding",
                        "guessing_penalty",
                        "loop_penalty",
                    )
                ]
                for r in rollouts
            ],
            dtype=float,
        )
        recomputed = compute_advantages(matrix, [1.0, 0.6, 0.4, 0.2], group_size=4)
        np.testing.assert_allclose(recomputed.advantages, expected, atol=1e-4)

    for g in sink.groups:
        task = TASKS_BY_KEY[g["key"].removeprefix("ask_to_code-")]
        assert len(g["rollouts"]) == 4 and np.std([r["reward"] for r in g["rollouts"]]) > 0.1
        for r in g["rollouts"]:
            assert set(r["rewards"]) == COMPONENTS
            assert all(isinstance(v["value"], float) and v["reason"] for v in r["rewards"].values())
            t = r["transcript"]
            assert [m["role"] for m in t[:2]] == ["system", "user"] and task.statement in t[1][
                "content"
            ]
            roles = [m["role"] for m in t[2:]]
            assert roles[0::2] == ["assistant"] * len(
                roles[0::2]
            )  # the agent and the env take turns
            assert all(role in ("user", "tool") for role in roles[1::2])
            for m in t[2:]:
                if m["role"] == "user":  # only the simulated user speaks after the prompt
                    assert m["content"] in (
                        *VAGUE_ANSWERS,
                        OUT_OF_TURNS,
                        f"Good question. {task.detail}",
                    )
            if r["state"]["submitted"]:
                assert t[-1]["role"] == "tool" and t[-1]["name"] == "unit_tests"
                assert (
                    t[-1]["content"] == r["rewards"]["correctness"]["reason"]
                )  # the same sandbox verdict
            assert 0 < r["length"] <= 3 * 48 and isinstance(r["truncated"], bool)
        solve, guess = g["rollouts"][0], g["rollouts"][1]
        assert solve["rewards"]["asked_before_coding"]["value"] == 1.0
        assert (
            guess["rewards"]["guessing_penalty"]["value"] == -1.0
            and guess["transcript"][-1]["name"] == "unit_tests"
        )

    logged = {k for m in sink.metrics for k in m["values"]}
    assert {"loss", "reward", *(f"rewards/{c}/mean" for c in COMPONENTS)} <= logged

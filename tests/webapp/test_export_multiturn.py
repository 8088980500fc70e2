"""DPO / SFT export of multi-turn runs (ask_to_code episodes played by the scripted policy, code
run in the sandbox): the prompt is what the policy saw, given once; `chosen` / `rejected` hold only
the assistant turns where the two trajectories part; tool and user replies are context, never a
completion. Checked through TRL 1.16's own preprocessing (maybe_extract_prompt, apply_chat_template,
is_conversational) on the tiny model's chat template."""

from __future__ import annotations

import json

import pytest

from tests.webapp.test_annotations import annotate
from training.demo_stories import story_groups
from training.environments import get_environment
from webapp.annotations import export
from webapp.annotations.models import Label
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import environment_from_training, get_or_create_run
from webapp.runs.models import Run


@pytest.fixture
def ask_run(personas):
    env = environment_from_training(get_environment("ask_to_code"))
    run, _ = get_or_create_run(
        name="ask", kind=Run.Kind.IMPORT, environment=env, owner=personas["trainer"]
    )
    # Step 0 of the fixed story: the policy plays every style, so a group holds a guess (code at
    # once) beside an ask-first or a solve.
    ingest_groups(run, {"groups": story_groups(False, steps=1, groups_per_step=2, G=6)})
    return run


def _pick(run: Run) -> tuple[Rollout, Rollout]:
    """A guessing rollout (code in the first turn) whose group has a better one that asked first."""
    for r in Rollout.objects.filter(run=run).order_by("id"):
        if (r.state or {}).get("policy_style") != "guess":
            continue
        better = (
            Rollout.objects.filter(group_id=r.group_id, reward__gte=r.reward + 0.1)
            .exclude(id=r.id)
            .order_by("-reward", "id")
            .first()
        )
        if better is not None:
            return r, better
    raise AssertionError("the story's first step has no guess with a better sibling")


def _export(run, user, fmt="conversational", kind="dpo", **kw):
    return export.export_dataset(
        name="multi",
        kind=kind,
        fmt=fmt,
        source="label",
        run=run,
        user=user,
        label=Label.objects.get(slug="premature-completion"),
        **kw,
    )


def lines(ds) -> list[dict]:
    return [json.loads(x) for x in export.jsonl_lines(ds)]


def test_it_exports_only_the_turns_after_the_shared_prompt_as_chosen_and_rejected(
    ask_run, personas
):
    bad, good = _pick(ask_run)
    annotate(bad, personas["annotator"], "premature-completion")
    [rec] = lines(_export(ask_run, personas["trainer"]))
    transcript = bad.transcript
    assert [m["role"] for m in transcript[:2]] == ["system", "user"]
    # The prompt is the episode's system + user messages, once; nothing of it is repeated below.
    assert rec["prompt"] == [{"role": m["role"], "content": m["content"]} for m in transcript[:2]]
    for side in ("chosen", "rejected"):
        assert rec[side] and all(m["role"] == "assistant" for m in rec[side]), rec[side]
    # The guess (its tool call appended as JSON) against the better sibling's first turn.
    assert rec["rejected"][0]["content"].startswith(transcript[2]["content"])
    assert rec["chosen"][0]["content"].startswith(good.transcript[2]["content"])
    assert rec["chosen_rollout_id"] == good.id


def test_it_keeps_tool_replies_before_a_correction_in_the_prompt(ask_run, personas):
    bad, _ = _pick(ask_run)
    roles = [m["role"] for m in bad.transcript]
    assert "tool" in roles, roles  # the guess ran its code: the tests' output is a tool turn
    after_tool = roles.index("tool") + 1
    annotate(
        bad,
        personas["annotator"],
        "premature-completion",
        corrected_completion="Which input format do you use?",
        first_wrong_turn=after_tool,
    )
    Rollout.objects.filter(id=bad.id).update(
        transcript=bad.transcript[:after_tool]
        + [{"role": "assistant", "content": "submit the same code again"}]
        + [{"role": "tool", "content": "0 of 3 tests passed"}]
    )
    [rec] = lines(_export(ask_run, personas["trainer"]))
    assert [m["role"] for m in rec["prompt"]] == roles[:after_tool]
    assert rec["prompt"][-1]["role"] == "tool"  # context, not a completion
    assert rec["chosen"] == [{"role": "assistant", "content": "Which input format do you use?"}]
    assert rec["rejected"] == [{"role": "assistant", "content": "submit the same code again"}]


@pytest.mark.slow  # imports transformers + trl (~20 s on a shared machine)
def test_it_writes_pairs_that_trls_preprocessing_reads_as_they_are(ask_run, personas, tmp_path):
    import datasets
    from trl.data_utils import apply_chat_template, is_conversational, maybe_extract_prompt

    from training.tiny import CHAT_TEMPLATE, _train_tokenizer

    for r in Rollout.objects.filter(run=ask_run, state__policy_style="guess"):
        annotate(r, personas["annotator"], "premature-completion")
    ds = _export(ask_run, personas["trainer"], min_margin=None)
    path = tmp_path / "dpo.jsonl"
    path.write_text("".join(export.jsonl_lines(ds)))
    data = datasets.load_dataset("json", data_files=str(path), split="train")
    assert len(data) >= 1
    tok = _train_tokenizer(
        [m["content"] for row in data for m in row["prompt"] + row["chosen"]] * 3, vocab_size=400
    )
    tok.chat_template = CHAT_TEMPLATE
    for row in data:
        assert is_conversational(row)
        assert maybe_extract_prompt(row) == row  # TRL leaves an explicit prompt as it is
        out = apply_chat_template(row, tok)
        user = row["prompt"][1]["content"]
        # The task statement is in the prompt once and in no completion; no role marker of a user,
        # system or tool message is in what DPO trains on.
        assert out["prompt"].count(user) == 1
        for side in ("chosen", "rejected"):
            assert user not in out[side]
            assert not any(f"<|{r}|>" in out[side] for r in ("user", "system", "tool"))
            assert out[side].endswith("<|end|>\n")
        assert out["prompt"].endswith("<|assistant|>\n")

"""The tiny-model demo chain: its configs are valid jobs, and the pieces it relies on (small-diagram
prompts, short reference answers) hold. The full chain takes minutes; it runs here with every stage
shrunk to a step or two."""

from __future__ import annotations

import pytest

from training.demo_chain import MAX_NODES, demo_chain_configs, demo_chain_stages

FILLED_BY_THE_WORKER = {"base_model", "output_dir", "data", "init_from"}


def _job_config(kind: str, config: dict, tmp_path):
    from training.eval import EvalJobConfig
    from training.grpo import GRPOJobConfig
    from training.sft import SFTJobConfig
    from training.teacher import TeacherJobConfig

    cls = {
        "teacher": TeacherJobConfig,
        "sft": SFTJobConfig,
        "grpo": GRPOJobConfig,
        "eval": EvalJobConfig,
    }[kind]
    filled = {**config, "output_dir": str(tmp_path)}
    if cls.requires_model:
        filled["base_model"] = "m"
    if kind == "sft":
        filled["data"] = "d.jsonl"
    return cls.from_dict(filled)


def test_it_lists_valid_job_configs_in_queue_order(tmp_path):
    chain = demo_chain_configs("diagram")
    assert [kind for kind, _ in chain] == ["teacher", "eval", "sft", "eval", "grpo", "eval"]
    stages = demo_chain_stages("diagram")
    assert [s.name for s in stages] == [
        "teacher",
        "eval_before_sft",
        "sft",
        "eval_after_sft",
        "grpo",
        "eval_after_grpo",
    ]
    assert [s.model_from for s in stages] == [None, "tiny", "tiny", "sft", "sft", "grpo"]
    assert stages[2].data_from == "teacher"
    for kind, config in chain:
        assert not FILLED_BY_THE_WORKER & set(config), kind
        _job_config(kind, config, tmp_path)  # raises on an unknown field or a bad value
    evals = [
        config for kind, config in chain if kind == "eval"
    ]  # the same held-out sample each time
    assert all(
        {k: v for k, v in e.items() if k != "step"}
        == {k: v for k, v in evals[0].items() if k != "step"}
        for e in evals
    )
    assert chain[1][1] is not demo_chain_configs("diagram")[1][1]  # callers may mutate their copy


def test_its_teacher_data_carries_the_habit_that_grpo_is_there_to_undo(tmp_path):
    """Half the teacher's answers forget every connection; the format filter keeps them."""
    from training.common import read_jsonl
    from training.teacher import TeacherJobConfig, main

    config = dict(demo_chain_configs())["teacher"]
    summary = main(
        TeacherJobConfig.from_dict({**config, "num_prompts": 64, "output_dir": str(tmp_path)})
    )
    kept = read_jsonl(summary["dataset"])
    assert summary["rejected"] == 0 and len(kept) == 64
    lazy = [r for r in kept if '"connect"' not in r["completion"][0]["content"]]
    assert 20 <= len(lazy) <= 44
    assert all(r["scores"]["json_valid"] == r["scores"]["schema_valid"] == 1.0 for r in kept)
    assert all(r["scores"]["semantic_coverage"] == 0.5 for r in lazy)  # every node, no edge


def test_it_keeps_to_small_diagrams_everywhere_it_samples_prompts():
    from training.environments.diagram import DiagramEnvironment

    chain = dict(demo_chain_configs())
    assert (
        chain["teacher"]["max_nodes"]
        == chain["grpo"]["max_nodes"]
        == chain["eval"]["max_nodes"]
        == MAX_NODES
    )
    env = DiagramEnvironment()
    small = env.prompts("holdout", 40, max_nodes=MAX_NODES)
    assert all(3 <= len(p.spec["nodes"]) <= MAX_NODES for p in small)
    assert all(p.split == "holdout" for p in small)
    assert env.prompts("holdout", 10, max_nodes=MAX_NODES) == small[:10]
    assert len({p.spec["family"] for p in small}) >= 3
    with pytest.raises(ValueError, match="^max_nodes:"):
        env.prompts("train", 5, max_nodes=2)


def test_it_rejects_max_nodes_for_an_environment_without_the_filter(tmp_path):
    from training.common import env_prompts, get_env
    from training.eval import EvalJobConfig

    with pytest.raises(ValueError, match="^max_nodes:"):
        EvalJobConfig(base_model="m", output_dir=str(tmp_path), max_nodes=-1)
    with pytest.raises(ValueError, match="^max_nodes:"):
        env_prompts(get_env("ask_to_code"), "train", 2, max_nodes=4)
    assert len(env_prompts(get_env("ask_to_code"), "train", 2)) == 2


def test_it_writes_reference_answers_short_enough_for_the_tiny_model(tiny_model):
    from transformers import AutoTokenizer

    from training.environments.diagram import DiagramEnvironment

    env = DiagramEnvironment()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts = env.prompts("holdout", 40, max_nodes=MAX_NODES)
    lengths = [len(tokenizer(env.solve(p))["input_ids"]) for p in prompts]
    eval_limit = demo_chain_configs()[1][1]["max_completion_length"]
    assert max(lengths) + 1 <= eval_limit  # + the <|end|> token
    # A request's node names are the same tokens in the prose request and in the JSON answer.
    prompt = prompts[0]
    name = prompt.spec["nodes"][-1]
    ids = tokenizer(name, add_special_tokens=False)["input_ids"]
    text_ids = tokenizer(prompt.text)["input_ids"]
    answer_ids = tokenizer(env.solve(prompt))["input_ids"]
    assert _contains(text_ids, ids) and _contains(answer_ids, ids)


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.slow
def test_it_runs_the_whole_chain_in_process_and_prints_the_table(tmp_path, capsys):
    from training.demo_chain import main

    tiny = [
        "sft.max_steps=2",
        "grpo.max_steps=1",
        "grpo.num_prompts=2",
        "grpo.max_completion_length=8",
        "eval.num_prompts=2",
        "eval.num_generations=2",
        "eval.max_completion_length=8",
        "teacher.num_prompts=8",
    ]
    rows = main(["--out", str(tmp_path), *[arg for item in tiny for arg in ("--set", item)]])
    assert [r["name"] for r in rows] == [
        "tiny_model",
        "teacher",
        "eval_before_sft",
        "sft",
        "eval_after_sft",
        "grpo",
        "eval_after_grpo",
    ]
    grpo = next(r for r in rows if r["name"] == "grpo")["summary"]
    assert grpo["global_step"] == 1
    table = capsys.readouterr().out
    assert "| before SFT" in table and "| after GRPO" in table and "chain as queued" in table
    assert (tmp_path / "demo_chain.md").read_text().strip() == table[
        table.index("| held-out") :
    ].strip()


@pytest.mark.slow
def test_the_full_chain_makes_json_valid_with_sft_and_raises_coverage_with_grpo(tmp_path):
    """The demo's claims, on the real configs (about three minutes on two cores): before SFT nothing
    is valid, after SFT the JSON is, and GRPO raises held-out coverage (measured 0.545 -> 0.68, the
    share of answers without connections 58% -> 9%; the margin below is ~4x the eval's noise)."""
    from training.demo_chain import run_chain

    rows = {r["name"]: r["summary"] for r in run_chain(tmp_path, log=lambda *_: None)}
    before, after_sft, after_grpo = (
        rows[n]["component_means"] for n in ("eval_before_sft", "eval_after_sft", "eval_after_grpo")
    )
    assert rows["eval_before_sft"]["reward_mean"] < 0.05
    assert before["json_valid"] < 0.05
    assert after_sft["json_valid"] > 0.95
    assert after_grpo["semantic_coverage"] > after_sft["semantic_coverage"] + 0.06
    assert rows["eval_after_grpo"]["reward_mean"] > rows["eval_after_sft"]["reward_mean"]

"""The offline tiny model: a tokenizer trained on the environment's text and a
random ~1M-param LM."""

from __future__ import annotations

import filecmp

import pytest

TEXTS = [
    "Draw a pipeline. Nodes: Ingest, Clean, Train.",
    '[{"action": "create_shape", "id": "a"}]',
] * 20


def test_it_builds_a_folder_that_auto_classes_load(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    n_params = sum(p.numel() for p in model.parameters())
    assert 200_000 < n_params < 2_000_000
    assert model.config.vocab_size == len(tokenizer) <= 2000
    assert tokenizer.eos_token == "<|end|>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_it_renders_a_prefix_preserving_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = [{"role": "user", "content": "Draw a pipeline."}]
    head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(
        prompt + [{"role": "assistant", "content": "[]"}], tokenize=False
    )
    assert head == "<|user|>\nDraw a pipeline.<|end|>\n<|assistant|>\n"
    assert full.startswith(head) and full.endswith("[]<|end|>\n")
    # The environment's own text compresses well: it is what the tokenizer was trained on.
    text = '{"action": "create_shape", "id": "ingest", "shape": "rect"}'
    assert len(tokenizer(text)["input_ids"]) < len(text) / 2


def test_it_is_deterministic_and_cached(tmp_path, tiny_model):
    from training.tiny import build_tiny_model, ensure_tiny_model

    a = build_tiny_model(tmp_path / "a", TEXTS, vocab_size=300, seed=1)
    b = build_tiny_model(tmp_path / "b", TEXTS, vocab_size=300, seed=1)
    assert filecmp.cmp(a / "tokenizer.json", b / "tokenizer.json", shallow=False)
    assert filecmp.cmp(a / "model.safetensors", b / "model.safetensors", shallow=False)
    cached = ensure_tiny_model("diagram", tmp_path / "cache")
    mtime = (cached / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model("diagram", tmp_path / "cache") == cached  # second call: no rebuild
    assert (cached / "model.safetensors").stat().st_mtime_ns == mtime


def test_it_builds_qwen2_and_rejects_unknown_archs(tmp_path):
    from transformers import AutoModelForCausalLM

    from training.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "q", TEXTS, vocab_size=300, arch="qwen2")
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen2"
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tmp_path / "x", TEXTS, arch="gpt9")


def test_it_has_a_cli(tmp_path, capsys):
    from training.tiny import main

    main(["--env", "diagram", "--out", str(tmp_path / "cli"), "--cache"])
    assert (tmp_path / "cli").exists() and "tiny-diagram-llama-" in capsys.readouterr().out

"""Build a tiny causal LM offline: a byte-level BPE tokenizer trained on an environment's own text
and a randomly initialised ~1M-parameter Llama/Qwen2, saved as an ordinary Hugging Face folder.

Nothing here downloads anything. The demo and the tests train this model; real users point
`base_model` at any HF path or hub id instead.

    python -m training.tiny --env diagram --out /tmp/tiny-diagram
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

# Special tokens. <|end|> closes every chat turn and is the eos: a completion ends when the
# model emits it.
PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]

# Prefix-preserving (prompt + generation prompt is a prefix of prompt + answer) and with
# {% generation %} markers around the assistant text and its <|end|>, so TRL's assistant_only_loss
# works and the model is trained to stop.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] }}{{ '<|end|>' }}{% "
    "endgeneration %}{{ '\n' }}"
    "{%- else -%}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)

BUILD_VERSION = "2"  # bump when the recipe changes, so ensure_tiny_model's cache is rebuilt

# Pre-tokens: runs of punctuation with the lowercase identifiers between them (JSON keys and enum
# values), lowercase words with the space before them (prose), other words without it (names start
# with a capital, so "Build" is one pre-token after a space or a quote alike), digit runs, and
# single whitespace characters.
PRE_TOKEN_PATTERN = r"(?:[^\s\p{L}\p{N}]+[a-z_]*)+| ?\p{Ll}\p{L}*|\p{L}+|\p{N}+|\s"


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    # A capitalised word never carries the space before it, so a name is the same token(s) in the
    # prose request ("Nodes: Build, Test") and in the JSON answer ('"id":"Build"'): copying it is
    # one lookup. Punctuation glues to the lowercase identifiers next to it, so JSON boilerplate
    # such as '{"action":"create_shape","id":"' can merge into a single token: answers stay short.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # All 256 bytes: any text is encodable
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        padding_side="left",  # GRPO and batched generation need left padding
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model_config(arch: str, vocab_size: int, tokenizer, hidden: int, layers: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"arch: expected 'llama' or 'qwen2', got {arch!r}")


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: list[str],
    *,
    vocab_size: int = 1500,
    arch: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Train a tokenizer on `texts`, build a randomly initialised model around it, save
    both to `out_dir`.

    Deterministic in (texts, vocab_size, arch, sizes, seed). Returns the folder, loadable with
    AutoModelForCausalLM / AutoTokenizer.from_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if not texts:
        raise ValueError("texts: need at least one text to train the tokenizer on")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(texts, vocab_size)
    config = _model_config(arch, len(tokenizer), tokenizer, hidden_size, num_layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def env_texts(env_name: str, n_prompts: int = 200) -> list[str]:
    """The environment's own text: prompts of both splits, their chat form
    and reference solutions."""
    from .common import get_env

    env = get_env(env_name)
    prompts = env.prompts("train", n_prompts, seed=0) + env.prompts(
        "holdout", n_prompts // 4, seed=0
    )
    texts: list[str] = []
    for p in prompts:
        texts.append(p.text)
        solution = env.solve(p)
        if solution is not None:
            texts.append(solution)
    return texts


def ensure_tiny_model(
    env_name: str, cache_dir: str | os.PathLike, *, arch: str = "llama", seed: int = 0
) -> Path:
    """Build the tiny model for `env_name` once under `cache_dir` and reuse it afterwards.

    The folder name carries a hash of the training text and recipe, so a changed environment or
    recipe builds a fresh folder instead of silently reusing a stale tokenizer."""
    texts = env_texts(env_name)
    digest = hashlib.sha256(json.dumps([BUILD_VERSION, arch, seed, texts]).encode()).hexdigest()[
        :12
    ]
    out = Path(cache_dir) / f"tiny-{env_name}-{arch}-{digest}"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    build_tiny_model(tmp, texts, arch=arch, seed=seed)
    try:
        os.replace(
            tmp, out
        )  # atomic: a concurrent builder either wins or finds the finished folder
    except OSError:
        import shutil

        shutil.rmtree(
            tmp, ignore_errors=True
        )  # another process got there first; its folder is identical
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--env", default="diagram", help="environment whose text trains the tokenizer"
    )
    parser.add_argument("--out", required=True, help="output folder (a cache folder with --cache)")
    parser.add_argument(
        "--arch", default="llama", choices=["llama", "qwen2"], help="model architecture"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument(
        "--cache", action="store_true", help="treat --out as a cache dir (ensure_tiny_model)"
    )
    args = parser.parse_args(argv)
    if args.cache:
        path = ensure_tiny_model(args.env, args.out, arch=args.arch, seed=args.seed)
    else:
        path = build_tiny_model(args.out, env_texts(args.env), arch=args.arch, seed=args.seed)
    print(path)
    return path


if __name__ == "__main__":
    main()

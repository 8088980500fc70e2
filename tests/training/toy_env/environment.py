"""The toy environment class: required members, then the optional capabilities it has."""

from __future__ import annotations

import random
from typing import Any

from training.environments.base import Component, Environment, Prompt, Split

from .rewards import brevity, shouted

WORDS = ("apple", "river", "stone", "cloud", "ember", "maple", "tiger", "lemon", "cabin", "delta")


def _prompt(word: str) -> Prompt:
    split: Split = "holdout" if word in ("delta", "lemon") else "train"
    return Prompt(key=f"toy-{word}", text=f"Shout: {word}", split=split, spec={"word": word})


class ToyPolicy:
    """The reference answer; at skill < 1 it sometimes whispers (lowercase) or babbles."""

    def __init__(self, seed: int = 0, skill: float = 1.0, faults: dict[str, float] | None = None):
        self.rng, self.skill, self.faults = random.Random(seed), skill, dict(faults or {})

    def sample(self, prompt: Prompt, rng: random.Random | None = None) -> str:
        rng = rng or self.rng
        word = prompt.spec["word"]
        if rng.random() < 1.0 - self.skill:
            return rng.choice([word, f"{word.upper()} {word.upper()}"])
        return word.upper()


class ToyEnvironment(Environment):
    name = "toy"
    description = "Shout the word back in capitals."

    def __init__(self) -> None:
        self.components = [
            Component("shouted", 1.0, shouted, "outcome"),
            Component("brevity", 0.5, brevity, "behavioural"),
        ]

    def prompts(self, split: Split, n: int, seed: int = 0) -> list[Prompt]:
        pool = [p for p in map(_prompt, WORDS) if p.split == split]
        random.Random(seed).shuffle(pool)
        return [pool[i % len(pool)] for i in range(n)]

    # Optional capabilities: each overrides a base method whose default means "none".

    def solve(self, prompt: Prompt) -> str:
        return prompt.spec["word"].upper()

    def scripted_policy(
        self, seed: int = 0, skill: float = 1.0, faults: dict[str, float] | None = None
    ) -> ToyPolicy:
        return ToyPolicy(seed, skill, faults)

    def reward_variants(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return {"shouted@any_case": ("shouted", {"ignore_case": True})}

    def stored_prompt(self, key: str, prompt: Any) -> Prompt | None:
        word = key.removeprefix("toy-")
        return _prompt(word) if word in WORDS else None

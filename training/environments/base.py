"""The contract every environment implements.

A reward component is a pure function of (prompt, completion) returning a `Score` (value and a
short reason). An environment bundles its components with their weights, a prompt generator
with a held-out split, an optional scripted policy (teacher / demo data) and an optional
renderer of its state.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ComponentKind = Literal["outcome", "process", "behavioural", "penalty"]
Split = Literal["train", "holdout"]


@dataclass(frozen=True)
class Score:
    """One component's verdict on one completion. `value` is NaN when the
    completion is unscorable."""

    value: float
    reason: str = ""


@dataclass(frozen=True)
class Prompt:
    """One task instance. `key` is stable across runs (it becomes the group key), `text` is what the
    policy sees, `spec` is whatever the reward functions need (hidden from the policy)."""

    key: str
    text: str
    split: Split
    spec: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = (
        None  # chat form of the prompt, when the env is multi-turn
    )


ScoreFn = Callable[[Prompt, Any], Score]  # (prompt, completion or transcript) -> Score


@dataclass(frozen=True)
class Component:
    name: str
    weight: float
    fn: ScoreFn
    kind: ComponentKind = "outcome"
    min_value: float = 0.0  # expected range: saturation / unreachability are measured against it
    max_value: float = 1.0
    description: str = ""

    def source_hash(self) -> str:
        """Hash of the component's source code, so two runs' rewards can be told apart."""
        try:
            src = inspect.getsource(self.fn)
        except (OSError, TypeError):
            src = repr(self.fn)
        return hashlib.sha256(src.encode()).hexdigest()[:16]


class Environment(Protocol):
    name: str
    description: str
    components: list[Component]

    def prompts(self, split: Split, n: int, seed: int = 0) -> list[Prompt]: ...

    def score(self, prompt: Prompt, completion: Any) -> dict[str, Score]: ...

    def state(self, prompt: Prompt, completion: Any) -> dict[str, Any]: ...

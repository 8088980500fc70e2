"""The contract every environment implements.

A reward component is a pure function of (prompt, completion) returning a `Score` (value and a
short reason). An environment is a package whose one `Environment` subclass bundles its
components with their weights, a prompt generator with a held-out split, and the optional
capabilities it has (a reference solution, a scripted policy, episodes, replay variants, stored
prompts), each a method whose default means "none". How to add one: docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

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


class Environment:
    """The base class every environment fills in.

    Required: `name`, `description`, `components`, `prompts()` and `score()`. Optional
    capabilities are methods with a default that says "this environment has none": callers ask
    them, they never probe an environment with hasattr or import its module by name.
    """

    name: str = ""
    description: str = ""
    components: list[Component]
    multi_turn: ClassVar[bool] = False  # True: reset() starts an episode (training.multiturn)
    max_turns: int = 1  # multi-turn: agent turns per episode (GRPO's max_turns sets it)
    # Keyword options prompts() takes beyond (split, n, seed), e.g. {"max_nodes"}: a job config
    # naming an option the environment lacks is refused (training.common.env_prompts).
    prompt_options: ClassVar[frozenset[str]] = frozenset()

    def prompts(self, split: Split, n: int, seed: int = 0) -> list[Prompt]:
        raise NotImplementedError

    def score(self, prompt: Prompt, completion: Any) -> dict[str, Score]:
        return {c.name: c.fn(prompt, completion) for c in self.components}

    def state(self, prompt: Prompt, completion: Any) -> dict[str, Any]:
        """What the rollout page shows beside the transcript (a rendered canvas, test results)."""
        return {}

    # ---- optional capabilities

    def solve(self, prompt: Prompt) -> Any:
        """A reference solution (the scripted teacher's answer, the tiny model's training text);
        None when the environment has none."""
        return None

    def scripted_policy(
        self, seed: int = 0, skill: float = 1.0, faults: dict[str, float] | None = None
    ) -> ScriptedPolicy | None:
        """A noisy scripted policy (teacher with skill < 1, demo data); None when there is none."""
        return None

    def reset(self, prompt: Prompt) -> Any:
        """Start a multi-turn episode (an object with `step`); only when `multi_turn` is True."""
        raise NotImplementedError(f"{self.name} is single-turn")

    def eval_checks(self, prompt: Prompt, completion: Any) -> dict[str, bool]:
        """Named yes/no properties of an answer whose share an eval reports beside the reward
        ("answers without connections"); {} when the environment has none."""
        return {}

    def reward_variants(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Named, replayable variants of components: {name: (component, params)}."""
        return {}

    def stored_prompt(self, key: str, prompt: Any) -> Prompt | None:
        """The Prompt (with its hidden spec) of a stored group, rebuilt from its key and the prompt
        the policy saw; None when the environment cannot rebuild it (a replay then fails those
        rollouts)."""
        return None


class ScriptedPolicy(Protocol):
    faults: dict[str, float]

    def sample(self, prompt: Prompt, rng: Any) -> Any: ...

"""The diagram environment: its components, prompts, reference solution, scripted policy,
replay variants and canvas state, filled into the `Environment` base class."""

from __future__ import annotations

import random
from typing import Any

from ..base import Component, Environment, Prompt, Split
from .canvas import Canvas, analyse
from .parsing import completion_text
from .policy import ScriptedDiagramPolicy, render_actions, solve_actions
from .prompts import seed_prompts, stored_prompt, synthetic_prompt
from .rewards import COMPONENTS, REWARD_VARIANTS


class DiagramEnvironment(Environment):
    name = "diagram"
    description = "Turn a diagram request into a JSON list of create_shape / connect actions."
    prompt_options = frozenset({"max_nodes"})

    def __init__(self) -> None:
        self.components: list[Component] = list(COMPONENTS)
        self._seeds = seed_prompts()

    def prompts(
        self, split: Split, n: int, seed: int = 0, max_nodes: int | None = None
    ) -> list[Prompt]:
        """n prompts of `split`: the seed set (shuffled by `seed`) then synthetic ones.

        `max_nodes` keeps only requests with at most that many nodes (small diagrams: shorter
        answers, an easier task for a tiny model). Deterministic in (split, n, seed, max_nodes), and
        a smaller n gives a prefix of a larger one."""
        if max_nodes is not None and max_nodes < 3:
            raise ValueError("max_nodes: must be >= 3 (the smallest requests have 3 nodes)")

        def fits(p: Prompt) -> bool:
            return max_nodes is None or len(p.spec["nodes"]) <= max_nodes

        out = [p for p in self._seeds if p.split == split and fits(p)]
        random.Random(seed).shuffle(out)
        seen = {p.text for p in self._seeds}
        start = index = seed * 100_000  # different seeds read different stretches of the stream
        while len(out) < n:
            if (
                index - start > 100 * n + 10_000
            ):  # the templates hold a few thousand distinct prompts
                raise ValueError(
                    f"only {len(out)} distinct {split} prompts available, asked for {n}"
                )
            p = synthetic_prompt(index)
            index += 1
            if p.split == split and p.text not in seen and fits(p):
                seen.add(p.text)
                out.append(p)
        return out[:n]

    def state(self, prompt: Prompt, completion: Any) -> dict[str, Any]:
        canvas = analyse(completion_text(completion)).canvas or Canvas()
        return {
            "svg": canvas.to_svg(),
            "errors": canvas.errors[:20],
            "n_shapes": len(canvas.shapes),
        }

    def solve(self, prompt: Prompt) -> str:
        return render_actions(solve_actions(prompt))

    def scripted_policy(
        self, seed: int = 0, skill: float = 1.0, faults: dict[str, float] | None = None
    ) -> ScriptedDiagramPolicy:
        return ScriptedDiagramPolicy(seed=seed, skill=skill, faults=faults)

    def reward_variants(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return REWARD_VARIANTS

    def stored_prompt(self, key: str, prompt: Any) -> Prompt | None:
        return stored_prompt(key, prompt)

    # Eval jobs: named yes/no properties of an answer whose share the eval
    # reports beside the reward. "Answers without connections" is the demo chain's habit: a
    # request that asks for connections, answered with none drawn (parsed or not).

    def eval_checks(self, prompt: Prompt, completion: Any) -> dict[str, bool]:
        if not prompt.spec.get("edges"):
            return {}
        canvas = analyse(completion_text(completion)).canvas
        return {"answers without connections": canvas is None or not canvas.edges}

"""The default label taxonomy: the failure modes of reward design, plus "good". Admins
edit it afterwards.

Installed by the data migration 0002_default_labels; `ensure_default_labels` re-creates missing
entries (idempotent: an existing slug is left as the admins edited it)."""

from __future__ import annotations

from typing import Any

DEFAULT_LABELS = [
    # slug, name, key, is_bad, color, description
    (
        "reward-hacking",
        "Reward hacking",
        "1",
        True,
        "#d62728",
        "Scores well by exploiting the reward (a verifier gap, a keyword match) without doing the "
        "task.",
    ),
    (
        "format-error",
        "Format error",
        "2",
        True,
        "#ff7f0e",
        "Breaks the required output or action format: unparsable, wrong schema, wrong tool-call "
        "syntax.",
    ),
    (
        "ignores-prompt",
        "Ignores the prompt",
        "3",
        True,
        "#8c564b",
        "Answers a different question or drops constraints the prompt states.",
    ),
    (
        "trivial-output",
        "Trivial output",
        "4",
        True,
        "#7f7f7f",
        "Empty, minimal or boilerplate output that does not attempt the task.",
    ),
    (
        "loop-repetition",
        "Loop / repetition",
        "5",
        True,
        "#9467bd",
        "Repeats text, tool calls or whole turns; often runs into the length limit.",
    ),
    (
        "premature-completion",
        "Premature completion",
        "6",
        True,
        "#e377c2",
        "Declares the task done (or stops) before it is; skips required steps.",
    ),
    (
        "copies-teacher-style",
        "Copies the teacher's style",
        "7",
        True,
        "#bcbd22",
        "Imitates surface features of the teacher traces (phrases, length, structure) without "
        "their substance.",
    ),
    (
        "false-positive-reward",
        "False-positive reward",
        "8",
        True,
        "#17becf",
        "High reward, bad completion: the reward says good, a reader says bad.",
    ),
    (
        "false-negative-reward",
        "False-negative reward",
        "9",
        False,
        "#1f77b4",
        "Low reward, good completion: the completion is fine and the reward under-rates it (not a "
        "bad case).",
    ),
    ("good", "Good", "0", False, "#2ca02c", "A good completion, correctly rewarded."),
]


def ensure_default_labels(label_model: Any = None) -> int:
    """Create the default labels that are missing; returns how many were created. `label_model`: the
    historical model inside a migration, else the app's own."""
    if label_model is None:
        from webapp.annotations.models import Label as label_model
    created = 0
    for position, (slug, name, key, is_bad, color, description) in enumerate(DEFAULT_LABELS):
        _, new = label_model.objects.get_or_create(
            slug=slug,
            defaults={
                "name": name,
                "key": key,
                "is_bad": is_bad,
                "color": color,
                "description": description,
                "position": position,
            },
        )
        created += new
    return created

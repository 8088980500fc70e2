"""A run's reward settings: what its aggregate rewards and advantages were computed with.

Stored in `Run.reward_settings`:

    {"weights": {component: float},   the weight of each reward component in the aggregate
     "scale_rewards": "group"|"batch"|"none",
     "aggregation": "sum_then_normalize"|"normalize_then_sum",   TRL's multi_objective_aggregation
     "advantage_epsilon": float,      added to the std in the advantage denominator (TRL 1e-4,
                                      verl 1e-6)
     "group_size": int,               completions per prompt (num_generations, n_samples_per_prompt)
     "trainer": {name: scalar},       everything else the trainer's recorder read (loss_type, beta,
                                      ...)
     "source": str}                   who set them last: "created", "trainer", "import"

They are given when the run is created (API, import) and overwritten by what the trainer reports
when training starts: the trainer's values are what it trained on. Every recomputation (ingest,
ablation, diagnostics, pages) reads them through `Run.reward_weights()` and
`Run.advantage_settings()`.
"""

from __future__ import annotations

import math
from typing import Any

from training import stats
from webapp.errors import FieldError

DEFAULTS: dict[str, Any] = {
    "scale_rewards": "group",
    "aggregation": "sum_then_normalize",
    "advantage_epsilon": stats.EPS,
    "group_size": None,
}
KEYS = (
    "weights",
    "scale_rewards",
    "aggregation",
    "advantage_epsilon",
    "group_size",
    "trainer",
    "source",
    "first_wins",
)
MAX_TRAINER_KEYS = 100


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(raw: Any, components: list[str], path: str = "reward_settings") -> dict[str, Any]:
    """The clean settings dict, or FieldError naming the first bad field. Weights must name
    components of the run's environment."""
    if not isinstance(raw, dict):
        raise FieldError(path, f"must be an object with any of {', '.join(KEYS)}")
    extra = sorted(set(raw) - set(KEYS))
    if extra:
        raise FieldError(
            f"{path}.{str(extra[0])[:80]}", f"unknown setting; expected {', '.join(KEYS)}"
        )
    out: dict[str, Any] = {}
    if raw.get("weights") is not None:
        out["weights"] = _weights(raw["weights"], components, f"{path}.weights")
    for key, choices in (("scale_rewards", stats.SCALES), ("aggregation", stats.AGGREGATIONS)):
        if raw.get(key) is not None:
            if raw[key] not in choices:
                raise FieldError(f"{path}.{key}", f"must be one of {', '.join(choices)}")
            out[key] = raw[key]
    out.update(_numbers(raw, path))
    if raw.get("trainer") is not None:
        out["trainer"] = _trainer(raw["trainer"], f"{path}.trainer")
    if raw.get("source") is not None:
        if not isinstance(raw["source"], str):
            raise FieldError(f"{path}.source", "must be a string")
        out["source"] = raw["source"][:100]
    if raw.get("first_wins") is not None:
        if not isinstance(raw["first_wins"], bool):
            raise FieldError(f"{path}.first_wins", "must be true or false")
        out["first_wins"] = raw["first_wins"]
    return out


def _numbers(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """advantage_epsilon and group_size, when given."""
    out: dict[str, Any] = {}
    eps = raw.get("advantage_epsilon")
    if eps is not None:
        if not _finite(eps) or eps < 0:
            raise FieldError(f"{path}.advantage_epsilon", "must be a finite number >= 0")
        out["advantage_epsilon"] = float(eps)
    size = raw.get("group_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 100_000:
            raise FieldError(f"{path}.group_size", "must be an integer between 1 and 100000")
        out["group_size"] = size
    return out


def _weights(raw: Any, components: list[str], path: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise FieldError(path, "must be an object of component name -> number")
    out = {}
    for name, w in raw.items():
        if name not in components:
            have = ", ".join(components) or "none"
            raise FieldError(
                f"{path}.{str(name)[:80]}",
                f"unknown component (this run's environment has: {have})",
            )
        if not _finite(w):
            raise FieldError(f"{path}.{name}", "must be a finite number")
        out[name] = float(w)
    return out


def _trainer(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or len(raw) > MAX_TRAINER_KEYS:
        raise FieldError(path, f"must be an object of at most {MAX_TRAINER_KEYS} name -> scalar")
    out = {}
    for k, v in raw.items():
        if v is not None and not isinstance(v, (str, bool)) and not _finite(v):
            raise FieldError(
                f"{path}.{str(k)[:80]}", "must be a string, a finite number, true/false or null"
            )
        out[str(k)[:100]] = v[:500] if isinstance(v, str) else v
    return out


def settle_config_weights(
    config: dict[str, Any], own: dict[str, Any], components: list[str] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One source of truth for a run's weights: a job config's `reward_weights` (by name, or a
    list in component order) moves into the reward settings, under any weight they already hold
    (the trainer's win), and leaves the config. Returns (config, reward settings), new dicts."""
    given = config.get("reward_weights")
    if isinstance(given, list) and components is not None and len(given) == len(components):
        given = dict(zip(components, given, strict=True))
    if not isinstance(given, dict):
        return config, own
    config = {k: v for k, v in config.items() if k != "reward_weights"}
    weights = {str(k): float(v) for k, v in given.items() if _finite(v)}
    merged = {**weights, **(own.get("weights") or {})}
    return config, {**own, "weights": merged, "source": own.get("source") or "created"}


def _exact(w: float | None) -> str:
    """A weight short where that loses nothing (2, 0.5), in full where it would: a log line never
    reads "0.2 replaces 0.2" for two different numbers."""
    if w is None:
        return "none"
    short = f"{w:g}"
    return short if float(short) == w else repr(float(w))


def advantage_settings(own: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The run's own settings over the job config's (scale_rewards, multi_objective_aggregation,
    num_generations: what a launched job was configured with) over TRL's defaults."""
    from_config = {
        "scale_rewards": config.get("scale_rewards"),
        "aggregation": config.get("multi_objective_aggregation"),
        "group_size": config.get("num_generations"),
    }
    out = {}
    for key, default in DEFAULTS.items():
        value = own.get(key)
        out[key] = (
            value
            if value is not None
            else (from_config.get(key) if from_config.get(key) is not None else default)
        )
    return out


def apply(run: Any, settings: dict[str, Any], source: str) -> list[str]:
    """Store validated `settings` on `run` (a Run); the new values win over the stored ones.
    Returns one line per value that changed, which also goes to the run's log. Rollouts stored
    before keep their aggregate reward (it may be the trainer's own); ablations and diagnostics use
    the new values."""
    settings = dict(settings)
    stored = run.reward_settings or {}
    if (
        settings.pop("first_wins", False)
        and stored.get("weights")
        and stored.get("source") == source
    ):
        # Several processes of one trainer each fit the weights; the first posted stays, and
        # each process completes its rows with the run's (the answer carries them).
        settings.pop("weights", None)
        settings.pop("trainer", None)
    comps = run.components()
    weights_before = run.reward_weights(comps)
    before = run.advantage_settings()
    changes = []
    for name, w in (settings.get("weights") or {}).items():
        if weights_before.get(name) != w:
            old = weights_before.get(name)
            changes.append(f"weight of {name}: {_exact(w)} replaces {_exact(old)}")
    for key in DEFAULTS:
        if key in settings and settings[key] != before[key]:
            changes.append(f"{key}: {settings[key]!r} replaces {before[key]!r}")
    merged = {**(run.reward_settings or {}), **settings, "source": source}
    if "weights" in settings:
        merged["weights"] = {
            **((run.reward_settings or {}).get("weights") or {}),
            **settings["weights"],
        }
    type(run).objects.filter(id=run.id).update(reward_settings=merged)
    run.reward_settings = merged
    if changes:
        run.append_log("".join(f"reward settings from the {source}: {line}\n" for line in changes))
    return changes

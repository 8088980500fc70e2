"""Environment registration and run-level recomputation (shared by the API, workers and commands)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from django.db import connection, transaction

from training import stats
from webapp.errors import Conflict, FieldError
from webapp.rollouts.models import Environment, Group, GroupComponentStat, RewardComponent, Rollout
from webapp.runs.models import Run

KINDS = {k for k, _ in RewardComponent.Kind.choices}


ENVIRONMENT_FIELDS = ("name", "components")
COMPONENT_FIELDS = (
    "name",
    "weight",
    "kind",
    "min_value",
    "max_value",
    "description",
    "source_hash",
)


def _no_unknown_keys(obj: dict[str, Any], allowed: tuple[str, ...], path: str) -> None:
    for key in obj:
        if key not in allowed:
            name = str(key)[:100] or '""'
            raise FieldError(f"{path}.{name}", f"unknown field; expected {', '.join(allowed)}")


def validate_environment_spec(
    spec: Any, path: str = "environment"
) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(spec, dict):
        raise FieldError(path, "must be an object with name and components")
    _no_unknown_keys(spec, ENVIRONMENT_FIELDS, path)
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise FieldError(f"{path}.name", "must be a non-empty string of at most 200 characters")
    comps = spec.get("components", [])
    if not isinstance(comps, list):
        raise FieldError(f"{path}.components", "must be a list")
    out, seen = [], set()
    for i, c in enumerate(comps):
        p = f"{path}.components[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"].strip():
            raise FieldError(f"{p}.name", "must be a non-empty string")
        _no_unknown_keys(c, COMPONENT_FIELDS, p)
        for key in ("description", "source_hash"):
            if not isinstance(c.get(key, ""), str):
                raise FieldError(f"{p}.{key}", "must be a string")
        if len(c["name"]) > 200 or not all(ch.isalnum() or ch in "_-./" for ch in c["name"]):
            raise FieldError(f"{p}.name", "letters, digits, _ - . / only, at most 200 characters")
        if c["name"] in seen:
            raise FieldError(f"{p}.name", f"duplicate component {c['name']!r}")
        seen.add(c["name"])
        w = c.get("weight", 1.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise FieldError(f"{p}.weight", "must be a finite number")
        kind = c.get("kind", "outcome")
        if kind not in KINDS:
            raise FieldError(f"{p}.kind", f"must be one of {', '.join(sorted(KINDS))}")
        for key in ("min_value", "max_value"):
            v = c.get(key)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            ):
                raise FieldError(f"{p}.{key}", "must be a finite number or null")
        out.append(
            {
                "name": c["name"],
                "weight": float(w),
                "kind": kind,
                "min_value": c.get("min_value"),
                "max_value": c.get("max_value"),
                "description": str(c.get("description", ""))[:2000],
                "source_hash": str(c.get("source_hash", ""))[:64],
            }
        )
    return name.strip(), out


# Namespaces of the advisory locks that serialise find-or-create by name (first key of pg_advisory_xact_lock).
RUN_NAME_LOCK = 0x52554E  # "RUN"
ENVIRONMENT_NAME_LOCK = 0x454E56  # "ENV"


def lock_name(namespace: int, name: str) -> None:
    """Hold a lock on `name` until the current transaction ends, so that two find-or-create calls for
    one name run one after the other: the second finds what the first created.

    Postgres: a transaction-scoped advisory lock on (namespace, hashtext(name)); two names that hash
    alike only wait for each other. SQLite: nothing to take here, because settings open every
    transaction with BEGIN IMMEDIATE, which takes the database's single write lock, so writers are
    already serialised whole (across processes too)."""
    if not connection.in_atomic_block:
        raise RuntimeError(
            "lock_name must run inside transaction.atomic: the lock ends with the transaction"
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [namespace, name])


@transaction.atomic
def ensure_environment(
    name: str, components: list[dict[str, Any]], description: str = ""
) -> Environment:
    """Get or create the environment and add any component it lacks. Existing components keep their
    stored weight (a run's own weights live in run.config["reward_weights"]). Safe to call from two
    processes at once (two importers of one new run): the name lock makes the second see the first's rows."""
    lock_name(ENVIRONMENT_NAME_LOCK, name)
    env, _ = Environment.objects.get_or_create(name=name, defaults={"description": description})
    have = {c.name: c for c in env.components.all()}
    for pos, c in enumerate(components):
        if c["name"] in have:
            comp = have[c["name"]]
            if c.get("source_hash") and comp.source_hash != c["source_hash"]:
                comp.source_hash = c["source_hash"]
                comp.save(update_fields=["source_hash"])
            continue
        RewardComponent.objects.create(environment=env, position=len(have) + pos, **c)
    return env


def environment_from_training(env: Any) -> Environment:
    """Register a training/ environment object (its components, weights, ranges, source hashes)."""
    return ensure_environment(
        env.name,
        [
            {
                "name": c.name,
                "weight": c.weight,
                "kind": c.kind,
                "min_value": c.min_value,
                "max_value": c.max_value,
                "description": c.description,
                "source_hash": c.source_hash(),
            }
            for c in env.components
        ],
        getattr(env, "description", ""),
    )


def create_run(
    *,
    name: str,
    kind: str,
    environment: Environment | None,
    config: dict,
    owner=None,
    base_model: str = "",
    parent: Run | None = None,
    status: str = Run.Status.QUEUED,
) -> Run:
    weights = {c.name: c.weight for c in environment.components.all()} if environment else {}
    cfg = dict(config)
    cfg.setdefault("reward_weights", weights)
    provenance = {
        "components": {c.name: c.source_hash for c in environment.components.all()}
        if environment
        else {},
        "git_commit": git_commit(),
    }
    return Run.objects.create(
        name=name,
        kind=kind,
        environment=environment,
        config=cfg,
        owner=owner,
        base_model=base_model,
        parent=parent,
        status=status,
        provenance=provenance,
    )


class RunNameConflict(Conflict):
    """More than one run already has the name, so "the run named X" means nothing."""


@transaction.atomic
def get_or_create_run(
    *,
    name: str,
    kind: str,
    environment: Environment | None,
    config: dict | None = None,
    owner=None,
    base_model: str = "",
    parent: Run | None = None,
    status: str = Run.Status.RUNNING,
) -> tuple[Run, bool]:
    """The run named `name`, or a new one: (run, created). The one way to find-or-create a run by name
    (the API's `get_or_create`, `import_rollouts`, recorders and reward wrappers naming a run).

    Atomic: concurrent callers naming one run converge on one run. A run of any kind with the name is
    returned as it is (its kind, environment and owner are not compared: a caller that cares checks
    them); the other arguments only describe a run created here (see `create_run`). Raises
    RunNameConflict (field "name") when several runs already share the name.

    Why a lock and not a unique constraint: run names are labels, and job runs legitimately repeat them
    (every "demo · sft" of `make demo`), and databases already hold duplicates. A constraint on the name
    would refuse those rows and their migration; the lock serialises only find-or-create by name."""
    lock_name(RUN_NAME_LOCK, name)
    found = list(Run.objects.filter(name=name).select_related("environment").order_by("id")[:2])
    if len(found) > 1:
        raise RunNameConflict(
            "name",
            f"more than one run is named {name[:200]!r}; rename all but one to use it "
            "by name, or use the run id",
        )
    if found:
        return found[0], False
    run = create_run(
        name=name,
        kind=kind,
        environment=environment,
        config=config or {},
        owner=owner,
        base_model=base_model,
        parent=parent,
        status=status,
    )
    return run, True


def git_commit() -> str:
    import subprocess
    from pathlib import Path

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


@transaction.atomic
def recompute_run_stats(run: Run) -> dict[str, int]:
    """Recompute every group's aggregate and per-component statistics from the stored scores.

    Used after a run's weights change or to repair stats; advantages sent by a trainer are kept.
    """
    from webapp.rollouts import arrays
    from webapp.rollouts.ingest import run_weights

    comps = run.components()
    data = arrays.read(run.id, [c.id for c in comps])
    gids, matrix = data["group_ids"], data["matrix"]
    if not len(gids):
        return {"groups": 0, "rollouts": 0}
    uniq, inv = np.unique(gids, return_inverse=True)
    rewards = np.nansum(matrix * run_weights(run, comps)[None, :], axis=1)
    rewards[np.isnan(matrix).all(axis=1)] = np.nan
    # A reward the trainer sent (stored on the rollout) wins over the recomputed weighted sum.
    stored = dict(Rollout.objects.filter(run=run).values_list("id", "reward"))
    sent = np.array([np.nan if stored.get(i) is None else stored[i] for i in data["ids"].tolist()])
    rewards = np.where(np.isnan(sent), rewards, sent)
    agg = stats.group_stats(rewards, inv, len(uniq))
    cs = stats.group_stats(matrix, inv, len(uniq))
    steps = dict(Group.objects.filter(run=run).values_list("id", "step"))
    GroupComponentStat.objects.filter(run=run).delete()
    fz = lambda x: None if x is None or math.isnan(x) else float(x)  # noqa: E731
    groups = []
    for gi, gid in enumerate(uniq.tolist()):
        std = fz(agg.std[gi])
        groups.append(
            Group(
                id=gid,
                reward_mean=fz(agg.mean[gi]),
                reward_std=std,
                zero_std=agg.count[gi] == 0 or std is None or std <= stats.ZERO_STD_ATOL,
                all_unscorable=bool(agg.count[gi] == 0),
            )
        )
    Group.objects.bulk_update(
        groups, ["reward_mean", "reward_std", "zero_std", "all_unscorable"], batch_size=1000
    )
    new_stats = [
        GroupComponentStat(
            group_id=gid,
            component=comp,
            run=run,
            step=steps[gid],
            count=int(cs.count[gi, j]),
            mean=fz(cs.mean[gi, j]),
            std=fz(cs.std[gi, j]),
            min=fz(cs.min[gi, j]),
            max=fz(cs.max[gi, j]),
            zero_std=bool(cs.zero_std[gi, j]),
        )
        for gi, gid in enumerate(uniq.tolist())
        for j, comp in enumerate(comps)
        if cs.count[gi, j] > 0
    ]
    GroupComponentStat.objects.bulk_create(new_stats, batch_size=1000)
    from webapp.rollouts.ingest import step_stat_rows, upsert_step_stats
    from webapp.rollouts.models import StepStat

    StepStat.objects.filter(run=run).delete()
    group_steps = np.array([steps[g] for g in uniq.tolist()])
    upsert_step_stats(
        run.id,
        step_stat_rows(
            group_steps,
            comps,
            {"gid": inv, "reward": rewards, "matrix": matrix, "agg": agg, "comp": cs},
        ),
    )
    return {"groups": len(uniq), "rollouts": int(len(gids))}

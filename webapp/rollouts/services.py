"""Environment registration and run-level recomputation (shared by the API,
workers and commands)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from django.db import connection, transaction

from webapp.errors import Conflict, FieldError
from webapp.rollouts.models import (
    Environment,
    GroupComponentStat,
    RewardComponent,
    Rollout,
    StepStat,
)
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
        out.append(_component_spec(c, f"{path}.components[{i}]", seen))
    return name.strip(), out


def _component_spec(c: Any, p: str, seen: set[str]) -> dict[str, Any]:
    """One component of an environment spec, checked; `seen` holds the names before it."""
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
    if not _finite(w):
        raise FieldError(f"{p}.weight", "must be a finite number")
    kind = c.get("kind", "outcome")
    if kind not in KINDS:
        raise FieldError(f"{p}.kind", f"must be one of {', '.join(sorted(KINDS))}")
    for key in ("min_value", "max_value"):
        if c.get(key) is not None and not _finite(c[key]):
            raise FieldError(f"{p}.{key}", "must be a finite number or null")
    return {
        "name": c["name"],
        "weight": float(w),
        "kind": kind,
        "min_value": c.get("min_value"),
        "max_value": c.get("max_value"),
        "description": str(c.get("description", ""))[:2000],
        "source_hash": str(c.get("source_hash", ""))[:64],
    }


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


# Namespaces of the advisory locks that serialise find-or-create by name (first key of
# pg_advisory_xact_lock).
RUN_NAME_LOCK = 0x52554E  # "RUN"
ENVIRONMENT_NAME_LOCK = 0x454E56  # "ENV"


def lock_name(namespace: int, name: str) -> None:
    """Hold a lock on `name` until the current transaction ends, so that two find-or-create calls
    for one name run one after the other: the second finds what the first created.

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
    """Get or create the environment and add any component it lacks. Existing components keep
    their stored weight (a run's own weights live on the run: Run.reward_weights). Safe to call
    from two processes at once (two importers of one new run): the name lock makes the second see
    the first's rows."""
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
        env.description,
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
    # The weights are the run's reward settings (Run.save moves a config's reward_weights there);
    # without any, Run.reward_weights reads the environment's defaults.
    cfg = dict(config)
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
    """The run named `name`, or a new one: (run, created). The one way to find-or-create a run by
    name (the API's `get_or_create`, `import_rollouts`, recorders and reward wrappers naming a run).

    Atomic: concurrent callers naming one run converge on one run. A run of any kind with the name
    is returned as it is (its kind, environment and owner are not compared: a caller that cares
    checks them); the other arguments only describe a run created here (see `create_run`). Raises
    RunNameConflict (field "name") when several runs already share the name.

    Why a lock and not a unique constraint: run names are labels, and job runs legitimately repeat
    them (every "demo · sft" of `make demo`), and databases already hold duplicates. A constraint
    on the name would refuse those rows and their migration; the lock serialises only
    find-or-create by name."""
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
    """Rebuild a run's derived rows from its stored scores, with the code ingestion uses: each
    group's aggregate statistics, its GroupComponentStat rows and the run's StepStat rows.

    The repair path for a run whose statistics are missing or stale (StepStat came after the first
    runs were stored and no migration backfills it). Stored rewards and advantages are kept: they
    are what the trainer used; a missing reward stays missing.
    """
    from webapp.rollouts import arrays, ingest_stats, rows
    from webapp.rollouts.ingest_write import insert, upsert_step_stats

    comps = run.components()
    data = arrays.read(run.id, [c.id for c in comps])
    if not len(data["ids"]):
        return {"groups": 0, "rollouts": 0}
    group_ids, first, group_of = np.unique(
        data["group_ids"], return_index=True, return_inverse=True
    )
    sent = dict(Rollout.objects.filter(run=run).values_list("id", "reward"))
    nan = math.nan
    s = ingest_stats.compute(
        run,
        comps,
        data["matrix"],
        group_of,
        data["steps"][first],
        sent_reward=np.array([nan if sent[i] is None else sent[i] for i in data["ids"].tolist()]),
        sent_advantage=np.full(len(data["ids"]), 0.0),  # kept as stored: not rewritten here
        # a stored null is the trainer's "not scored" (or nothing scored): never re-derived
        reward_missing=np.array([sent[i] is None for i in data["ids"].tolist()], dtype=bool),
    )
    with connection.cursor() as cur:
        cur.executemany(
            "UPDATE rollouts_group SET reward_mean = %s, reward_std = %s, zero_std = %s, "
            "all_unscorable = %s WHERE id = %s",
            [(*st, gid) for st, gid in zip(rows.group_stats(s), group_ids.tolist(), strict=True)],
        )
    GroupComponentStat.objects.filter(run=run).delete()
    stats_table = rows.stat_rows(run.id, comps, s, group_ids.tolist())
    insert([rows.Table(GroupComponentStat._meta.db_table, rows.STAT_COLUMNS, stats_table)])
    StepStat.objects.filter(run=run).delete()
    upsert_step_stats(run.id, ingest_stats.step_stat_rows(s, comps))
    return {"groups": len(group_ids), "rollouts": len(data["ids"])}

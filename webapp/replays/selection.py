"""What a replay covers: the request parsed, its groups selected and packed into chunks.

`create_replay` validates {"versions", "selection", "name"?} (versions registered for the run's
environment, a selection of all groups, a step window or a sample, fixed at the last group stored
now) and stores the replay with its chunks of whole groups, about CHUNK_ROLLOUTS rollouts each.
A FieldError names the bad field; nothing is stored then. Workers then claim the chunks
(queue.py).
"""

from __future__ import annotations

import random
from typing import Any

from django.conf import settings
from django.db import transaction

from training import reward_versions as rv
from webapp.errors import FieldError
from webapp.replays.models import Replay, ReplayChunk
from webapp.rollouts.models import Group
from webapp.runs.models import Run

CHUNK_ROLLOUTS = (
    1000  # rollouts per chunk: small enough to spread over workers, big enough to amortise queries
)
MAX_VERSIONS = 8
MAX_SAMPLE_GROUPS = 1_000_000


def chunk_rollouts() -> int:
    return int(getattr(settings, "REPLAY_CHUNK_ROLLOUTS", CHUNK_ROLLOUTS))


def _int(raw: dict[str, Any], key: str, path: str, low: int, high: int) -> int | None:
    v = raw.get(key)
    if v is None or v == "":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise FieldError(f"{path}.{key}", f"must be a whole number from {low} to {high}")
    return v


def parse_selection(raw: Any) -> dict[str, Any]:
    """{"mode": "all"} | {"mode": "steps", "step_min", "step_max"} | {"mode":
    "sample", "groups", "seed"}."""
    raw = {"mode": "all"} if raw is None else raw
    if not isinstance(raw, dict) or raw.get("mode") not in ("all", "steps", "sample"):
        raise FieldError("selection.mode", "must be all, steps or sample")
    extra = set(raw) - {"mode", "step_min", "step_max", "groups", "seed"}
    if extra:
        raise FieldError(f"selection.{sorted(extra)[0][:80]}", "unknown key")
    out: dict[str, Any] = {"mode": raw["mode"]}
    if raw["mode"] == "steps":
        out["step_min"] = _int(raw, "step_min", "selection", 0, 2**31 - 1)
        out["step_max"] = _int(raw, "step_max", "selection", 0, 2**31 - 1)
        if (
            out["step_min"] is not None
            and out["step_max"] is not None
            and out["step_min"] > out["step_max"]
        ):
            raise FieldError("selection.step_max", "must not be below step_min")
    if raw["mode"] == "sample":
        out["groups"] = _int(raw, "groups", "selection", 1, MAX_SAMPLE_GROUPS)
        if out["groups"] is None:
            raise FieldError("selection.groups", "give how many groups to sample")
        out["seed"] = _int(raw, "seed", "selection", 0, 2**31 - 1) or 0
    return out


def parse_versions(run: Run, raw: Any) -> list[rv.ComponentVersion]:
    """Registered versions of components of the run's environment, one per component."""
    if run.environment_id is None:
        raise FieldError("run", "this run has no environment: nothing to replay")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_VERSIONS:
        raise FieldError("versions", f"must be a list of 1 to {MAX_VERSIONS} versions")
    names = {c.name for c in run.components()}
    out: list[rv.ComponentVersion] = []
    for i, spec in enumerate(raw):
        try:
            version = rv.from_spec(run.environment.name, spec, f"versions[{i}]")
        except rv.VersionError as e:
            raise FieldError(e.field, e.message) from None
        if version.component not in names:
            raise FieldError(
                f"versions[{i}].version",
                f"scores {version.component!r}, which this run's environment does not have",
            )
        if version.component in {v.component for v in out}:
            raise FieldError(f"versions[{i}].version", f"a second version of {version.component!r}")
        out.append(version)
    return out


def select_groups(run: Run, selection: dict[str, Any], last_group_id: int) -> list[tuple[int, int]]:
    """(group id, size) of the selected groups, in id order."""
    qs = Group.objects.filter(run=run, id__lte=last_group_id)
    if selection["mode"] == "steps":
        if selection.get("step_min") is not None:
            qs = qs.filter(step__gte=selection["step_min"])
        if selection.get("step_max") is not None:
            qs = qs.filter(step__lte=selection["step_max"])
    rows = list(qs.order_by("id").values_list("id", "size"))
    if selection["mode"] == "sample" and len(rows) > selection["groups"]:
        rows = sorted(random.Random(selection["seed"]).sample(rows, selection["groups"]))
    return rows


def plan_chunks(groups: list[tuple[int, int]], per_chunk: int) -> list[tuple[list[int], int]]:
    """Whole groups packed into chunks of about `per_chunk` rollouts: (group ids, rollouts)."""
    chunks: list[tuple[list[int], int]] = []
    ids: list[int] = []
    n = 0
    for gid, size in groups:
        ids.append(gid)
        n += size
        if n >= per_chunk:
            chunks.append((ids, n))
            ids, n = [], 0
    if ids:
        chunks.append((ids, n))
    return chunks


def _default_name(versions: list[rv.ComponentVersion]) -> str:
    parts = [
        v.label + ("" if not v.params or v.name and "+" not in v.name else f" {v.params}")
        for v in versions
    ]
    return ", ".join(parts)[:200]


@transaction.atomic
def create_replay(run: Run, raw: Any, user: Any = None) -> Replay:
    """Validate {"versions": [...], "selection": {...}, "name"?} and store the replay and its
    chunks. Raises FieldError naming the field; nothing is stored then."""
    if not isinstance(raw, dict):
        raise FieldError("body", "must be an object with versions, selection and optionally name")
    extra = set(raw) - {"versions", "selection", "name"}
    if extra:
        raise FieldError(sorted(extra)[0][:80], "unknown key; expected versions, selection, name")
    versions = parse_versions(run, raw.get("versions"))
    selection = parse_selection(raw.get("selection"))
    name = raw.get("name") or _default_name(versions)
    if not isinstance(name, str):
        raise FieldError("name", "must be a string")
    last = Group.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first() or 0
    groups = select_groups(run, selection, last)
    if not groups:
        raise FieldError("selection", "selects no stored groups of this run")
    replay = Replay.objects.create(
        run=run,
        name=name[:200],
        versions=[v.as_dict() for v in versions],
        selection=selection,
        last_group_id=last,
        run_was_live=not run.is_finished,
        created_by=user,
        total=sum(size for _, size in groups),
    )
    chunks = plan_chunks(groups, chunk_rollouts())
    ReplayChunk.objects.bulk_create(
        [
            ReplayChunk(replay=replay, index=i, group_ids=ids, n_rollouts=n)
            for i, (ids, n) in enumerate(chunks)
        ]
    )
    Replay.objects.filter(id=replay.id).update(n_chunks=len(chunks))
    replay.n_chunks = len(chunks)
    return replay

"""Creating a replay, scoring its chunks in workers, and summarising it.

Flow: `create_replay` validates the request (versions registered for the run's environment, a
selection) and stores the replay with its chunks (whole groups, about CHUNK_ROLLOUTS rollouts
each). The Celery task (workers.tasks.run_replay) calls `work`: claim a chunk atomically, score it,
store its values in one transaction, repeat; the first task enqueues PARALLEL-1 copies of itself,
so every free worker process joins in (no chord: the chunk rows are the queue). Whoever finds no
chunk left summarises, once.
"""

from __future__ import annotations

import io
import logging
import math
import random
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from training import reward_versions as rv
from training import stats
from webapp.errors import Conflict, FieldError
from webapp.replays.models import Replay, ReplayChunk, ReplayScore
from webapp.rollouts.ingest_stats import run_weights
from webapp.rollouts.models import Group, RewardComponent, Rollout
from webapp.runs.models import Run

log = logging.getLogger(__name__)

CHUNK_ROLLOUTS = (
    1000  # rollouts per chunk: small enough to spread over workers, big enough to amortise queries
)
STALE_SECONDS = 600  # a chunk claimed this long ago by a worker that died is claimable again
MAX_VERSIONS = 8
MAX_SAMPLE_GROUPS = 1_000_000
RESULT_KEYS = (
    "ids",
    "group_ids",
    "steps",
    "old",
    "new",
    "failed",
    "old_reward",
    "new_reward",
    "old_adv",
    "new_adv",
)


def parallel() -> int:
    """Task copies a replay asks for: more than the worker processes only costs a
    quick empty claim."""
    return int(getattr(settings, "REPLAY_PARALLEL", 2))


def chunk_rollouts() -> int:
    return int(getattr(settings, "REPLAY_CHUNK_ROLLOUTS", CHUNK_ROLLOUTS))


# ----------------------------------------------------------------------------------------- creating


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


REPLAY_TASK = "workers.tasks.run_replay"  # sent by name: webapp never imports workers


def enqueue(replay: Replay) -> None:
    """Send the replay's task to the default queue once the current transaction commits."""
    from webapp.celery import app

    transaction.on_commit(lambda: app.send_task(REPLAY_TASK, args=[replay.id], queue="default"))


# ----------------------------------------------------------------------------------------- training


def training_blocker(replay: Replay) -> str:
    """Why "train with this reward" is not offered for `replay` ("" when it is), in words the
    replay page shows."""
    run = replay.run
    if replay.status != Replay.Status.SUCCEEDED:
        return "the replay has not succeeded"
    if run.kind != Run.Kind.GRPO:
        return (
            f"this run is {'an' if run.kind[0] in 'aeiou' else 'a'} {run.kind} run, not a GRPO "
            "job of this app: it has no start point (base model and trainer config) to train a "
            "twin from. Replay a GRPO run launched here to train with the new reward"
        )
    if not run.base_model or not run.environment_id:
        return "this GRPO run names no base model or environment: a twin has no start point"
    return ""


def current_summary(replay: Replay, report: dict[str, Any]) -> str:
    """The replay's one-line summary recomputed from `report` (the annotations as they are now):
    the stored `summary` is the line as it stood when the replay finished."""
    from webapp.replays import analysis

    chunks = ReplayChunk.objects.filter(replay=replay)
    scored = chunks.filter(status=ReplayChunk.Status.DONE).aggregate(n=Sum("n_rollouts"))["n"]
    failed = chunks.filter(status=ReplayChunk.Status.FAILED).count()
    return analysis.summary_line(report, replay, scored or 0, failed)


def training_versions(replay: Replay) -> dict[str, dict[str, Any]]:
    """GRPOJobConfig.reward_versions for the twin: the versions the run itself trained with (a twin
    of a twin keeps them), the replay's on top."""
    keys = ("environment", "target", "params", "source_hash", "name")
    replayed = {v["component"]: {k: v.get(k) for k in keys} for v in replay.versions}
    return {**((replay.run.config or {}).get("reward_versions") or {}), **replayed}


@transaction.atomic
def launch_training(replay: Replay, user: Any) -> Run:
    """A GRPO twin of the replay's run: same start point (config, base model, weights), trained with
    the replayed versions (GRPOJobConfig.reward_versions), the run's child, queued through
    runs.launch (behind the run while it still trains). One twin per replay: a second call returns
    it. Raises FieldError when the run cannot be retrained or a version no longer resolves to the
    code that was replayed."""
    from training.environments import get_environment
    from webapp.runs import launch

    locked = (
        Replay.objects.select_for_update(
            of=("self",)
        )  # Postgres locks no outer-joined (nullable) row
        .select_related("run", "run__environment", "twin")
        .get(id=replay.id)
    )
    if locked.twin is not None:
        return locked.twin
    why = training_blocker(locked)
    if why:
        raise FieldError("replay", why)
    run, versions = locked.run, training_versions(locked)
    try:  # the worker would refuse them too, after waiting for a GPU: say so now
        rv.apply_versions(
            get_environment(run.environment.name),
            [{**v, "component": c} for c, v in versions.items()],
        )
    except (rv.VersionError, KeyError) as e:
        raise FieldError("versions", str(e)) from None
    twin = launch.twin_of(
        run,
        name=f"{run.name} / replay: {locked.name}",
        owner=user,
        reward_versions=versions,
        replay_of=run.id,
        replay_id=locked.id,
    )
    hashes = {
        **(twin.provenance.get("components") or {}),
        **{c: v["source_hash"] for c, v in versions.items()},
    }
    twin.provenance = {
        **twin.provenance,
        "components": hashes,
        "reward_versions": versions,
        "replay": locked.id,
    }
    twin.save(update_fields=["provenance"])
    Replay.objects.filter(id=locked.id).update(twin=twin)
    return twin


# ------------------------------------------------------------------------------------------ scoring


@dataclass
class _Version:
    component: RewardComponent
    fn: Any
    params: dict[str, Any]
    fail_value: float  # what a failed call scores: the component's declared minimum, else 0


def _prepare(replay: Replay) -> list[_Version]:
    """The replay's versions as callables; a VersionError if one no longer resolves
    on this worker."""
    comps = {c.name: c for c in replay.run.components()}
    out = []
    for v in replay.versions:
        fn = rv.resolve(v["target"])
        if rv.source_hash(fn) != v["source_hash"]:
            # The deployed code changed since the replay was created: its numbers would not be the
            # ones asked for.
            raise rv.VersionError(
                "target",
                f"{v['target']} changed since the replay was created "
                f"(source hash {rv.source_hash(fn)}, expected {v['source_hash']})",
            )
        comp = comps[v["component"]]
        lo = comp.min_value if comp.min_value is not None and math.isfinite(comp.min_value) else 0.0
        out.append(_Version(comp, fn, v["params"], lo))
    return out


ScoreRow = tuple[int, int, int, float, bool, str]  # replay, rollout, component, value, ok, reason


def score_groups(
    replay: Replay,
    group_ids: list[int],
    versions: list[_Version],
    timeout_s: float = rv.DEFAULT_TIMEOUT_S,
) -> tuple[list[ScoreRow], int]:
    """The replayed values of the groups' rollouts (rows to store) and how many rollouts
    had a failure."""
    env_name = replay.run.environment.name
    prompts = {
        gid: rv.prompt_for(env_name, key, prompt)
        for gid, key, prompt in Group.objects.filter(id__in=group_ids).values_list(
            "id", "key", "prompt"
        )
    }
    rows: list[ScoreRow] = []
    failed = 0
    with rv.deadlines():
        for rid, gid, transcript in (
            Rollout.objects.filter(group_id__in=group_ids)
            .order_by("id")
            .values_list("id", "group_id", "transcript")
            .iterator(chunk_size=500)
        ):
            prompt = prompts.get(gid)
            bad = False
            for v in versions:
                if prompt is None:
                    out = rv.Scored(
                        None,
                        f"failed: the {env_name} environment cannot rebuild this group's prompt",
                        False,
                    )
                else:
                    out = rv.score_one(v.fn, v.params, prompt, transcript, timeout_s)
                bad |= not out.ok
                rows.append(
                    (
                        replay.id,
                        rid,
                        v.component.id,
                        out.value if out.ok else v.fail_value,
                        out.ok,
                        out.reason,
                    )
                )
            failed += bad
    return rows, failed


def write_scores(rows: list[ScoreRow]) -> None:
    """Store score rows inside the caller's transaction: COPY on Postgres (no model instances: a
    fifth of a chunk's time went to building them), bulk_create elsewhere."""
    if connection.vendor != "postgresql":
        ReplayScore.objects.bulk_create(
            [
                ReplayScore(
                    replay_id=r[0],
                    rollout_id=r[1],
                    component_id=r[2],
                    value=r[3],
                    ok=r[4],
                    reason=r[5],
                )
                for r in rows
            ],
            batch_size=5000,
        )
        return
    with (
        connection.wrap_database_errors,
        connection.cursor() as django_cur,
        django_cur.cursor.copy(
            "COPY replays_replayscore (replay_id, rollout_id, component_id, value, ok, "
            "reason) FROM STDIN"
        ) as cp,
    ):
        for row in rows:
            cp.write_row(row)


def claim_chunk(replay_id: int, worker: str) -> ReplayChunk | None:
    """The next pending (or stale) chunk, claimed atomically; None when there is none left."""
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    claimable = Q(status=ReplayChunk.Status.PENDING) | Q(
        status=ReplayChunk.Status.RUNNING, claimed_at__lt=stale
    )
    while True:
        chunk = ReplayChunk.objects.filter(claimable, replay_id=replay_id).order_by("index").first()
        if chunk is None:
            return None
        now = timezone.now()
        n = ReplayChunk.objects.filter(claimable, id=chunk.id).update(
            status=ReplayChunk.Status.RUNNING, worker=worker[:200], claimed_at=now
        )
        if n == 1:
            chunk.status, chunk.worker, chunk.claimed_at = (
                ReplayChunk.Status.RUNNING,
                worker[:200],
                now,
            )
            return chunk
        # Another worker claimed it first: try the next one.


def process_chunk(replay: Replay, chunk: ReplayChunk, versions: list[_Version] | None) -> None:
    """Score and store one chunk, all or nothing. `versions` None: they failed to resolve here."""
    t0 = time.perf_counter()
    try:
        if versions is None:
            versions = _prepare(replay)
        rows, failed = score_groups(replay, chunk.group_ids, versions)
        with transaction.atomic():
            mine = ReplayChunk.objects.filter(
                id=chunk.id, status=ReplayChunk.Status.RUNNING, claimed_at=chunk.claimed_at
            )
            if not mine.update(
                status=ReplayChunk.Status.DONE, n_failed=failed, seconds=time.perf_counter() - t0
            ):
                # Declared stale and claimed by another worker meanwhile: its result
                # counts, not ours
                return
            write_scores(rows)
            Replay.objects.filter(id=replay.id).update(
                done=F("done") + chunk.n_rollouts, failed=F("failed") + failed
            )
    except Exception as e:  # a failed chunk stores nothing: the transaction above rolled back whole
        log.exception("replay %s chunk %s failed", replay.id, chunk.index)
        ReplayChunk.objects.filter(id=chunk.id).update(
            status=ReplayChunk.Status.FAILED, error=f"{type(e).__name__}: {e}"[:2000]
        )


def work(replay_id: int, worker: str | None = None) -> str:
    """Claim and score chunks until none is left, then summarise if this process is the last one."""
    worker = worker or socket.gethostname()
    replay = Replay.objects.select_related("run", "run__environment").filter(id=replay_id).first()
    if replay is None:
        return f"replay {replay_id} no longer exists"
    Replay.objects.filter(id=replay.id, status=Replay.Status.QUEUED).update(
        status=Replay.Status.RUNNING, started_at=timezone.now()
    )
    try:
        versions: list[_Version] | None = _prepare(replay)
    except Exception as e:
        versions = (
            None  # every chunk fails with the reason: nothing is scored with code that is not there
        )
        log.warning("replay %s: versions do not resolve: %s", replay.id, e)
    n = 0
    while True:
        if Replay.objects.filter(id=replay.id, cancel_requested=True).exists():
            _cancel(replay)
            break
        chunk = claim_chunk(replay.id, worker)
        if chunk is None:
            break
        process_chunk(replay, chunk, versions)
        n += 1
    finish(replay.id)
    replay.refresh_from_db()
    return (
        replay.summary
        or f"replay {replay.id}: {n} chunks scored here, {replay.done}/{replay.total} rollouts"
    )


def _cancel(replay: Replay) -> None:
    live = (Replay.Status.QUEUED, Replay.Status.RUNNING)
    done = Replay.objects.get(id=replay.id).done
    Replay.objects.filter(id=replay.id, status__in=live).update(
        status=Replay.Status.CANCELLED,
        finished_at=timezone.now(),
        summary=f"cancelled after {done:,} of {replay.total:,} rollouts",
    )


def finish(replay_id: int) -> bool:
    """Summarise once every chunk is done or failed; True for the one caller that did it. A summary
    begun more than STALE_SECONDS ago (its worker died) is begun again; summarising twice stores
    the same result."""
    busy = ReplayChunk.objects.filter(
        replay_id=replay_id, status__in=[ReplayChunk.Status.PENDING, ReplayChunk.Status.RUNNING]
    )
    if busy.exists():
        return False
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    claimable = Q(status=Replay.Status.RUNNING) | Q(
        status=Replay.Status.SUMMARISING, summarising_at__lt=stale
    )
    if not Replay.objects.filter(claimable, id=replay_id).update(
        status=Replay.Status.SUMMARISING, summarising_at=timezone.now()
    ):
        # Another worker is summarising (not for long enough to be presumed dead), or cancelled
        return False
    replay = Replay.objects.select_related("run", "run__environment").get(id=replay_id)
    try:
        summarise(replay)
    except Exception as e:
        log.exception("replay %s: summary failed", replay_id)
        Replay.objects.filter(id=replay_id).update(
            status=Replay.Status.FAILED,
            finished_at=timezone.now(),
            error=f"summary failed: {type(e).__name__}: {e}"[:2000],
            summary="failed while summarising",
        )
    return True


def stalled(replay: Replay) -> bool:
    """Nobody is working on `replay` and it is not finished: every worker that held a chunk or its
    summary died (no claim or summary for STALE_SECONDS), or its tasks were lost; and it was not
    re-queued within that time either. `resume` queues it again."""
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    if replay.resumed_at and replay.resumed_at >= stale:
        return False  # already re-queued: give that task the same time a worker gets
    if replay.status == Replay.Status.SUMMARISING:
        return replay.summarising_at is None or replay.summarising_at < stale
    if replay.status != Replay.Status.RUNNING or (replay.started_at and replay.started_at >= stale):
        return False
    return not ReplayChunk.objects.filter(
        replay=replay, status=ReplayChunk.Status.RUNNING, claimed_at__gte=stale
    ).exists()


def resume(replay: Replay) -> bool:
    """Queue a stalled replay again: its task reclaims the stale chunks, then the summary. False
    when it is not stalled (workers are on it, it is finished, or another caller just re-queued it:
    the claim on resumed_at is atomic, so many worker heartbeats queue one task)."""
    if not stalled(replay):
        return False
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    if not Replay.objects.filter(
        Q(resumed_at__isnull=True) | Q(resumed_at__lt=stale), id=replay.id
    ).update(resumed_at=timezone.now()):
        return False
    enqueue(replay)
    return True


RESUME_SCAN = 100  # unfinished replays looked at per heartbeat: a handful exist at a time


def resume_stalled() -> int:
    """Re-queue every stalled replay (called by each worker's heartbeat,
    workers/tasks.py); how many."""
    live = Replay.objects.filter(status__in=[Replay.Status.RUNNING, Replay.Status.SUMMARISING])
    return sum(resume(r) for r in live.order_by("id")[:RESUME_SCAN])


# ------------------------------------------------------------------------------------------ results


def advantage_settings(run: Run) -> dict[str, Any]:
    """The run's own advantage settings (Run.advantage_settings, the trainer's values), else its job
    config the way diagnostics read it before runs carried them."""
    if hasattr(run, "advantage_settings"):
        return run.advantage_settings()
    cfg = run.config or {}
    return {
        "scale_rewards": cfg.get("scale_rewards") or "group",
        "aggregation": cfg.get("multi_objective_aggregation") or "sum_then_normalize",
        "advantage_epsilon": stats.EPS,
    }


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.full(wanted.shape, -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, wanted, sorter=order), max(ids.size - 1, 0))
    found = ids[order[at]] == wanted if ids.size else np.zeros(wanted.shape, dtype=bool)
    return np.where(found, order[at], -1)


def compute_results(replay: Replay) -> dict[str, np.ndarray]:
    """Per rollout of the stored chunks: original and replayed component matrices, both
    aggregates and both advantages, recomputed with the run's own weights and settings by
    the shared function."""
    from webapp.diagnostics.services import load_run_arrays

    run = replay.run
    comps = run.components()
    data = load_run_arrays(run)
    groups = [
        g
        for ids in ReplayChunk.objects.filter(
            replay=replay, status=ReplayChunk.Status.DONE
        ).values_list("group_ids", flat=True)
        for g in ids
    ]
    keep = np.isin(data.group_ids, np.array(groups, dtype=np.int64))
    ids, gids, steps = data.rollout_ids[keep], data.group_ids[keep], data.steps[keep]
    old = data.matrix[keep]
    new = old.copy()
    failed = np.zeros(ids.size, dtype=bool)
    col = {c.id: j for j, c in enumerate(comps)}
    for cid in {c.id for c in comps if c.name in replay.components()}:
        rows = np.array(
            list(
                ReplayScore.objects.filter(replay=replay, component_id=cid).values_list(
                    "rollout_id", "value", "ok"
                )
            ),
            dtype=np.float64,
        ).reshape(-1, 3)
        at = _positions(ids, rows[:, 0].astype(np.int64))
        ok = at >= 0
        new[at[ok], col[cid]] = rows[ok, 1]
        failed[at[ok]] |= rows[ok, 2] == 0
    weights = run_weights(run, comps)
    s = advantage_settings(run)
    kw = {
        "scale_rewards": s["scale_rewards"],
        "aggregation": s["aggregation"],
        "batch_ids": steps,
        "eps": s.get("advantage_epsilon", stats.EPS),
    }
    before = stats.compute_advantages(old, weights, gids, **kw) if ids.size else None
    after = stats.compute_advantages(new, weights, gids, **kw) if ids.size else None
    empty = np.zeros(0)
    return {
        "ids": ids,
        "group_ids": gids,
        "steps": steps,
        "old": old,
        "new": new,
        "failed": failed,
        "old_reward": before.rewards if before else empty,
        "new_reward": after.rewards if after else empty,
        "old_adv": before.advantages if before else empty,
        "new_adv": after.advantages if after else empty,
    }


def pack_results(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def load_results(replay: Replay) -> dict[str, np.ndarray] | None:
    if replay.results is None:
        return None
    with np.load(io.BytesIO(bytes(replay.results)), allow_pickle=False) as z:
        return {k: z[k] for k in RESULT_KEYS}


def summarise(replay: Replay) -> None:
    """Store the result arrays, the headline numbers and the one-line summary; succeeded unless
    a chunk failed."""
    from webapp.replays import analysis

    arrays = compute_results(replay)
    comps = replay.run.components()
    report = analysis.compare(
        arrays,
        [c.name for c in comps],
        replay.components(),
        run_weights(replay.run, comps),
        analysis.regression_labels(replay.run_id),
    )
    failed_chunks = list(
        ReplayChunk.objects.filter(replay=replay, status=ReplayChunk.Status.FAILED).values_list(
            "error", flat=True
        )
    )
    scored = ReplayChunk.objects.filter(replay=replay, status=ReplayChunk.Status.DONE).aggregate(
        n=Sum("n_rollouts")
    )
    line = analysis.summary_line(report, replay, scored["n"] or 0, len(failed_chunks))
    status = Replay.Status.FAILED if failed_chunks else Replay.Status.SUCCEEDED
    error = (
        f"{len(failed_chunks)} of {replay.n_chunks} chunks failed; first: {failed_chunks[0]}"
        if failed_chunks
        else ""
    )
    Replay.objects.filter(id=replay.id).update(
        results=pack_results(arrays),
        stats=report["headline"],
        summary=line[:500],
        status=status,
        error=error[:2000],
        finished_at=timezone.now(),
    )


def report(replay: Replay) -> dict[str, Any] | None:
    """The comparison shown by the page, the API and reward_regress, from the stored arrays and the
    annotations as they are now (an annotation added after the replay counts at once)."""
    from webapp.replays import analysis

    arrays = load_results(replay)
    if arrays is None:
        return None
    comps = replay.run.components()
    return analysis.compare(
        arrays,
        [c.name for c in comps],
        replay.components(),
        run_weights(replay.run, comps),
        analysis.regression_labels(replay.run_id),
    )


@dataclass
class Regression:
    ok: bool  # no annotated reward hack outranks its group's median under the new reward
    headline: dict[str, Any]
    rows: list[dict[str, Any]]


def regress(replay: Replay) -> Regression:
    """The negative-test verdict of a finished replay (reward_regress and the API). Conflict when
    the replay has no results to judge."""
    if (
        replay.status not in (Replay.Status.SUCCEEDED, Replay.Status.FAILED)
        or replay.results is None
    ):
        raise Conflict(
            "replay", f"replay {replay.id} is {replay.status}: it has no results to check yet"
        )
    rep = report(replay)
    assert rep is not None
    return Regression(
        ok=not any(r["regression"] for r in rep["regression"]),
        headline=rep["headline"],
        rows=rep["regression"],
    )

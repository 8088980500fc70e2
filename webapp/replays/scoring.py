"""Scoring a replay's rollouts with the replayed versions, and storing the values.

`prepare` resolves the replay's versions to callables on this worker (refusing code whose source
changed since the replay was created); `score_groups` calls them on every rollout of some groups,
failing closed (a failed call scores the component's declared minimum, else 0, with the reason);
`write_scores` stores the rows in the caller's transaction (COPY on Postgres).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import connection

from training import reward_versions as rv
from webapp.replays.models import Replay, ReplayScore
from webapp.rollouts.models import Group, RewardComponent, Rollout


@dataclass
class Version:
    component: RewardComponent
    fn: Any
    params: dict[str, Any]
    fail_value: float  # what a failed call scores: the component's declared minimum, else 0


def prepare(replay: Replay) -> list[Version]:
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
        out.append(Version(comp, fn, v["params"], lo))
    return out


ScoreRow = tuple[int, int, int, float, bool, str]  # replay, rollout, component, value, ok, reason


def score_groups(
    replay: Replay,
    group_ids: list[int],
    versions: list[Version],
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

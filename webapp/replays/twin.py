"""Training with a replayed reward: a GRPO twin of the replay's run.

`launch_training` queues the twin (same start point, the replayed versions as its
reward_versions) through runs.launch, one per replay; `training_blocker` says in words why a
replay cannot be trained from.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from training import reward_versions as rv
from webapp.errors import FieldError
from webapp.replays.models import Replay
from webapp.runs.models import Run


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

"""A reward replay seen through a behaviour: how the replayed advantages of the behaviour's
rollouts change (the replay's stored result arrays, webapp/replays/results.py), beside the rest's.
A fix aimed at a hack should turn its rollouts' mean advantage from positive to negative."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from webapp.behaviours import services
from webapp.behaviours.models import Behaviour
from webapp.behaviours.patterns import Checker, PatternTimeout, compile_pattern
from webapp.errors import FieldError
from webapp.replays.models import Replay
from webapp.replays.services import load_results
from webapp.rollouts.models import Rollout


def matching_ids(b: Behaviour, run: Any) -> np.ndarray:
    """The ids of the run's rollouts showing the behaviour (its query, then its pattern)."""
    comps = run.components()
    try:
        q = services.explorer_query(b, comps)
    except FieldError as e:
        raise services.BehaviourError(
            f"its query no longer applies: {e.field}: {e.message}"
        ) from None
    parts = services.matching_rollouts(run, q, comps)
    ids = [i for p in parts for i in p.order_by().values_list("id", flat=True)]
    pattern = compile_pattern(b.pattern)
    if pattern is not None:
        check = Checker(pattern)
        try:
            docs = Rollout.objects.filter(id__in=ids).values_list("id", "search_text").iterator()
            ids = [rid for rid, doc in docs if check(doc or "")]
        except PatternTimeout as e:
            raise services.BehaviourError(str(e)) from None
    return np.array(sorted(ids), dtype=np.int64)


def _mean(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return round(float(x.mean()), 4) if x.size else None


def effect(b: Behaviour, replay: Replay) -> dict[str, Any]:
    """{behaviour, replayed, matches, advantage: {before, after}, rest: {before, after}} over the
    rollouts the replay re-scored; an `error` when it cannot be told."""
    out: dict[str, Any] = {"behaviour": b.id, "name": b.name, "replay": replay.id}
    arrays = load_results(replay)
    if arrays is None:
        return {**out, "error": f"replay {replay.id} has no results yet ({replay.status})"}
    try:
        mine = np.isin(arrays["ids"], matching_ids(b, replay.run))
    except services.BehaviourError as e:
        return {**out, "error": str(e)}
    old, new = arrays["old_adv"], arrays["new_adv"]
    before, after = _mean(old[mine]), _mean(new[mine])
    out.update(
        replayed=int(arrays["ids"].size),
        matches=int(mine.sum()),
        advantage={"before": before, "after": after},
        rest={"before": _mean(old[~mine]), "after": _mean(new[~mine])},
    )
    if before is not None and after is not None and not math.isclose(before, after):
        verb = "no longer paid for" if before > 0 >= after else "changed"
        out["summary"] = (
            f"'{b.name}': mean advantage of its {out['matches']} replayed rollouts {before:+.2f} "
            f"-> {after:+.2f} ({verb})"
        )
    return out


def effects(replay: Replay) -> list[dict[str, Any]]:
    run = replay.run
    return [effect(b, replay) for b in services.behaviours_of(run)]

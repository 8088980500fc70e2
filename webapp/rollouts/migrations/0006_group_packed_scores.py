"""Group.packed_scores: each group's score matrix in one blob (layout in Group's docstring), and a
backfill of every stored group, in batches, through the ORM (SQLite and Postgres alike).

The packing is copied here rather than imported: a migration must keep writing the layout it
shipped with, whatever webapp/rollouts/packed.py later becomes."""

from django.db import migrations, models, transaction

BATCH = 500  # groups per batch


def _pack(rows: list[tuple[int, int | None]], values: dict[tuple[int, int], float | None], cols: list[int]) -> bytes:
    import numpy as np

    rec = np.empty(len(rows), dtype=[("id", "<i8"), ("length", "<f8"), ("values", "<f8", (len(cols),))])
    rec["id"] = [rid for rid, _ in rows]
    rec["length"] = [np.nan if length is None else length for _, length in rows]
    nan = float("nan")
    rec["values"] = [[nan if (v := values.get((rid, c))) is None else v for c in cols] for rid, _ in rows]
    return rec.tobytes()


def backfill(apps, schema_editor) -> None:
    Group = apps.get_model("rollouts", "Group")
    Rollout = apps.get_model("rollouts", "Rollout")
    RewardScore = apps.get_model("rollouts", "RewardScore")
    RewardComponent = apps.get_model("rollouts", "RewardComponent")
    env_cols: dict[int | None, list[int]] = {None: []}
    for env_id, comp_id in RewardComponent.objects.order_by("environment_id", "position", "id").values_list(
            "environment_id", "id"):
        env_cols.setdefault(env_id, []).append(comp_id)
    last = 0
    while True:
        with transaction.atomic(using=schema_editor.connection.alias):
            last = _backfill_batch(Group, Rollout, RewardScore, env_cols, last)
        if last is None:
            return


def _backfill_batch(Group, Rollout, RewardScore, env_cols, last):
    """One batch of groups after id `last`, in the caller's transaction (one per batch: a group
    row is locked for one batch, never the whole backfill); its last id, None at the end."""
    batch = list(Group.objects.filter(id__gt=last, packed_scores__isnull=True).order_by("id")
                 .values_list("id", "run__environment_id")[:BATCH])
    if not batch:
        return None
    last = batch[-1][0]
    # Ranges, not IN lists: an index range scan whatever the planner's statistics say (a join on
    # `rollout__group_id IN (...)` was planned as a scan of every score row, per batch).
    rollouts: dict[int, list[tuple[int, int | None]]] = {gid: [] for gid, _ in batch}
    for rid, gid, length in (Rollout.objects.filter(group_id__gte=batch[0][0], group_id__lte=last)
                             .order_by("id").values_list("id", "group_id", "length")):
        if gid in rollouts:
            rollouts[gid].append((rid, length))
    group_of = {rid: gid for gid, rows in rollouts.items() for rid, _ in rows}
    values: dict[tuple[int, int], float | None] = {}
    seen: dict[int, set[int]] = {gid: set() for gid in rollouts}
    if group_of:
        for rid, cid, v in RewardScore.objects.filter(rollout_id__gte=min(group_of), rollout_id__lte=max(group_of)
                                                      ).values_list("rollout_id", "component_id", "value"):
            if rid in group_of:
                values[(rid, cid)] = v
                seen[group_of[rid]].add(cid)
    updates = []
    for gid, env_id in batch:
        # The environment's components, then any other component the group has scores for.
        cols = list(env_cols.get(env_id, []))
        cols += sorted(seen[gid] - set(cols))
        updates.append(Group(id=gid, packed_scores=_pack(rollouts[gid], values, cols),
                             packed_components=",".join(map(str, cols))))
    Group.objects.bulk_update(updates, ["packed_scores", "packed_components"])
    return last


class Migration(migrations.Migration):
    # Online (issue 30): each operation commits by itself and the backfill batch by batch (as first
    # shipped, the ADD COLUMNs' ACCESS EXCLUSIVE lock on groups was held through the whole backfill).
    # Databases that applied the first version keep the same end state.
    atomic = False

    dependencies = [
        ("rollouts", "0005_stepstat_nullable_sums"),
    ]

    operations = [
        migrations.AddField(
            model_name="group",
            name="packed_scores",
            field=models.BinaryField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="group",
            name="packed_components",
            field=models.TextField(blank=True, db_default="", default="", editable=False),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]

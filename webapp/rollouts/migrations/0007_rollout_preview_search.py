"""Rollout previews and search text (webapp/rollouts/text.py builds them at ingest), a backfill of every
stored rollout in batches, and on Postgres the pg_trgm extension and the trigram GIN index that search uses.

The builders are copied here rather than imported: a migration must keep writing what it shipped with,
whatever webapp/rollouts/text.py later becomes."""

import json

from django.db import migrations, models, transaction

from webapp.migration_ops import create_index_concurrently, drop_index_concurrently

BATCH = 500  # rollouts per batch
PREVIEW_CHARS = 300
PROMPT_ROLES = ("system", "user", "developer")
INDEX = ("rollout_search_trgm", "ON rollouts_rollout USING gin (UPPER(search_text) gin_trgm_ops)")


def _texts(m):
    out = [m["content"]] if isinstance(m.get("content"), str) and m["content"] else []
    for call in m.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, dict) else {}
        if not isinstance(fn, dict):
            out.append(f"({fn})")
            continue
        args = fn.get("arguments", "")
        out.append(f"{fn.get('name', '')}({args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})")
    return out


def _build(transcript, prompt, prompt_text, reasons):
    transcript = [m for m in transcript if isinstance(m, dict)] if isinstance(transcript, list) else []
    repeats = isinstance(prompt, list) and prompt and transcript[: len(prompt)] == prompt
    if repeats:
        rest = transcript[len(prompt):]
    else:
        start = 0
        while start < len(transcript) and transcript[start].get("role") in PROMPT_ROLES:
            start += 1
        rest = transcript[start:]
    text = " ".join(" ".join(p for m in (rest or transcript) for p in _texts(m)).split())
    head, tail = (text, "") if len(text) <= 2 * PREVIEW_CHARS else (text[:PREVIEW_CHARS], text[-PREVIEW_CHARS:])
    doc = [prompt_text] + [p for m in (transcript[len(prompt):] if repeats else transcript) for p in _texts(m)]
    return dict(preview_head=head, preview_tail=tail, n_turns=sum(m.get("role") == "assistant" for m in transcript),
                n_tool_calls=sum(len(m.get("tool_calls") or ()) for m in transcript), text_chars=len(text),
                search_text=" ".join(" ".join(doc + [r for r in reasons if r]).split()))


def backfill(apps, schema_editor) -> None:
    Rollout = apps.get_model("rollouts", "Rollout")
    RewardScore = apps.get_model("rollouts", "RewardScore")
    fields = ["preview_head", "preview_tail", "n_turns", "n_tool_calls", "text_chars", "search_text"]
    last = 0
    while True:
        with transaction.atomic(using=schema_editor.connection.alias):
            last = _backfill_batch(Rollout, RewardScore, fields, last)
        if last is None:
            return


def _backfill_batch(Rollout, RewardScore, fields, last):
    """One batch after id `last`, in the caller's transaction; the batch's last id, None at the end."""
    batch = list(Rollout.objects.filter(id__gt=last).order_by("id").select_related("group")
                 .only("id", "transcript", "group__prompt", "group__prompt_text")[:BATCH])
    if not batch:
        return None
    last = batch[-1].id
    reasons: dict[int, list[str]] = {}
    for rid, reason in (RewardScore.objects.filter(rollout_id__gte=batch[0].id, rollout_id__lte=last)
                        .exclude(reason="").order_by("rollout_id", "component_id").values_list("rollout_id", "reason")):
        reasons.setdefault(rid, []).append(reason)
    for r in batch:
        for k, v in _build(r.transcript, r.group.prompt, r.group.prompt_text, reasons.get(r.id, [])).items():
            setattr(r, k, v)
    Rollout.objects.bulk_update(batch, fields)
    return last


def create_extension(apps, schema_editor) -> None:
    # pg_trgm is a trusted extension (Postgres 13+): the database owner may create it.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")


def create_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        create_index_concurrently(schema_editor, *INDEX)


def drop_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        drop_index_concurrently(schema_editor, INDEX[0])


class Migration(migrations.Migration):
    # Online (issue 30): each operation commits by itself and the backfill batch by
    # batch (the ADD COLUMNs' ACCESS EXCLUSIVE lock was held through the whole backfill, stopping every
    # read and write of rollouts); the trigram index is built CONCURRENTLY. Databases that applied the first version keep the same end state.
    atomic = False

    dependencies = [
        ("rollouts", "0006_group_packed_scores"),
    ]

    operations = [
        migrations.AddField(model_name="rollout", name="preview_head",
                            field=models.TextField(blank=True, db_default="", default="")),
        migrations.AddField(model_name="rollout", name="preview_tail",
                            field=models.TextField(blank=True, db_default="", default="")),
        migrations.AddField(model_name="rollout", name="n_turns", field=models.IntegerField(db_default=0, default=0)),
        migrations.AddField(model_name="rollout", name="n_tool_calls",
                            field=models.IntegerField(db_default=0, default=0)),
        migrations.AddField(model_name="rollout", name="text_chars", field=models.IntegerField(db_default=0, default=0)),
        migrations.AddField(model_name="rollout", name="search_text",
                            field=models.TextField(blank=True, db_default="", default="")),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(create_extension, migrations.RunPython.noop),
        migrations.RunPython(create_index, drop_index),
    ]

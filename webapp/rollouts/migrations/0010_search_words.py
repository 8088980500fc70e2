"""The word index (webapp/rollouts/text.py search_words): each rollout's distinct words as a tsvector,
each run's vocabulary in SearchWord; on Postgres a backfill of every stored rollout in id-range
batches, then the indexes: GIN (search_words), a partial index of the rows left without
words, and a trigram GIN index on the vocabulary. SQLite gets the column and the table, unused (the
demo's search scans).

The word builder is copied here rather than imported: a migration must keep writing what it shipped
with, whatever text.py later becomes."""

from django.db import migrations, models, transaction

from webapp.migration_ops import create_index_concurrently, drop_index_concurrently

import webapp.rollouts.models

BATCH = 2000  # rollouts per batch
WORD_CHARS, WORD_STEP, MAX_WORDS = 64, 32, 40_000
_WORD_BYTES = bytes(c if 48 <= c <= 57 or 65 <= c <= 90 else 32 for c in range(256))
INDEXES = (
    # Lexemes carry their run ("63xWORD"): run-scoped with no run_id column, which the planner
    # would otherwise pick for a plain run filter.
    ("rollout_search_words", "ON rollouts_rollout USING gin (search_words)"),
    ("rollout_unindexed_words", "ON rollouts_rollout (run_id) WHERE search_words IS NULL"),
    ("searchword_run_trgm", "ON rollouts_searchword USING gin (run_id, word gin_trgm_ops)"),
)


def _words(doc):
    if "ı" in doc or "ſ" in doc:
        doc = doc.replace("ı", "I").replace("ſ", "S")
    words = set(doc.encode("utf-8", "replace").upper().translate(_WORD_BYTES).decode("ascii").split())
    for w in [w for w in words if len(w) > WORD_CHARS]:
        words.discard(w)
        words.update(w[i:i + WORD_CHARS] for i in range(0, max(len(w) - WORD_STEP, 1), WORD_STEP))
    return None if len(words) > MAX_WORDS else words


def backfill(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    connection = schema_editor.connection
    last = 0
    while True:
        # One transaction per batch (the migration is not atomic): a rollout row is locked for one
        # batch, never for the whole backfill, and ingestion goes on beside it.
        with transaction.atomic(using=connection.alias), connection.cursor() as cur:
            cur.execute("SELECT id, run_id, search_text FROM rollouts_rollout WHERE id > %s "
                        "ORDER BY id LIMIT %s", [last, BATCH])
            rows = cur.fetchall()
            if not rows:
                return
            last = rows[-1][0]
            ids, docs, vocab = [], [], {}
            for rid, run_id, text in rows:
                words = _words(text or "")
                ids.append(rid)
                docs.append(None if words is None else " ".join(f"{run_id}x{w}" for w in words))
                vocab.setdefault(run_id, set()).update(words or ())
            cur.execute("UPDATE rollouts_rollout AS r SET search_words = v.w::tsvector "
                        "FROM unnest(%s::bigint[], %s::text[]) AS v(id, w) WHERE r.id = v.id", [ids, docs])
            for run_id, words in vocab.items():
                cur.execute("INSERT INTO rollouts_searchword (run_id, word) SELECT %s, w "
                            "FROM unnest(%s::text[]) AS w ORDER BY w ON CONFLICT DO NOTHING",
                            [run_id, sorted(words)])


def create_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for name, rest in INDEXES:
            create_index_concurrently(schema_editor, name, rest)


def drop_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for name in ("rollout_search_words", "rollout_unindexed_words", "searchword_run_trgm"):
            drop_index_concurrently(schema_editor, name)


class Migration(migrations.Migration):
    # Online (issue 30): each operation commits by itself, the backfill batch by batch, and the
    # indexes are built CONCURRENTLY. As first shipped it ran in one transaction: the ADD COLUMN's
    # ACCESS EXCLUSIVE lock was held through the whole backfill, stopping every read and write of
    # rollouts. Databases that applied it keep the same end state.
    atomic = False

    dependencies = [
        ("rollouts", "0009_group_packed_scores_not_null"),
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="search_words",
            field=webapp.rollouts.models.WordsField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="SearchWord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("word", models.CharField(max_length=64)),
                ("run", models.ForeignKey(db_constraint=False, db_index=False,
                                          on_delete=models.deletion.CASCADE, related_name="+",
                                          to="runs.run")),
            ],
            options={"constraints": [models.UniqueConstraint(fields=("run", "word"),
                                                             name="searchword_unique")]},
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(create_indexes, drop_indexes),
    ]

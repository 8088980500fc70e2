# The word index's column (Rollout.search_words, a tsvector of ~400-800 run-prefixed words) under
# lz4 instead of pglz (issue 30 items 1 and 6): smaller and cheaper to write. Measured on 20,000
# realistic rollouts (bench/storage.py's database, the same values rewritten under each method,
# alternating): 4,761 bytes a value against 5,570, and the whole rewrite of the three text columns
# 2.5x faster when all three used lz4 (pglz has no entropy coder and compresses slowly). Kept on
# pglz: the transcript and the search text, where lz4 stores ~1.7 KB a rollout more (7.7 against
# 6.0 KB, 6.9 against 5.3). SET COMPRESSION changes the catalog only: rows written from now on use
# lz4, existing ones stay as they are (both read alike). A server built without lz4 keeps pglz.

from django.db import migrations

FORWARD = """
DO $$
BEGIN
    SET LOCAL lock_timeout = '2s';  -- an ACCESS EXCLUSIVE lock, held for a catalog update
    ALTER TABLE rollouts_rollout ALTER COLUMN search_words SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this server has no lz4: search_words stays on pglz';
END $$;
"""
BACKWARD = "ALTER TABLE rollouts_rollout ALTER COLUMN search_words SET COMPRESSION pglz"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0012_per_step_sort_indexes"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]

# The trigram index covers only what the word index cannot serve (issue 30 items 1 and 6): the
# whitespace-separated tokens of a rollout's search text that hold a non-ASCII character, upper-cased
# (rd_search_nonascii, empty for an ASCII-only text). Every search term with a run of 3+ ASCII
# letters or digits is answered by the word index (migration 0010); the trigram index on the whole
# text cost ~2.2 KB a realistic rollout and was the write path's largest cost (COPY of realistic
# rollouts into copies of the tables, bench/ingest.py --realistic --index-choices: every index 191/s,
# the word index alone 334/s, no search index 408/s). The projection costs ~80 us a document of
# ASCII text (one length check) and ~0.4 ms one with non-ASCII tokens, against several ms for the
# trigrams of the whole text. Built and dropped CONCURRENTLY: ingestion goes on (docs/migrations.md).

from django.db import migrations

from webapp.migration_ops import create_index_concurrently, drop_index_concurrently

# IMMUTABLE (upper, octet_length, length and regexp_matches are), so an index may use it. The
# guard skips the regular expression for a text without any multi-byte character.
FUNCTION = r"""
CREATE OR REPLACE FUNCTION rd_search_nonascii(doc text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
SELECT CASE WHEN octet_length(doc) = length(doc) THEN ''
ELSE array_to_string(ARRAY(
    SELECT m[1] FROM regexp_matches(upper(doc), '(\S*[^\x01-\x7f]\S*)', 'g') AS m), ' ')
END
$fn$
"""
INDEX = (
    "rollout_search_nonascii",
    "ON rollouts_rollout USING gin (run_id, rd_search_nonascii(search_text) gin_trgm_ops)",
)
OLD_INDEX = (
    "rollout_search_run_trgm",
    "ON rollouts_rollout USING gin (run_id, UPPER(search_text) gin_trgm_ops)",
)


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)
        create_index_concurrently(schema_editor, *INDEX)
        drop_index_concurrently(schema_editor, OLD_INDEX[0])


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        create_index_concurrently(schema_editor, *OLD_INDEX)
        drop_index_concurrently(schema_editor, INDEX[0])
        schema_editor.execute("DROP FUNCTION IF EXISTS rd_search_nonascii(text)")


class Migration(migrations.Migration):
    atomic = False  # online: the index is built and the old one dropped CONCURRENTLY

    dependencies = [
        ("rollouts", "0013_search_words_lz4"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]

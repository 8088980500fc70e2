"""The word index (Postgres): search answers through each rollout's stored words and the run's
vocabulary must equal the plain text match (UPPER(search_text) LIKE, the definition of a search
hit) for every kind of term: inside words, across separators, phrases, exclusions, non-ASCII text,
characters whose upper case is ASCII (dotless i, long s) or longer (ß), words longer than the
stored windows, rows stored without words. Off Postgres the module still runs (both sides are
the scan) so the suite stays the same on SQLite.
"""

from __future__ import annotations

import random
import threading

import pytest
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext

from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.explorer.search import postgres
from webapp.rollouts import text
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout, SearchWord
from webapp.rollouts.services import create_run

LONG = "ab" * 60 + "MIDDLEmarker" + "cd" * 60  # one 244-character word: stored as windows
PIECES = [
    "KeyError",
    "key_error",
    "ValueError:",
    "src/x.py",
    "ıdent",  # dotless i: Postgres upper-cases it to I
    "ſtraße",  # long s and sharp s
    "ǰab",
    "École",
    "ecole",
    "日本語のテキスト",
    "emoji🙂text",
    "assert_called_once_with(3)",
    "2026-12-03T15:04:05",
    "0xDEADbeef",
    "tests pass",
    "===",
    LONG,
    "TRACEBACK (most recent call last)",
    "quokka",
]
TERMS = [
    "error",
    "keyerror",
    "rror",
    "KEY",
    "x.py",
    '"key error"',
    '"tests pass"',
    "ident",
    "IDENT",
    "stra",
    "strasse",
    "école",
    "cole",
    "日本語",
    "🙂text",
    "called_once",
    "assert_called_once_with(3)",
    "DEADBEEF",
    "15:04",
    "===",
    "MIDDLEmarker",
    LONG[100:140],  # 40 characters: longer than a stored window's step
    "abab",
    "quokka -error",
    "error -quokka",
    "nosuchwordanywhere",
    "TRACEBACK (most",
]


def _doc(rng: random.Random) -> str:
    return " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6)))


def _groups(rng: random.Random, steps: int, per_step: int = 2, g: int = 4) -> list[dict]:
    out = []
    for step in range(steps):
        for k in range(per_step):
            out.append(
                {
                    "step": step,
                    "key": f"p{k}",
                    "prompt": "task",
                    "rollouts": [
                        {
                            "index": i,
                            "transcript": [
                                {"role": "user", "content": "task"},
                                {"role": "assistant", "content": _doc(rng)},
                                {"role": "tool", "content": _doc(rng)},
                            ],
                            "rewards": {"correct": {"value": i % 2, "reason": _doc(rng)}},
                        }
                        for i in range(g)
                    ],
                }
            )
    return out


def _ids(run, q: str, **kw) -> list[int]:
    out, cursor = [], None
    while True:
        page = explore(run, ExplorerQuery(text=q, cursor=cursor, sort="correct", **kw))
        out += [r.rollout.id for r in page.rows]
        cursor = page.next_cursor
        if not cursor:
            return out


def _scanned(run, q: str) -> set[int]:
    """The definition: every included term a case-insensitive substring, no excluded one."""
    search = text.parse_query(q)
    qs = Rollout.objects.filter(run=run)
    for t in search.include:
        qs = qs.filter(search_text__icontains=t)
    for t in search.exclude:
        qs = qs.exclude(search_text__icontains=t)
    return set(qs.values_list("id", flat=True))


@pytest.fixture
def mixed(run, env3):
    rng = random.Random(15)
    ingest_groups(run, {"groups": _groups(rng, 8)})
    twin = create_run(name="twin", kind="grpo", environment=env3, config={}, status="running")
    ingest_groups(twin, {"groups": _groups(rng, 2)})
    return run, twin


@pytest.mark.parametrize("q", TERMS)
def test_word_index_answers_equal_the_text_match(mixed, q):
    run, twin = mixed
    want = _scanned(run, q)
    got = _ids(run, q, limit=7)
    assert len(got) == len(set(got)) and set(got) == want
    assert not set(got) & set(Rollout.objects.filter(run=twin).values_list("id", flat=True))


def test_a_one_word_search_rechecks_no_document(mixed):
    if connection.vendor != "postgresql":
        pytest.skip("the word index is Postgres's")
    run, _ = mixed
    assert _scanned(run, "keyerror")
    with CaptureQueriesContext(connection) as ctx:
        got = _ids(run, "keyerror", limit=500)
    assert set(got) == _scanned(run, "keyerror")
    searched = [q["sql"] for q in ctx.captured_queries if "search_words @@" in q["sql"]]
    assert searched and not any("LIKE" in sql for sql in searched)
    # The only text match left is over rows stored without words (none here: a partial index).
    rechecks = [
        q["sql"] for q in ctx.captured_queries if "UPPER(" in q["sql"] and "LIKE" in q["sql"]
    ]
    assert all('"search_words" IS NULL' in sql for sql in rechecks)


def test_ingestion_stores_words_prefixed_by_run_and_the_run_vocabulary(mixed):
    if connection.vendor != "postgresql":
        pytest.skip("the word index is Postgres's")
    run, twin = mixed
    r = Rollout.objects.filter(run=run, search_text__contains="KeyError").first()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tsvector_to_array(search_words) FROM rollouts_rollout WHERE id = %s", [r.id]
        )
        lexemes = cur.fetchone()[0]
    assert f"{run.id}xKEYERROR" in lexemes and all(w.startswith(f"{run.id}x") for w in lexemes)
    vocab = set(SearchWord.objects.filter(run=run).values_list("word", flat=True))
    assert {"KEYERROR", "KEY", "ERROR", "PY", "STRA", "IDENT"} <= vocab and "STRASSE" not in vocab
    assert not any(len(w) > text.WORD_CHARS for w in vocab)
    assert LONG.upper()[:64] in vocab  # the long word's first window
    assert SearchWord.objects.filter(run=twin).exists()


def test_rows_without_words_are_still_found(mixed):
    """Rows written another way than ingestion (or with too many words) carry no words: search
    finds them by their text."""
    run, _ = mixed
    hit = Rollout.objects.filter(run=run, search_text__icontains="quokka").first()
    Rollout.objects.filter(id=hit.id).update(search_words=None)
    assert hit.id in _ids(run, "quokka")
    assert set(_ids(run, "quokka")) == _scanned(run, "quokka")


def test_a_document_with_too_many_words_is_stored_without_them(run, monkeypatch):
    monkeypatch.setattr(text, "MAX_WORDS", 5)
    many = " ".join(f"w{i}x" for i in range(10)) + " zebrafinch"
    ingest_groups(
        run,
        {
            "groups": [
                {
                    "step": 0,
                    "key": "k",
                    "prompt": "p",
                    "rollouts": [
                        {"index": 0, "completion": many, "rewards": {"correct": 1.0}},
                        {"index": 1, "completion": "few words", "rewards": {"correct": 0.0}},
                    ],
                }
            ]
        },
    )
    stored = dict(Rollout.objects.filter(run=run).values_list("index", "search_words"))
    assert stored[0] is None
    if connection.vendor == "postgresql":
        assert stored[1]
    assert len(_ids(run, "zebrafinch")) == 1


@pytest.mark.postgres
def test_the_words_of_a_long_document_are_stored_under_lz4(run):
    """Migration 0013: the column compresses with lz4 (smaller than pglz here, and cheaper)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    many = " ".join(f"word{i}x{i * 7919 % 10007}" for i in range(600))  # a ~10 KB tsvector
    group = {"step": 0, "key": "k", "prompt": "p", "rollouts": []}
    group["rollouts"] = [{"index": 0, "completion": many, "rewards": {"correct": 1.0}}]
    ingest_groups(run, {"groups": [group]})
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_column_compression(search_words), pg_column_size(search_words), "
            "octet_length(search_words::text) FROM rollouts_rollout WHERE run_id = %s",
            [run.id],
        )
        method, stored, raw = cur.fetchone()
    assert method == "lz4" and stored < raw
    assert len(_ids(run, "word599x")) == 1


def test_a_word_no_stored_word_holds_reads_only_rows_stored_without_words(mixed):
    if connection.vendor != "postgresql":
        pytest.skip("the word index is Postgres's")
    run, _ = mixed
    with CaptureQueriesContext(connection) as ctx:
        assert _ids(run, "nosuchwordanywhere") == []
    read = [
        q["sql"]
        for q in ctx.captured_queries
        if "rollouts_rollout" in q["sql"] and "STRPOS" not in q["sql"]  # not the snippet's
    ]
    assert read and all('"search_words" IS NULL' in sql for sql in read)


def test_the_migration_backfill_writes_the_same_words(mixed):
    if connection.vendor != "postgresql":
        pytest.skip("the backfill runs on Postgres only")
    import importlib

    run, _ = mixed
    before = dict(Rollout.objects.filter(run=run).values_list("id", "search_words"))
    vocab = set(SearchWord.objects.filter(run=run).values_list("word", flat=True))
    Rollout.objects.update(search_words=None)
    SearchWord.objects.all().delete()
    migration = importlib.import_module("webapp.rollouts.migrations.0010_search_words")

    class Editor:
        connection = connection

    migration.backfill(None, Editor())
    after = dict(Rollout.objects.filter(run=run).values_list("id", "search_words"))
    assert after == before
    assert set(SearchWord.objects.filter(run=run).values_list("word", flat=True)) == vocab


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_adding_the_same_new_words_all_land(env3):
    """Four writers, each batch adding words the others add too, in different orders: no
    deadlock, nothing lost, the vocabulary has every word."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    run = create_run(name="conc", kind="grpo", environment=env3, config={}, status="running")
    words = [f"shared{i}word" for i in range(300)]
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            rng = random.Random(n)
            for b in range(3):
                mine = rng.sample(words, 200)
                group = {
                    "step": b,
                    "key": f"w{n}",
                    "prompt": "p",
                    "rollouts": [
                        {"index": i, "completion": " ".join(mine[i::4]), "rewards": {"correct": 1}}
                        for i in range(4)
                    ],
                }
                ingest_groups(run, {"groups": [group]})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert Rollout.objects.filter(run=run).count() == 4 * 3 * 4
    stored = set(SearchWord.objects.filter(run=run).values_list("word", flat=True))
    used = {
        w.upper()
        for d in Rollout.objects.filter(run=run).values_list("completion", flat=True)
        for w in d.split()
    }
    assert used <= stored
    for w in ("shared7word", "shared299word"):
        assert set(_ids(run, w)) == _scanned(run, w)


def test_term_runs_and_one_word_terms():
    assert text.term_runs("KeyError: 'x'") == ["KEYERROR"]
    assert text.term_runs("assert_called_once") == ["ASSERT", "CALLED", "ONCE"]  # term order
    assert text.term_runs("once_called_once") == ["ONCE", "CALLED"]
    assert text.term_runs("ıdent") == ["IDENT"]  # as Postgres upper-cases it
    assert sorted(text.term_runs("straße")) == ["STRA"]  # ß separates
    assert text.term_runs("x" * 50) == ["X" * 32]
    assert text.is_one_word("KeyError") and not text.is_one_word("key_error")
    assert not text.is_one_word("école") and not text.is_one_word("x" * 33)
    assert postgres.VOCAB_CAP > 0


@pytest.mark.parametrize("walk_hits", [0, 10**9])
def test_hits_are_paged_alike_by_lookup_and_by_a_walk_of_the_sort_index(
    mixed, monkeypatch, walk_hits
):
    """Past WALK_HITS x sqrt(run size) hits the page walks the sort index with the ids as a hashed
    filter; below it looks each hit up. Both give the same pages, both orders, every sort."""
    run, _ = mixed
    monkeypatch.setattr(postgres, "WALK_HITS", walk_hits)
    for q in ("error", "quokka", '"tests pass"', "keyerror -quokka"):
        want = _scanned(run, q)
        for sort, order in (("correct", "desc"), ("reward", "asc"), ("length", "desc")):
            got, cursor = [], None
            while True:
                page = explore(
                    run, ExplorerQuery(text=q, cursor=cursor, sort=sort, order=order, limit=5)
                )
                got += [r.rollout.id for r in page.rows]
                cursor = page.next_cursor
                if not cursor:
                    break
            assert len(got) == len(set(got)) and set(got) == want, (q, sort, order)

"""Search over whole rollouts and the stored previews that list pages read.

Runs on the configured database: SQLite by default, Postgres with DATABASE_URL=postgres://... (the
trigram index path); the plan test is Postgres-only. Transcripts are multi-turn agent rollouts in
the shape the recorder and the API send: system + task messages, assistant turns with OpenAI-style
tool calls (arguments as a JSON string), tool results, a final answer, reward reasons.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import create_run

SYSTEM = "You are a coding agent. Use the tools. sysmarkerword"
TASK = "Fix the failing test in parser.py. taskmarkerword"
FILLER = "line of build output that nobody reads\n" * 2_000  # ~80 KB: the marker sits deep inside


def agent_transcript(i: int, marks: dict[str, str] | None = None) -> list[dict]:
    m = marks or {}
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
        {
            "role": "assistant",
            "content": f"Let me look at the file first {m.get('assistant', '')}",
            "tool_calls": [
                {
                    "id": f"c{i}a",
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": json.dumps({"path": f"src/parser.py {m.get('args', '')}"}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": f"c{i}a",
            "name": "read_file",
            "content": FILLER[:40_000]
            + f"Traceback: KeyError 'x' {m.get('result', '')} "
            + FILLER[:40_000],
        },
        {
            "role": "assistant",
            "content": "Running the tests now.",
            "tool_calls": [
                {
                    "id": f"c{i}b",
                    "type": "function",
                    "function": {"name": "run_tests", "arguments": '{"k": "parser"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": f"c{i}b",
            "name": "run_tests",
            "content": "3 passed, 0 failed",
        },
        {
            "role": "assistant",
            "content": f"Fixed: the parser now handles empty input. {m.get('final', '')}",
        },
    ]


def group(step: int, key: str, marks_per_rollout: list[dict[str, str]]) -> dict:
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    rollouts = []
    for i, marks in enumerate(marks_per_rollout):
        reason = f"tests pass {marks.get('reason', '')}"
        rollouts.append(
            {
                "index": i,
                "transcript": agent_transcript(i, marks),
                "length": 100 + i,
                "rewards": {
                    "correct": {"value": i % 2, "reason": reason},
                    "format": 1.0,
                    "penalty": -0.1 * i,
                },
                "state": {"files_changed": i},
            }
        )
    return {"step": step, "key": key, "prompt": prompt, "rollouts": rollouts}


def ids(run, text: str, **kw) -> list[int]:
    out, cursor = [], None
    while True:
        page = explore(run, ExplorerQuery(text=text, cursor=cursor, **kw))
        out += [r.rollout.id for r in page.rows]
        cursor = page.next_cursor
        if not cursor:
            return out


PARTS = ["assistant", "args", "result", "final", "reason"]


@pytest.fixture
def searched(run, env3, personas):
    """`run` with one rollout per part holding a marker word there, plus a twin run
    holding every marker."""
    ingest_groups(
        run,
        {"groups": [group(0, "g0", [{p: f"{p}needle"} for p in PARTS]), group(1, "g1", [{}, {}])]},
    )
    other = create_run(name="other", kind="grpo", environment=env3, config={}, status="running")
    ingest_groups(other, {"groups": [group(0, "g0", [{p: f"{p}needle" for p in PARTS}] * 2)]})
    return run, other


@pytest.fixture
def accented(run, env3, personas):
    """`run` with 7 rollouts whose reward reasons say "επιτυχία" (no ASCII letter: only the trigram
    index over non-ASCII tokens can narrow it), one of them holding "βελόνα" in a tool result; a
    twin run with both in 2 rollouts."""
    marks = [{"reason": "επιτυχία", **({"result": "βελόνα"} if i == 0 else {})} for i in range(5)]
    ingest_groups(
        run, {"groups": [group(0, "g0", marks), group(1, "g1", [{"reason": "επιτυχία"}] * 2)]}
    )
    other = create_run(name="other", kind="grpo", environment=env3, config={}, status="running")
    both = {"reason": "επιτυχία", "result": "βελόνα"}
    ingest_groups(other, {"groups": [group(0, "g0", [both] * 2)]})
    return run, other


def test_it_finds_every_part_of_a_transcript_and_nothing_from_another_run(searched):
    run, other = searched
    mine = {r.index: r.id for r in Rollout.objects.filter(run=run, step=0)}
    for i, part in enumerate(PARTS):
        assert ids(run, f"{part}needle") == [mine[i]], part
    everything = set(Rollout.objects.filter(run=run).values_list("id", flat=True))
    assert set(ids(run, "sysmarkerword")) == everything  # the prompt: every rollout of every group
    assert set(ids(run, "TASKMARKERWORD")) == everything  # case-insensitive
    others = set(Rollout.objects.filter(run=other).values_list("id", flat=True))
    assert set(ids(other, "resultneedle")) == others and not others & set(ids(run, "needle"))


def test_it_matches_phrases_across_line_breaks_exclusions_and_literal_wildcards(searched):
    run, _ = searched
    step0 = set(Rollout.objects.filter(run=run, step=0).values_list("id", flat=True))
    assert set(ids(run, '"nobody reads line of build"')) == set(
        Rollout.objects.filter(run=run).values_list("id", flat=True)
    )  # the phrase spans a newline of the tool result
    assert set(ids(run, "needle -resultneedle")) == step0 - set(ids(run, "resultneedle"))
    assert ids(run, "needle%") == [] and ids(run, "need_e") == []  # % and _ are plain characters
    assert ids(run, "'x'") != []  # quotes inside a word are plain characters too


def test_it_combines_search_with_sorts_filters_and_keyset_paging(run):
    ingest_groups(
        run,
        {
            "groups": [
                group(
                    s,
                    f"g{k}",
                    [{"result": "pagedword" if (s + k + i) % 3 else ""} for i in range(4)],
                )
                for s in range(3)
                for k in range(3)
            ]
        },
    )
    wanted = set(
        Rollout.objects.filter(run=run, search_text__icontains="pagedword").values_list(
            "id", flat=True
        )
    )
    assert 10 < len(wanted) < 36
    for sort in ("correct", "penalty", "reward", "length"):
        for order in ("asc", "desc"):
            full = [i for i in ids(run, "", sort=sort, order=order) if i in wanted]
            assert ids(run, "pagedword", sort=sort, order=order, limit=5) == full, (sort, order)
    stepped = ids(run, "pagedword", step_min=1, step_max=1, limit=3)
    assert stepped and set(stepped) == set(
        Rollout.objects.filter(id__in=wanted, step=1).values_list("id", flat=True)
    )


HOSTILE = [
    '"',
    '""',
    "'",
    "a' OR '1'='1",
    "foo & bar | !baz",
    "needle:*",
    "<-> <2>",
    "%%%",
    "___",
    "\\",
    "\\%",
    "ünïcödé 漢字 🚀🚀🚀",
    "-",
    "--",
    "- -x",
    "x" * 10_000,
    "needle " * 200,
    "needle\x00",
    "((((needle",
    "needle)))",
    "$1 %s %(x)s {0}",
    "abc\r\ndef\tghi",
    "a b c d e f g h i j k l m n o",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_it_answers_any_query_with_results_or_a_clear_400(client_as, searched, query):
    run, _ = searched
    resp = client_as("viewer").get(reverse("rollouts-explorer", args=[run.id]), {"q": query})
    assert resp.status_code in (200, 400)
    if resp.status_code == 400:
        assert 'data-field="q"' in resp.content.decode()
    api = client_as("viewer").get(f"/api/v1/runs/{run.id}/rollouts/", {"q": query})
    assert api.status_code == resp.status_code
    if api.status_code == 400:
        assert api.json()["errors"][0]["field"] == "q"


def test_it_answers_undecodable_query_bytes(client_as, searched):
    run, _ = searched
    for raw in ("%ED%A0%80abc", "%FF%FEneedle", "%00needle"):  # a lone surrogate, not UTF-8, NUL
        resp = client_as("viewer").get(reverse("rollouts-explorer", args=[run.id]) + "?q=" + raw)
        assert resp.status_code in (200, 400), raw


def test_it_refuses_a_query_no_index_can_serve(run):
    for query in ("ab", "-needle", "x" * 1001):
        with pytest.raises(FieldError) as e:
            ExplorerQuery.from_params({"q": query}, [])
        assert e.value.field == "q"


def test_it_highlights_the_match_escaped(client_as, run):
    hostile = (
        "<script>window.__pwned=1</script><img src=x onerror=alert(1)> hostileneedle </mark><b>"
    )
    ingest_groups(run, {"groups": [group(0, "g", [{"result": hostile}])]})
    body = (
        client_as("viewer")
        .get(reverse("rollouts-explorer", args=[run.id]), {"q": "HostileNeedle"})
        .content.decode()
    )
    snippet = body[body.index('class="snippet') :].split("</div>")[0]
    assert "<mark>hostileneedle</mark>" in snippet
    assert (
        "&lt;/mark&gt;&lt;b&gt;" in snippet and "<script>" not in body and "<img src=x" not in body
    )


def test_it_stores_a_preview_at_ingest(run):
    ingest_groups(
        run,
        {
            "groups": [
                group(0, "g", [{"final": "the very end"}]),
                {
                    "step": 0,
                    "key": "short",
                    "prompt": "p",
                    "rollouts": [{"index": 0, "completion": "one line", "rewards": {}}],
                },
            ]
        },
    )
    long = Rollout.objects.get(run=run, group__key="g")
    assert long.preview_head.startswith("Let me look at the file first read_file(")
    assert long.preview_tail.endswith("the very end") and len(long.preview_tail) == 300
    assert (long.n_turns, long.n_tool_calls) == (3, 2) and long.text_chars > 80_000
    assert (
        "\n" not in long.preview_head and SYSTEM not in long.preview_head
    )  # agent text only, one line
    short = Rollout.objects.get(run=run, group__key="short")
    assert (short.preview_head, short.preview_tail, short.n_turns, short.n_tool_calls) == (
        "one line",
        "",
        1,
        0,
    )


def test_it_never_reads_transcripts_or_state_on_list_pages(client_as, searched):
    run, _ = searched
    r = Rollout.objects.filter(run=run).first()
    c = client_as("viewer")
    urls = [
        reverse("rollouts-explorer", args=[run.id]),
        reverse("rollouts-explorer", args=[run.id]) + "?q=needle",
        reverse("rollouts-explorer", args=[run.id]) + "?sort=correct",
        reverse("rollouts-group", args=[r.group_id]),
        reverse("rollouts-no-signal", args=[run.id]),
        f"/api/v1/runs/{run.id}/rollouts/?q=needle",
    ]
    for url in urls:
        with CaptureQueriesContext(connection) as ctx:
            assert c.get(url).status_code == 200, url
        sql = "\n".join(q["sql"] for q in ctx.captured_queries)
        assert (
            '"rollouts_rollout"."transcript"' not in sql and '"rollouts_rollout"."state"' not in sql
        ), url
        assert '"rollouts_rollout"."search_text" FROM' not in sql, (
            url
        )  # only a snippet of it, cut in SQL


def test_it_never_reads_transcripts_on_the_review_queue_page(client_as, searched, personas):
    from webapp.annotations.services import create_queue

    run, _ = searched
    queue = create_queue(
        name="q",
        run=run,
        source="explorer",
        params={"sort": "reward"},
        limit=5,
        seed=None,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[personas["annotator"]],
    )
    with CaptureQueriesContext(connection) as ctx:
        assert (
            client_as("trainer").get(reverse("annotations-queue", args=[queue.id])).status_code
            == 200
        )
    sql = "\n".join(q["sql"] for q in ctx.captured_queries)
    assert "rollouts_rollout" in sql and '"rollouts_rollout"."transcript"' not in sql
    assert '"rollouts_rollout"."state"' not in sql and '"rollouts_rollout"."search_text"' not in sql


def test_it_folds_long_tool_results_on_the_transcript_page(client_as, run):
    ingest_groups(run, {"groups": [group(0, "g", [{"result": "<b>deepmarker</b>"}])]})
    r = Rollout.objects.get(run=run)
    body = client_as("viewer").get(reverse("rollouts-transcript", args=[r.id])).content.decode()
    assert (
        body.count('<details class="fold">') == 1
    )  # the 80 KB tool result; short messages stay open
    fold = body[body.index('<details class="fold">') :].split("</details>")[0]
    assert "&lt;b&gt;deepmarker&lt;/b&gt;" in fold and "<b>deepmarker" not in body


def test_it_backfills_previews_and_search_text_of_existing_rows(run):
    import importlib

    from django.apps import apps

    ingest_groups(run, {"groups": [group(0, "g", [{"args": "backfillword"}, {}])]})
    expected = list(
        Rollout.objects.filter(run=run)
        .order_by("id")
        .values(
            "preview_head", "preview_tail", "n_turns", "n_tool_calls", "text_chars", "search_text"
        )
    )
    Rollout.objects.filter(run=run).update(
        preview_head="", preview_tail="", n_turns=0, n_tool_calls=0, text_chars=0, search_text=""
    )
    migration = importlib.import_module("webapp.rollouts.migrations.0007_rollout_preview_search")
    from types import SimpleNamespace

    from django.db import connection

    migration.backfill(apps, SimpleNamespace(connection=connection))  # it reads the alias only
    assert (
        list(
            Rollout.objects.filter(run=run)
            .order_by("id")
            .values(
                "preview_head",
                "preview_tail",
                "n_turns",
                "n_tool_calls",
                "text_chars",
                "search_text",
            )
        )
        == expected
    )


@pytest.mark.postgres
def test_it_probes_a_search_through_the_run_scoped_trigram_index(accented):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.explorer.search import backend
    from webapp.explorer.search.base import run_size
    from webapp.rollouts.text import parse_query

    run, _ = accented
    with connection.cursor() as cur:
        # On a table this small the planner rightly prefers any run_id btree and a filter; at scale
        # the rows are long and it does not. Without them (rolled back with the test) the plan shows
        # whether the trigram index can serve the run condition too.
        cur.execute(
            "DROP INDEX rollout_run_step, rollout_run_reward, rollout_run_adv, rollout_run_length, "
            "rollout_run_step_reward, rollout_run_step_adv, rollout_run_step_length"
        )
    with CaptureQueriesContext(connection) as ctx:
        assert len(backend().probe(run, parse_query("βελόνα"), 50, run_size(run))[0]) == 1
    sql = next(
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith("SELECT") and "rd_search_nonascii" in q["sql"]
    )
    with connection.cursor() as cur:  # the probe's own planner settings, then its query's plan
        cur.execute("SET enable_seqscan = off; SET enable_indexscan = off")
        cur.execute("EXPLAIN " + sql)
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("RESET enable_seqscan; RESET enable_indexscan")
    # Both conditions inside the index: another run's rows are never rechecked.
    assert "rollout_search_nonascii" in plan and "Index Cond: ((run_id = '" in plan, plan
    assert "rd_search_nonascii(search_text) ~~ '%ΒΕΛΌΝΑ%'" in plan, plan


@pytest.mark.postgres
def test_it_fetches_hits_or_walks_the_sort_order_by_the_index_candidate_count(
    accented, monkeypatch
):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.explorer.search import backend, base
    from webapp.rollouts.text import parse_query

    run, _ = accented
    with connection.cursor() as cur:  # as above: at this size the planner would read a run_id btree
        cur.execute(
            "DROP INDEX rollout_run_step, rollout_run_reward, rollout_run_adv, rollout_run_length, "
            "rollout_run_step_reward, rollout_run_step_adv, rollout_run_step_length"
        )
    # In every reward reason: 7 rollouts in `run`, 2 in the other run.
    every = parse_query('"pass επιτυχία"')
    search = backend()
    assert search.candidates(run, parse_query("βελόνα")) == 1
    assert search.candidates(run, every) == 7
    assert base.run_size(run) == 7
    monkeypatch.setattr(base, "SEARCH_PROBE", 1)
    fetched, _ = search.probe(run, every, 50, 7)  # 7 <= sqrt(51 x 7): fetch them all
    assert len(fetched) == 7
    assert search.probe(run, every, 1, 7) == (None, 7)  # 7 > sqrt(2 x 7): walk 7 rows at most
    walked = ids(run, '"pass επιτυχία"', limit=1)
    assert len(walked) == len(set(walked)) == 7


@pytest.mark.postgres
def test_it_fetches_after_all_when_the_walk_has_checked_as_many_rows_as_there_are_candidates(
    accented, monkeypatch
):
    """A word with few hits among many index candidates: the walk is bounded, then
    the hits fetched."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.explorer.search import base
    from webapp.explorer.search.postgres import PostgresSearch

    run, _ = accented
    with connection.cursor() as cur:  # as above: at this size the planner would read a run_id btree
        cur.execute(
            "DROP INDEX rollout_run_step, rollout_run_reward, rollout_run_adv, rollout_run_length, "
            "rollout_run_step_reward, rollout_run_step_adv, rollout_run_step_length"
        )
    pg = PostgresSearch
    monkeypatch.setattr(pg, "word_plan", lambda self, run, search: None)  # the trigram plans
    monkeypatch.setattr(base, "SEARCH_PROBE", 0)
    monkeypatch.setattr(base, "WALK_FIRST", 1)  # rounds of 1, 2, 4... rows
    monkeypatch.setattr(pg, "plan_size", lambda self, run: 0)  # cap 0: 1 candidate is "too many"
    fetches = []
    real_fetch = pg.fetch_hits
    monkeypatch.setattr(
        pg, "fetch_hits", lambda *a, **kw: fetches.append(a) or real_fetch(*a, **kw)
    )
    expected = list(Rollout.objects.filter(run=run, search_text__icontains="βελόνα"))
    assert [r.id for r in expected] == ids(run, "βελόνα", limit=1) and len(expected) == 1
    assert fetches  # the walk stopped after 1 row checked (the candidate count): hits fetched


@pytest.mark.postgres
def test_the_trigram_index_holds_only_the_tokens_with_a_non_ascii_character(accented):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    run, _ = accented
    with connection.cursor() as cur:
        cur.execute(
            "SELECT search_text, rd_search_nonascii(search_text) FROM rollouts_rollout "
            "WHERE run_id = %s",
            [run.id],
        )
        rows = cur.fetchall()
        cur.execute("SELECT rd_search_nonascii(%s), rd_search_nonascii(%s)", ["ascii only", ""])
        assert cur.fetchone() == ("", "")
    assert len(rows) == 7
    for doc, projected in rows:
        assert projected.split() == [t for t in doc.upper().split() if not t.isascii()]
        assert "ΕΠΙΤΥΧΊΑ" in projected.split()
    assert sum("ΒΕΛΌΝΑ" in projected for _, projected in rows) == 1


@pytest.mark.postgres
def test_a_search_no_index_narrows_walks_the_sort_order_and_finds_every_hit(searched, monkeypatch):
    """An ASCII term the word index cannot serve (forced here) has no trigram condition: the probe
    reads no rows and the sort order is walked, finding every hit."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.explorer.search import backend
    from webapp.explorer.search.postgres import PostgresSearch
    from webapp.rollouts.text import parse_query

    run, _ = searched
    monkeypatch.setattr(PostgresSearch, "word_plan", lambda self, run, search: None)
    assert backend().candidates(run, parse_query("needle")) is None
    assert backend().probe(run, parse_query("needle"), 2, 7) == (None, None)
    found = Rollout.objects.filter(run=run, search_text__icontains="needle")
    expected = set(found.values_list("id", flat=True))
    assert len(expected) == len(PARTS)
    assert set(ids(run, "needle", limit=2)) == expected


@pytest.mark.postgres
def test_a_search_whose_every_run_is_common_is_narrowed_by_the_rarest(searched, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.explorer.search import backend, postgres
    from webapp.rollouts.text import parse_query

    run, _ = searched
    monkeypatch.setattr(postgres, "VOCAB_CAP", 0)  # every run is "in too many words"
    phrase = '"resultneedle line"'  # RESULTNEEDLE is in 1 word of the run, LINE in 1 or more
    plan = backend().word_plan(run, parse_query(phrase))
    assert plan is not None and not plan.exact and plan.tsquery.count("(") == 1  # one run narrows
    assert "RESULTNEEDLE" in plan.tsquery  # the rarer
    found = Rollout.objects.filter(run=run, search_text__icontains="resultneedle line")
    expected = list(found.values_list("id", flat=True))
    assert len(expected) == 1 and ids(run, phrase) == expected
    monkeypatch.setattr(postgres, "VOCAB_FALLBACK", 0)  # and none narrows: walked
    assert backend().word_plan(run, parse_query(phrase)) is None
    assert ids(run, phrase) == expected


def test_a_behaviour_counts_every_rollout_a_non_ascii_search_holds(accented):
    """matching_rollouts (what a behaviour counts per step) answers a term only the trigram index
    over non-ASCII tokens narrows, with exclusions, the same as a scan of the text."""
    from webapp.explorer.query import matching_rollouts

    run, _ = accented
    comps = run.components()

    def matched(text: str) -> set[int]:
        parts = matching_rollouts(run, ExplorerQuery(text=text), comps)
        return {i for part in parts for i in part.values_list("id", flat=True)}

    mine = Rollout.objects.filter(run=run)
    needle = set(mine.filter(search_text__icontains="βελόνα").values_list("id", flat=True))
    every = set(mine.values_list("id", flat=True))
    assert len(needle) == 1 and len(every) == 7
    assert matched("βελόνα") == needle == set(ids(run, "βελόνα"))
    if connection.vendor == "postgresql":  # SQLite's LIKE folds the case of ASCII letters only
        assert matched("ΒΕΛΌΝΑ") == needle  # case-insensitive, as UPPER sees it
    assert matched("επιτυχία -βελόνα") == every - needle == set(ids(run, "επιτυχία -βελόνα"))
    assert matched('"pass επιτυχία"') == every
    assert matched("βελόναX") == set()

"""Realistic transcripts at scale: a run of multi-turn agent rollouts against a run of one-line
rollouts of the same size, in the same Postgres, both seeded through the one ingestion service;
every page is timed on both in the same process and reported as a ratio (realistic / one-line).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench .venv/bin/python bench/realistic.py
    ... python -m bench.realistic --rollouts 50000 --repeat 7

Seeded runs are reused by name. The rollouts' shape: docs/performance.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.harness import (  # noqa: E402
    ROLLOUT_TABLES,
    bench_run,
    components,
    load_line,
    production_like_env,
    progress,
    ratio,
    report,
    setup_django,
    timed,
    vacuum_analyze,
)
from training.records import GroupRecord, RolloutRecord, Score  # noqa: E402

G = 8
STEPS = 250
BATCH_ROLLOUTS = 800  # realistic batches are smaller than one-line ones: ~7 MB of JSON each
# The standard components under an agent environment's names: the seeded million-rollout runs
# (reused by name) and the pages timed on them carry these names.
COMPONENTS = components(
    correct={"name": "tests_pass"}, coverage={"name": "tool_use", "weight": 0.3}
)
# word -> planted rate per rollout, and where it is planted (every part of a rollout is searched).
RARE_WORDS = {
    "quokkaflux": (1e-3, "tool_result"),
    "zephyrine": (1e-3, "tool_args"),
    "marmotide": (1e-3, "reason"),
    "xylobranch": (1e-4, "tool_result"),
    # No ASCII letter: only the trigram index over non-ASCII tokens (migration 0014) narrows it.
    "βελονάκι": (1e-3, "tool_result"),  # not in tool arguments: json.dumps escapes it there
}
NON_ASCII_WORD = "βελονάκι"
COMMON_WORD = "assert"  # in most tool results: the "common word" search
# Words of the generated vocabulary (Vocabulary(default_rng(7))) in a middling share of
# rollouts, about 0.4%, 1.4% and 10% (time_pages prints the share it measures on a sample).
# Their trigrams are common (the vocabulary is built from 20 syllables), so the index offers
# about half the run as candidates.
MIDDLE_WORDS = ("besadevi", "rasakavi", "dedekato")
MEDIAN_BYTES, SIGMA, MAX_BYTES = 5_000, 1.1, 400_000  # of generated text; JSON adds ~3 KB
TOOLS = ("bash", "read_file", "write_file", "run_tests", "search_code")


class Vocabulary:
    """Zipf-distributed synthetic words plus code-ish lines: text with a realistic word-frequency
    tail (a few very common words, many rare ones). Two corpora are generated once; a piece of text
    is a slice at a random offset, so seeding a million rollouts is not bound by text generation."""

    CORPUS_CHARS = 4_000_000

    def __init__(self, rng: np.random.Generator, size: int = 30_000) -> None:
        syll = np.array(
            [
                "ka",
                "lo",
                "mi",
                "te",
                "ra",
                "su",
                "no",
                "vi",
                "de",
                "pa",
                "ri",
                "to",
                "ze",
                "fu",
                "ga",
                "be",
                "lu",
                "mo",
                "chi",
                "sa",
            ]
        )
        lens = rng.integers(1, 5, size)
        parts = rng.integers(0, len(syll), (size, 4))
        common = [
            "the",
            "a",
            "to",
            "of",
            "and",
            "in",
            "is",
            "it",
            "for",
            "that",
            "on",
            "with",
            "this",
            "be",
            "as",
            "error",
            "file",
            "test",
            "line",
            "value",
            "return",
            "def",
            "self",
            "import",
            "none",
            "true",
            "false",
            "result",
            "data",
            "raise",
            "function",
            "call",
            "output",
            "input",
            "config",
            "path",
            "index",
            "name",
        ]
        self.words = np.array(
            common + ["".join(syll[parts[i, : lens[i]]]) for i in range(size)], dtype=object
        )
        self.rng = rng
        ids = np.minimum(rng.zipf(1.3, self.CORPUS_CHARS // 6) - 1, len(self.words) - 1)
        self.prose = " ".join(self.words[ids].tolist())
        self.source = "\n".join(self._code_line(rng) for _ in range(self.CORPUS_CHARS // 40))

    def _code_line(self, rng: np.random.Generator) -> str:
        a, b, c = self.words[rng.integers(40, 3000, 3)].tolist()
        kind = int(rng.integers(0, 4))
        if kind == 0:
            return f"    {a}_{b} = {c}({a}, {int(rng.integers(0, 999))})"
        if kind == 1:
            return f"def {a}_{b}(self, {c}):"
        if kind == 2:
            return f"    assert {a}.{b} == {c!r}"
        return f'  File "/app/{a}/{b}.py", line {int(rng.integers(1, 900))}, in {c}'

    def _slice(self, corpus: str, n_chars: int) -> str:
        n = min(n_chars, len(corpus) - 1)
        start = int(self.rng.integers(0, len(corpus) - n))
        return corpus[start : start + n]

    def text(self, n_chars: int) -> str:
        return self._slice(self.prose, n_chars)

    def code(self, n_chars: int) -> str:
        return self._slice(self.source, n_chars)


def _plant(rng: np.random.Generator) -> dict[str, str]:
    """Where each rare word goes in this rollout (at its rate)."""
    return {place: word for word, (rate, place) in RARE_WORDS.items() if rng.random() < rate}


def realistic_rollout(
    vocab: Vocabulary, rng: np.random.Generator, index: int, prompt: list[dict]
) -> dict:
    target = int(min(MAX_BYTES, rng.lognormal(np.log(MEDIAN_BYTES), SIGMA)))
    turns = int(np.clip(rng.geometric(1 / 7) + 1, 2, 40))
    planted = _plant(rng)
    budget = max(200, target - 1500)
    shares = rng.dirichlet(np.full(turns, 0.6)) * budget  # uneven: one huge tool result is common
    messages = list(prompt)
    for t in range(turns):
        tool = TOOLS[int(rng.integers(0, len(TOOLS)))]
        args = {"path": f"src/{vocab.text(12).replace(' ', '_')}.py", "query": vocab.text(40)}
        if planted.get("tool_args") and t == turns // 2:
            args["query"] += f" {planted['tool_args']}"
        call_id = f"call_{index}_{t}"
        messages.append(
            {
                "role": "assistant",
                "content": vocab.text(int(rng.integers(60, 400))),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        size = int(shares[t])
        result = vocab.code(size // 2) + "\n" + vocab.text(size - size // 2)
        if t == 0:
            result += f"\n{COMMON_WORD} ok"
        if planted.get("tool_result") and t == turns - 1:
            result = (
                result[: len(result) // 2]
                + f" {planted['tool_result']} "
                + result[len(result) // 2 :]
            )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": tool, "content": result})
    messages.append(
        {"role": "assistant", "content": "Done. " + vocab.text(int(rng.integers(100, 500)))}
    )
    values = rng.random(4).round(3)
    reason = "tests " + vocab.text(40) + (f" {planted['reason']}" if planted.get("reason") else "")
    return RolloutRecord(
        index=index,
        transcript=messages,
        length=target // 4,
        rewards={
            "tests_pass": Score(float(values[0] > 0.4), reason),
            "format": float(values[1] > 0.1),
            "tool_use": float(values[2]),
            "length_penalty": -float(values[3] < 0.2) * float(values[3]),
        },
        state={
            "files_changed": int(rng.integers(0, 6)),
            "tests_run": int(rng.integers(0, 40)),
            "exit_code": int(rng.integers(0, 2)),
        },
    )


def oneline_rollout(vocab: Vocabulary, rng: np.random.Generator, index: int) -> dict:
    values = rng.random(4).round(3)
    return RolloutRecord(
        index=index,
        completion=vocab.text(80),
        length=int(rng.integers(5, 60)),
        rewards={
            "tests_pass": float(values[0] > 0.4),
            "format": float(values[1] > 0.1),
            "tool_use": float(values[2]),
            "length_penalty": -float(values[3] < 0.2) * float(values[3]),
        },
    )


def make_step(
    kind: str, step: int, groups: int, vocab: Vocabulary, rng: np.random.Generator
) -> list[dict]:
    out = []
    for g in range(groups):
        task = (
            f"Task {g} at step {step}: fix the failing test in module {vocab.text(30)}. "
            + vocab.text(300)
        )
        prompt = [
            {"role": "system", "content": "You are a coding agent. " + vocab.text(500)},
            {"role": "user", "content": task},
        ]
        if kind == "realistic":
            rollouts = [realistic_rollout(vocab, rng, i, prompt) for i in range(G)]
        else:
            rollouts = [oneline_rollout(vocab, rng, i) for i in range(G)]
        group = GroupRecord(
            step=step,
            key=f"t{g:05d}",
            prompt=prompt if kind == "realistic" else task,
            split="holdout" if g % 10 == 0 else "train",
            rollouts=rollouts,
        )
        out.append(group.to_json())
    return out


def _run_for(kind: str, n_rollouts: int) -> Any:
    return bench_run(
        f"bench-{kind}-{n_rollouts}",
        "bench-realistic",
        COMPONENTS,
        config={"num_generations": G},
        base_model="bench/tiny",
    )


def _seed_steps(kind: str, run_id: int, steps: list[int], groups_per_step: int, bar: Any) -> float:
    """Ingest `steps` of the run through the service; seconds spent inside it. Each step's text
    comes from its own generator (seeded by the step), whichever process seeds it."""
    from webapp.rollouts.ingest import ingest_groups
    from webapp.runs.models import Run

    run = Run.objects.get(id=run_id)
    vocab = Vocabulary(np.random.default_rng(7))
    per_batch = max(1, BATCH_ROLLOUTS // (groups_per_step * G))
    ingest_s = 0.0
    for i in range(0, len(steps), per_batch):
        groups = []
        for s in steps[i : i + per_batch]:
            rng = np.random.default_rng(s + (0 if kind == "realistic" else 10_000))
            groups += make_step(kind, s, groups_per_step, vocab, rng)
        for j in range(0, len(groups), max(1, BATCH_ROLLOUTS // G)):
            t0 = time.perf_counter()
            ingest_groups(run, {"groups": groups[j : j + max(1, BATCH_ROLLOUTS // G)]})
            ingest_s += time.perf_counter() - t0
        if bar is not None:
            bar.update(len(groups) * G)
    return ingest_s


def _seeder(kind: str, run_id: int, steps: list[int], groups_per_step: int) -> float:
    """A seeding process (--seeders N): its own Django and database connection."""
    import django

    production_like_env()
    django.setup()
    return _seed_steps(kind, run_id, steps, groups_per_step, None)


def seed(kind: str, n_rollouts: int, seeders: int = 1) -> tuple[Any, float | None]:
    """The run of `kind` with n rollouts (reused when already seeded; an interrupted seed resumes at
    the missing steps); (run, ingest rollouts/s or None). seeders > 1: the missing steps are split
    over that many processes (seeding is Postgres-bound in one backend: a million realistic
    rollouts took ~1 hour with two on this 2-core machine); rollouts/s is then the wall rate."""
    from webapp.rollouts.models import Group

    groups_per_step = max(1, n_rollouts // (G * STEPS))
    run = _run_for(kind, n_rollouts)
    done = set(Group.objects.filter(run=run).values_list("step", flat=True).distinct())
    todo = [s for s in range(STEPS) if s not in done]
    if not todo:
        print(f"reusing seeded run {run.id} ({run.name})")
        return run, None
    n = len(todo) * groups_per_step * G
    t0 = time.perf_counter()
    if seeders <= 1:
        with progress(n, f"seeding {kind}") as bar:
            ingest_s = _seed_steps(kind, run.id, todo, groups_per_step, bar)
    else:
        _seed_in_processes(kind, run, todo, groups_per_step, seeders, n)
        ingest_s = time.perf_counter() - t0
    report(
        f"seeded {n:,} {kind} rollouts, ingest {n / ingest_s:,.0f} rollouts/s (generation not "
        f"counted{'' if seeders <= 1 else f'; wall rate of {seeders} processes'})"
    )
    return run, n / ingest_s


def _seed_in_processes(
    kind: str, run: Any, todo: list[int], groups_per_step: int, seeders: int, n: int
) -> None:
    """Split `todo` round-robin over `seeders` processes; progress from the parent, by counting."""
    import multiprocessing as mp

    from django.db import connection

    from webapp.rollouts.models import Group

    connection.close()  # the children open their own
    parts = [todo[k::seeders] for k in range(seeders)]
    ctx = mp.get_context("spawn")
    with ctx.Pool(seeders) as pool, progress(n, f"seeding {kind} ({seeders} processes)") as bar:
        result = pool.starmap_async(
            _seeder, [(kind, run.id, part, groups_per_step) for part in parts]
        )
        shown = 0
        while not result.ready():
            result.wait(5)
            stored = Group.objects.filter(run=run, step__in=todo).count() * G
            bar.update(stored - shown)
            shown = stored
        result.get()  # a child's error, raised here
        bar.update(n - shown)


def vacuum() -> None:
    vacuum_analyze((*ROLLOUT_TABLES, "rollouts_searchword"))


def index_sizes() -> None:
    """The search indexes' sizes and each run's vocabulary (the word index's words)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid)) FROM pg_class c WHERE "
            "c.relname IN ('rollout_search_nonascii', 'rollout_search_words', "
            "'searchword_run_trgm', 'rollouts_searchword') ORDER BY 1"
        )
        print("search storage: " + ", ".join(f"{n} {size}" for n, size in cur.fetchall()))
        cur.execute(
            "SELECT r.name, count(*) FROM rollouts_searchword w JOIN runs_run r ON r.id = w.run_id "
            "WHERE r.name LIKE 'bench-%%' GROUP BY r.name ORDER BY 1"
        )
        print("vocabulary: " + ", ".join(f"{n} {c:,} words" for n, c in cur.fetchall()))


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    return timed(fn, repeat, warmup=2).ms


def page_urls(run: Any) -> list[tuple[str, str, int | None]]:
    """(label, url, target ms) for one run: the issue's pages, on its biggest rollout
    for the transcript."""
    from webapp.rollouts.models import Rollout

    big = (
        Rollout.objects.filter(run=run).order_by("-text_chars", "id").only("id", "group_id").first()
    )
    mid = (
        Rollout.objects.filter(run=run)
        .order_by("id")
        .only("id", "group_id")[Rollout.objects.filter(run=run).count() // 2]
    )
    ex = f"/runs/{run.id}/rollouts/"
    rare = next(iter(RARE_WORDS))
    return [
        ("explorer p1, sort by component", f"{ex}?sort=tool_use&order=desc", 100),
        ("explorer p1, sort by reward", f"{ex}?sort=reward&order=desc", 100),
        (f"explorer search rare word ({rare})", f"{ex}?sort=tool_use&order=desc&q={rare}", 300),
        (  # inside a word: the vocabulary finds the words that contain it
            f"explorer search part of a word ({rare[2:7]})",
            f"{ex}?sort=tool_use&order=desc&q={rare[2:7]}",
            300,
        ),
        (  # an exclusion: candidates from the word index, rechecked against their text
            f"explorer search {rare} -{COMMON_WORD}",
            f"{ex}?sort=tool_use&order=desc&q={rare}+-{COMMON_WORD}",
            300,
        ),
        (
            f"explorer search common word ({COMMON_WORD})",
            f"{ex}?sort=tool_use&order=desc&q={COMMON_WORD}",
            300,
        ),
        *(
            (f"explorer search middling word ({w})", f"{ex}?sort=tool_use&order=desc&q={w}", 300)
            for w in MIDDLE_WORDS
        ),
        (
            f"explorer search non-ASCII word ({NON_ASCII_WORD})",
            f"{ex}?sort=tool_use&order=desc&q={quote(NON_ASCII_WORD)}",
            300,
        ),
        ("group view (8 rollouts)", f"/groups/{mid.group_id}/", 150),
        ("no-signal groups", f"/runs/{run.id}/no-signal/", None),
        ("transcript page (median rollout)", f"/rollouts/{mid.id}/", 150),
        ("transcript page (largest rollout)", f"/rollouts/{big.id}/", 150),
    ]


def time_pages(runs: dict[str, Any], repeat: int) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webapp.accounts.roles import set_role
    from webapp.rollouts.models import Rollout

    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)

    def get(url: str) -> Callable[[], None]:
        def call() -> None:
            resp = client.get(url)
            assert resp.status_code == 200, (url, resp.status_code)

        return call

    urls = {kind: page_urls(run) for kind, run in runs.items()}
    big = (
        Rollout.objects.filter(run=runs["realistic"])
        .order_by("-text_chars")
        .values_list("text_chars", flat=True)[0]
    )
    print(
        f"\nmedian of {repeat} requests, test client, DEBUG={os.environ['DEBUG']}; "
        f"largest realistic rollout: {big / 1000:,.0f} K characters of text"
    )
    print(f"{'page':44} {'one-line ms':>12} {'realistic ms':>13} {'ratio':>7}  target (realistic)")
    for (label, one_url, target), (_, real_url, _) in zip(
        urls["oneline"], urls["realistic"], strict=True
    ):
        one, real = median_ms(get(one_url), repeat), median_ms(get(real_url), repeat)
        verdict = (
            "" if target is None else f"< {target} ms " + ("ok" if real < target else "MISSED")
        )
        report(f"{label:44} {one:12.1f} {real:13.1f} {ratio(real, one):>7}  {verdict:15}")


def word_shares(run: Any, sample: int = 2000) -> None:
    """The share of the run's rollouts holding each middling word, on an evenly spread sample."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM rollouts_rollout WHERE run_id = %s AND id %% "
            "GREATEST(1, (SELECT count(*) FROM rollouts_rollout WHERE run_id = %s) / %s) = 0",
            [run.id, run.id, sample],
        )
        n = cur.fetchone()[0]
        for word in MIDDLE_WORDS:
            cur.execute(
                "SELECT count(*) FROM rollouts_rollout WHERE run_id = %s AND id %% "
                "GREATEST(1, (SELECT count(*) FROM rollouts_rollout WHERE run_id = %s) / %s) = 0 "
                "AND UPPER(search_text) LIKE %s",
                [run.id, run.id, sample, f"%{word.upper()}%"],
            )
            print(
                f"middling word {word!r}: in {100 * cur.fetchone()[0] / max(n, 1):.2f}% of {n} "
                "sampled"
            )


def count_hits(run: Any) -> None:
    """Search finds every planted word the expected number of times (and only in its run)."""
    from webapp.explorer.params import ExplorerQuery
    from webapp.explorer.query import explore

    for word, (rate, place) in RARE_WORDS.items():
        found, cursor = 0, None
        while True:
            page = explore(run, ExplorerQuery(sort="reward", text=word, limit=500, cursor=cursor))
            found += len(page.rows)
            cursor = page.next_cursor
            if not cursor:
                break
        print(f"search {word!r} (planted in {place} at rate {rate:g}): {found} rollouts")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rollouts", type=int, default=1_000_000, help="per run (two runs are seeded)"
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--no-seed",
        action="store_true",
        help="time the runs as they stand (a seed still running, or stopped part way: sizes "
        "printed)",
    )
    parser.add_argument(
        "--seeders",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes seeding the runs (default: up to 2; seeding is Postgres-bound per process)",
    )
    args = parser.parse_args(argv)
    setup_django()
    runs = {}
    for kind in ("oneline", "realistic"):
        if args.no_seed:
            from webapp.explorer.search.base import run_size as _run_size
            from webapp.runs.models import Run

            runs[kind] = Run.objects.get(name=f"bench-{kind}-{args.rollouts}")
            print(
                f"{kind} run {runs[kind].id}: {_run_size(runs[kind]):,} rollouts as seeded so far"
            )
        else:
            runs[kind], _ = seed(kind, args.rollouts, args.seeders)
    vacuum()
    index_sizes()
    count_hits(runs["realistic"])
    word_shares(runs["realistic"])
    time_pages(runs, args.repeat)
    print(load_line())


if __name__ == "__main__":
    main()

"""Find more like this: from labelled rollouts of a run, queries that describe them.

The words most distinctive of the labelled rollouts against the rest of the run, by the log-odds
ratio with an informative Dirichlet prior (Monroe, Colaresi & Quinn 2008, "Fightin' Words"), over
document frequencies: a word counts once per rollout. The rest of the run is a sample of its
rollouts spread over its steps (SAMPLE), so the cost does not grow with the run. Words come from
the per-run word index (the stored tsvector, Postgres) or, where a rollout has none (SQLite), from
its text by the same word rule (webapp/rollouts/text.py search_words). Each proposal is then run as
an explorer query: how many rollouts it matches, how many labelled ones it recalls, a sample.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import matching_rollouts
from webapp.explorer.search import backend
from webapp.rollouts import text
from webapp.rollouts.models import Rollout, StepStat
from webapp.runs.models import Run

# Background rollouts read, spread over up to SAMPLE_STEPS steps: unnesting their stored words
# costs ~0.75 ms a rollout (a realistic ~10 KB rollout holds ~500 distinct words), and 600 estimate
# a word's share to a few points, which the prior then smooths.
SAMPLE = 600
SAMPLE_STEPS = 30
MAX_LABELLED = 200
MIN_SHARE = 0.4  # a proposed word occurs in at least this share of the labelled rollouts
PRIOR = 10.0  # the prior's weight, in documents: alpha_w = PRIOR x the word's pooled share
TOP_WORDS = 5
MIN_Z, STRONG = 2.0, 0.6  # a phrase's words: z >= 2 and >= 60% of the best word's
SAMPLE_MATCHES = 5
_LEXEME = re.compile(r"'\d+x([A-Z0-9]+)'")


@dataclass
class Proposal:
    query: dict[str, str]
    text: str
    score: float  # the log-odds z-score (a phrase or a pair: its weakest word's)
    matches: int = 0
    recall: int = 0  # labelled rollouts it matches
    labelled: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    warning: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "text": self.text,
            "score": round(self.score, 3),
            "matches": self.matches,
            "recall": self.recall,
            "labelled": self.labelled,
            "sample": self.sample,
            "warning": self.warning,
        }


def _words_of(rows: list[tuple[int, Any, str | None]]) -> dict[int, set[str]]:
    """{id: words} from (id, stored tsvector text or None, search text or None) rows."""
    out = {}
    for rid, vector, doc in rows:
        if vector:
            out[rid] = set(_LEXEME.findall(str(vector)))
        else:
            out[rid] = text.search_words(doc or "") or set()
    return out


def _read_words(qs: QuerySet) -> dict[int, set[str]]:
    if connection.vendor == "postgresql":
        from django.db.models import TextField
        from django.db.models.functions import Cast

        rows = qs.annotate(v=Cast("search_words", TextField())).values_list("id", "v", "id")
        rows = [(rid, v, None) for rid, v, _ in rows]
        missing = [rid for rid, v, _ in rows if not v]
        if missing:  # stored without words: their text, by the same rule
            docs = dict(Rollout.objects.filter(id__in=missing).values_list("id", "search_text"))
            rows = [(rid, v, docs.get(rid)) for rid, v, _ in rows]
        return _words_of(rows)
    return _words_of([(rid, None, doc) for rid, doc in qs.values_list("id", "search_text")])


def _sample_ids(run: Run, exclude: set[int]) -> list[int]:
    """Up to SAMPLE rollouts of the run spread over up to SAMPLE_STEPS of its steps (each step's
    first by id, through the (run, step) index), none of `exclude`."""
    steps = list(
        StepStat.objects.filter(run=run, component_id=0)
        .order_by("step")
        .values_list("step", flat=True)
    )
    if not steps:
        return []
    pick = steps[:: max(1, math.ceil(len(steps) / SAMPLE_STEPS))]
    per = max(1, SAMPLE // len(pick))
    if connection.vendor == "postgresql":  # one round trip: a (run, step) index scan per step
        with connection.cursor() as cur:
            cur.execute(_SAMPLE_IDS, [pick, run.id, per + len(exclude)])
            rows = cur.fetchall()
        kept: dict[int, list[int]] = {}
        for step, rid in rows:
            if rid not in exclude and len(kept.setdefault(step, [])) < per:
                kept[step].append(rid)
        return [i for ids in kept.values() for i in ids]
    out: list[int] = []
    for step in pick:
        ids = Rollout.objects.filter(run=run, step=step).order_by("id").values_list("id", flat=True)
        out += [i for i in ids[: per + len(exclude)] if i not in exclude][:per]
    return out


_SAMPLE_IDS = """
SELECT s.step, r.id FROM unnest(%s::int[]) AS s(step) CROSS JOIN LATERAL (
    SELECT id FROM rollouts_rollout WHERE run_id = %s AND step = s.step ORDER BY id LIMIT %s
) AS r"""


# Postgres: each candidate word's count among the sample, from the stored words (the tsvector,
# unnested in the database: a word is counted once per rollout, nothing is parsed in Python).
_SAMPLE_COUNTS = """
SELECT u.lexeme, count(*) FROM rollouts_rollout r, unnest(r.search_words) AS u
WHERE r.id = ANY(%s::bigint[]) AND u.lexeme = ANY(%s::text[]) GROUP BY u.lexeme"""


def _background(run: Run, ids: list[int], words: list[str]) -> tuple[Counter, int]:
    """(count of each of `words` among the sample `ids`, the sample's size)."""
    if connection.vendor != "postgresql":
        found = _read_words(Rollout.objects.filter(id__in=ids))
        wanted = set(words)
        return Counter(w for ws in found.values() for w in ws if w in wanted), len(found)
    lexemes = [text.words_lexeme(run.id, w) for w in words]
    with connection.cursor() as cur:
        cur.execute(_SAMPLE_COUNTS, [ids, lexemes])
        counts = Counter({lex.split("x", 1)[1]: n for lex, n in cur.fetchall()})
        unindexed = list(
            Rollout.objects.filter(id__in=ids, search_words__isnull=True).values_list(
                "search_text", flat=True
            )
        )
    wanted = set(words)
    for doc in unindexed:  # stored without words: their text, by the same rule
        counts.update((text.search_words(doc or "") or set()) & wanted)
    return counts, len(ids)


def _wordlike(w: str) -> bool:
    return len(w) >= text.MIN_TERM_CHARS and not w.isdigit()


def _z_scores(lab: Counter, n_lab: int, bg: Counter, n_bg: int) -> dict[str, float]:
    """Per word: the log-odds of occurring in a labelled rollout vs a background one, with the
    informative prior (the pooled share), over its standard error."""
    out = {}
    for w, y1 in lab.items():
        if y1 < MIN_SHARE * n_lab or not _wordlike(w):
            continue
        y2 = bg.get(w, 0)
        p0 = (y1 + y2 + 0.5) / (n_lab + n_bg + 1.0)
        a1, b1 = y1 + PRIOR * p0, n_lab - y1 + PRIOR * (1 - p0)
        a2, b2 = y2 + PRIOR * p0, n_bg - y2 + PRIOR * (1 - p0)
        delta = math.log(a1 / b1) - math.log(a2 / b2)
        out[w] = delta / math.sqrt(1 / a1 + 1 / b1 + 1 / a2 + 1 / b2)
    return out


def _phrase(docs: list[str], top: list[str], n_lab: int) -> str | None:
    """The longest run of 2-4 consecutive distinctive words that most labelled rollouts hold
    verbatim (separated by one space, as a quoted search term matches it). Only the stretches of
    consecutive distinctive words are windowed: a ~10 KB document holds few."""
    wanted = set(top)
    counts: dict[int, Counter] = {2: Counter(), 3: Counter(), 4: Counter()}
    for doc in docs:
        upper = doc.upper()
        grams: set[tuple[int, str]] = set()
        run: list[str] = []
        for tok in [*re.findall(r"[A-Z0-9]+", upper), ""]:  # "": ends the last stretch
            if tok in wanted:
                run.append(tok)
                continue
            for n in (2, 3, 4):
                grams.update((n, " ".join(run[i : i + n])) for i in range(len(run) - n + 1))
            run = []
        for n, g in grams:
            if g in upper:
                counts[n][g] += 1
    for n in (4, 3, 2):
        best = [(c, g) for g, c in counts[n].items() if c >= max(2, MIN_SHARE * n_lab)]
        if best:
            return max(best)[1]
    return None


def labelled_ids(run: Run, label: str | None, ids: list[int] | None) -> list[int]:
    """The rollouts to describe: those of the run labelled `label`, or the given ids (the run's)."""
    if ids:
        found = list(Rollout.objects.filter(run=run, id__in=ids).values_list("id", flat=True))
        if len(found) != len(set(ids)):
            raise FieldError("rollouts", "every id must be a rollout of this run")
        return found[:MAX_LABELLED]
    if not label:
        raise FieldError("label", "give a label (or rollout ids) whose rollouts to describe")
    found = list(
        Rollout.objects.filter(run=run, annotations__label__slug=label)
        .distinct()
        .values_list("id", flat=True)[:MAX_LABELLED]
    )
    if not found:
        raise FieldError("label", f"no rollout of this run is labelled {label[:60]!r}")
    return found


def propose(run: Run, ids: list[int]) -> dict[str, Any]:
    """Queries describing the rollouts `ids`, best first, each measured on the run."""
    lab_words = _read_words(Rollout.objects.filter(id__in=ids))
    lab = Counter(w for ws in lab_words.values() for w in ws)
    n_lab = len(lab_words)
    candidates = [w for w, c in lab.items() if c >= MIN_SHARE * n_lab and _wordlike(w)]
    sample = _sample_ids(run, set(ids))
    bg, n_bg = _background(run, sample, candidates)
    z = _z_scores(Counter({w: lab[w] for w in candidates}), n_lab, bg, n_bg)
    top = sorted(z, key=lambda w: -z[w])[: TOP_WORDS * 3]
    proposals = [Proposal({"q": w.lower()}, w.lower(), z[w]) for w in top[:TOP_WORDS]]
    # A phrase only of strongly distinctive words: first when as distinctive as the best word.
    strong = [w for w in top if z[w] >= max(MIN_Z, STRONG * z[top[0]])]
    docs = list(Rollout.objects.filter(id__in=ids[:50]).values_list("search_text", flat=True))
    phrase = _phrase(docs, strong, len(docs)) if len(strong) >= 2 else None
    if phrase:
        q = f'"{phrase.lower()}"'
        proposals.insert(0, Proposal({"q": q}, q, min(z[w] for w in phrase.split())))
    elif len(strong) >= 2:
        pair = f"{strong[0].lower()} {strong[1].lower()}"
        proposals.insert(0, Proposal({"q": pair}, pair, min(z[strong[0]], z[strong[1]])))
    comps = run.components()
    size = sum(
        StepStat.objects.filter(run=run, component_id=0).values_list("n_rollouts", flat=True)
    )
    for p in proposals:
        measure(run, p, ids, comps, size, sample)
    # Best first: the most labelled rollouts recalled, then the fewest other matches.
    proposals.sort(key=lambda p: (-p.recall, p.matches == 0, p.matches))
    return {
        "labelled": len(ids),
        "background": n_bg,
        "proposals": [p.as_dict() for p in proposals],
        "note": "" if proposals else _none_note(len(lab_words)),
    }


def _none_note(n: int) -> str:
    return (
        f"no word occurs in at least {MIN_SHARE:.0%} of the {n} labelled rollouts and is rarer in "
        "the rest of the run: label more examples, or write the query by hand in the explorer"
    )


def measure(
    run: Run, p: Proposal, ids: list[int], comps: list, size: int, spread: list[int] = ()
) -> None:
    """The proposal's matches on the run, its recall of `ids`, a sample of other matches: those
    among `spread` (the background sample, over the run's steps) first, then any."""
    q = ExplorerQuery.from_params(p.query, [c.name for c in comps])
    parts = matching_rollouts(run, q, comps)
    p.matches = _count(run, q, parts)
    p.recall = sum(part.filter(id__in=ids).count() for part in parts)
    p.labelled = len(ids)
    fields = ("id", "step", "advantage", "preview_head")
    for where in ({"id__in": list(spread)}, {}):
        for part in parts:
            seen = [r["id"] for r in p.sample]
            want = SAMPLE_MATCHES - len(p.sample)
            if want <= 0:
                break
            rows = part.filter(**where).exclude(id__in=[*ids, *seen]).order_by().values(*fields)
            p.sample += [
                {**r, "preview_head": (r["preview_head"] or "")[:200]} for r in rows[:want]
            ]
    if p.matches == 0:
        p.warning = "matches no rollout of this run"
    elif size and p.matches >= size:
        p.warning = "matches every rollout of this run: it describes nothing in particular"


def _count(run: Run, q: ExplorerQuery, parts: list[QuerySet]) -> int:
    """The query's matches. A search the word index answers exactly (one-word terms, nothing else)
    is counted by the index's bitmap alone, as the explorer counts (no row read); else the rows."""
    if q.search is not None and len(parts) == 2 and set(q.params()) <= {"sort", "order", "q"}:
        counted = backend().exact_count(run, q.search)
        if counted is not None:
            return counted + parts[0].count()  # parts[0]: the rollouts without words
    return sum(part.count() for part in parts)

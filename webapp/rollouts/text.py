"""What a rollout shows on list pages and what search reads, built once at ingest: the preview
(head and tail of the visible agent text, turn, tool-call and character counts: the only columns
list pages read) and the search document (prompt, every message, reward reasons), which Postgres
indexes with pg_trgm and a word index and SQLite scans. Search queries are parsed here the same
way for both databases; highlighting escapes all model text. More: docs/performance.md, "Module
notes".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from webapp.errors import FieldError

PREVIEW_CHARS = 300
PROMPT_ROLES = ("system", "user", "developer")
MAX_QUERY_CHARS = 1000  # past this a query is refused (400): every term is an index probe
MAX_TERMS = 12
MIN_TERM_CHARS = 3  # a trigram index cannot serve shorter words
SNIPPET_BEFORE, SNIPPET_CHARS = 40, 200  # the match stays visible in a one-line table cell
# The word index: a word is a maximal run of ASCII letters and digits of the upper-cased document
# (every other character separates words). A word longer than WORD_CHARS is stored as windows of
# WORD_CHARS characters every WORD_STEP, so any run of up to WORD_STEP characters inside it lies
# whole in one window. Documents with more distinct words than MAX_WORDS are not word-indexed
# (search_words NULL: search rechecks them as it did before; tsvector holds at most 1 MB).
WORD_CHARS, WORD_STEP, MAX_WORDS = 64, 32, 40_000
_WORD_BYTES = bytes(c if 48 <= c <= 57 or 65 <= c <= 90 else 32 for c in range(256))


@dataclass(frozen=True)
class TextSummary:
    head: str
    tail: str
    turns: int
    tool_calls: int
    chars: int


def normalize_newlines(text: str) -> str:
    """\r\n and lone \r -> \n: one line ending in storage and in every exported record."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _arguments(call: Any) -> tuple[str, str]:
    fn = call.get("function", call) if isinstance(call, dict) else {}
    if not isinstance(fn, dict):
        return "", str(fn)
    args = fn.get("arguments", "")
    return str(fn.get("name", "")), args if isinstance(args, str) else json.dumps(
        args, ensure_ascii=False
    )


def message_texts(m: dict[str, Any]) -> list[str]:
    """The visible pieces of one message: its content, then each tool call as `name(arguments)`."""
    out = [m["content"]] if isinstance(m.get("content"), str) and m["content"] else []
    for call in m.get("tool_calls") or ():
        name, args = _arguments(call)
        out.append(f"{name}({args})")
    return out


def agent_messages(transcript: list[dict[str, Any]], prompt: Any) -> list[dict[str, Any]]:
    """The transcript after its prompt: after the group's prompt messages when it starts with
    them, else after its leading system/user/developer messages; the whole transcript when
    nothing is left."""
    if isinstance(prompt, list) and prompt and transcript[: len(prompt)] == prompt:
        rest = transcript[len(prompt) :]
    else:
        start = 0
        while start < len(transcript) and transcript[start].get("role") in PROMPT_ROLES:
            start += 1
        rest = transcript[start:]
    return rest or transcript


def summarize(transcript: list[dict[str, Any]], prompt: Any) -> TextSummary:
    agent = agent_messages(transcript, prompt)
    text = " ".join(piece for m in agent for piece in message_texts(m))
    text = " ".join(text.split())  # one line: list pages show it in a table cell
    turns = sum(m.get("role") == "assistant" for m in transcript)
    calls = sum(len(m.get("tool_calls") or ()) for m in transcript)
    if len(text) <= 2 * PREVIEW_CHARS:
        return TextSummary(text, "", turns, calls, len(text))
    return TextSummary(text[:PREVIEW_CHARS], text[-PREVIEW_CHARS:], turns, calls, len(text))


def search_document(
    prompt_text: str, prompt: Any, transcript: list[dict[str, Any]], reasons: list[str]
) -> str:
    """Everything search finds: the prompt, every message (tool calls and results too), the reasons.
    A transcript that repeats the prompt messages does not store them twice."""
    messages = transcript
    if isinstance(prompt, list) and prompt and transcript[: len(prompt)] == prompt:
        messages = transcript[len(prompt) :]
    parts = [prompt_text]
    for m in messages:
        parts.extend(message_texts(m))
    parts.extend(r for r in reasons if r)
    # Whitespace collapsed: a "quoted phrase" matches across the line breaks of a traceback.
    return " ".join(" ".join(parts).split())


def _words(s: str) -> set[str]:
    return set(_word_list(s))


def _translated(s: str) -> str:
    """The text upper-cased as Postgres's UPPER (the search's definition) sees it, every character
    but A-Z and 0-9 a space: it upper-cases two non-ASCII letters to ASCII (dotless i to I, long s
    to S) and leaves every other non-ASCII character non-ASCII (ß stays ß, where Python would
    write SS), so those only separate words."""
    if "ı" in s or "ſ" in s:
        s = s.replace("ı", "I").replace("ſ", "S")
    raw = s.encode("utf-8", "replace").upper().translate(_WORD_BYTES)  # bytes.upper: ASCII only
    return raw.decode("ascii")


def _word_list(s: str) -> list[str]:
    """Maximal runs of ASCII letters and digits, upper-cased (_translated), in order of
    appearance."""
    return _translated(s).split()


def search_words(doc: str) -> set[str] | None:
    """The document's distinct words (words longer than WORD_CHARS as windows), or None past
    MAX_WORDS. A document contains a run of letters and digits iff one of its words does."""
    words = _words(doc)
    if max(map(len, words), default=0) <= WORD_CHARS:  # the usual case: no word to window
        return None if len(words) > MAX_WORDS else words
    long = [w for w in words if len(w) > WORD_CHARS]
    for w in long:
        words.discard(w)
        words.update(w[i : i + WORD_CHARS] for i in range(0, max(len(w) - WORD_STEP, 1), WORD_STEP))
    return None if len(words) > MAX_WORDS else words


def words_lexeme(run_id: int, word: str) -> str:
    """A word as the word index stores it: prefixed by its run ("63x" + word; words hold only A-Z
    and 0-9, so the lower-case x ends the prefix and nothing needs quoting). The index is then
    run-scoped without a run_id column, which the planner could pick for a plain run filter."""
    return f"{run_id}x{word}"


def words_tsvector(run_id: int, words: set[str] | None) -> str | None:
    """The tsvector literal of a rollout's words (Rollout.search_words): each as words_lexeme
    writes it, in one join."""
    if words is None:
        return None
    prefix = words_lexeme(run_id, "")
    return prefix + (" " + prefix).join(words) if words else ""


def term_runs(term: str) -> list[str]:
    """The runs of ASCII letters and digits of a search term (as _words reads them), of
    MIN_TERM_CHARS or more, cut to WORD_STEP characters. A document containing the term has, for
    each run, a stored word containing it."""
    runs = (w[:WORD_STEP] for w in _word_list(term) if len(w) >= MIN_TERM_CHARS)
    return list(dict.fromkeys(runs))  # the term's order: a plan that never depends on hash seeds


def is_one_word(term: str) -> bool:
    """A term whose stored words decide it exactly: one run of ASCII letters and digits, at most
    WORD_STEP long (a document contains it iff one of its words contains it)."""
    return MIN_TERM_CHARS <= len(term) <= WORD_STEP and term.isascii() and term.isalnum()


def nonascii_pieces(term: str) -> list[str]:
    """The pieces of a search term (split at whitespace) that hold a non-ASCII character once
    upper-cased as Postgres does (dotless i and long s become ASCII). Each lies inside one token of
    the document that holds a non-ASCII character, so the trigram index over those tokens alone
    (migration 0014, rd_search_nonascii) finds every document containing the term."""
    out = []
    for piece in term.split():
        if not piece.replace("ı", "I").replace("ſ", "S").isascii():
            out.append(piece)
    return out


@dataclass(frozen=True)
class SearchQuery:
    include: tuple[str, ...]  # every one must occur
    exclude: tuple[str, ...]  # none may occur

    @property
    def first(self) -> str:
        return max(self.include, key=len)  # the snippet centres on the most specific term


_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')


def parse_query(raw: str) -> SearchQuery | None:
    """None for an empty query. Raises FieldError (a 400 naming `q`) for a query no
    index can serve."""
    if not raw or not raw.strip():
        return None
    if len(raw) > MAX_QUERY_CHARS:
        raise FieldError("q", f"at most {MAX_QUERY_CHARS} characters (got {len(raw)})")
    if "\x00" in raw:
        raise FieldError("q", "must not contain NUL characters")
    include, exclude = [], []
    for neg, phrase, word in _TOKEN.findall(raw):
        if word:
            negative = word.startswith("-") and len(word) > 1
            term = word[1:] if negative else word
        else:
            negative, term = bool(neg), " ".join(phrase.split())
        if term:
            (exclude if negative else include).append(term)
    if not include:
        raise FieldError(
            "q",
            "give at least one word to look for (a query of only -exclusions would scan every row)",
        )
    if len(include) + len(exclude) > MAX_TERMS:
        raise FieldError("q", f"at most {MAX_TERMS} terms")
    if max(len(t) for t in include) < MIN_TERM_CHARS:
        # Shorter words are checked on the rows a longer one found; alone they would scan every row.
        raise FieldError("q", f"give at least one word of {MIN_TERM_CHARS} or more characters")
    return SearchQuery(tuple(dict.fromkeys(include)), tuple(dict.fromkeys(exclude)))


def highlight(
    snippet: str, query: SearchQuery, clipped_start: bool, clipped_end: bool
) -> SafeString:
    """The snippet as HTML: model text escaped, every included term wrapped in <mark>."""
    text = " ".join(snippet.split())
    pattern = re.compile(
        "|".join(re.escape(t) for t in sorted(query.include, key=len, reverse=True)), re.I
    )
    out, pos = [], 0
    for m in pattern.finditer(text):
        out.append(escape(text[pos : m.start()]))
        out.append(f"<mark>{escape(m.group(0))}</mark>")
        pos = m.end()
    out.append(escape(text[pos:]))
    return mark_safe(("… " if clipped_start else "") + "".join(out) + (" …" if clipped_end else ""))

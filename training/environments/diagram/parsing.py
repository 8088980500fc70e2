"""Reading a diagram completion: the graded text of a completion or chat transcript, fences
stripped, and the JSON parse with partial credit for how far the parser got."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_FENCE_RE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_NORM_RE = re.compile(r"[^a-z0-9]+")


def normalise(text: str) -> str:
    """Case- and punctuation-insensitive form used to match shapes to requested nodes."""
    return _NORM_RE.sub("", text.lower())


def slug(text: str) -> str:
    return _NORM_RE.sub("_", text.lower()).strip("_")


# ---------------------------------------------------------------------------------------------
# Parsing


def completion_text(completion: Any) -> str:
    """The text to grade: a str as is, or the last assistant message of a chat transcript."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return _content_text(message.get("content"))
        return ""
    return str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style parts: [{"type": "text", "text": ...}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def strip_fences(text: str) -> str:
    """Inner text of the first ``` fence (tolerating a truncated, unclosed one), else the text."""
    match = _FENCE_RE.search(text)
    return (match.group(1) if match else text).strip()


@dataclass(frozen=True)
class Parsed:
    """Outcome of parsing one completion; `actions` is set only for a top-level JSON list."""

    json_value: float
    reason: str
    actions: list[Any] | None


def parse_completion(text: str) -> Parsed:
    body = strip_fences(text)
    if not body:
        return Parsed(0.0, "empty completion", None)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        if body[0] not in "[{":
            return Parsed(0.0, "not JSON: starts with prose", None)
        # Partial credit grows with how far the parser got: a truncated list scores near 0.5,
        # garbage right after the bracket near 0.1; both stay below any parseable JSON (0.6).
        decode = isinstance(exc, json.JSONDecodeError)
        pos = exc.pos if decode else 0
        msg = exc.msg if decode else "too deeply nested"
        return Parsed(0.1 + 0.4 * pos / len(body), f"JSON parse error at char {pos}: {msg}", None)
    if isinstance(data, list) and all(isinstance(a, dict) for a in data):
        return Parsed(1.0, f"valid JSON list of {len(data)} actions", data)
    if isinstance(data, list):
        return Parsed(0.6, "valid JSON list but some items are not objects", data)
    return Parsed(0.6, f"valid JSON but top level is {type(data).__name__}, not list", None)

"""The token view of a rollout: what the transcript page's token panel fetches (JSON, separately
from the page, so a page that does not open it pays nothing for its tokens).

`token_payload` is a pure function from the stored token arrays and the rollout's transcript to
that JSON: each token's text, the raw arrays the hover card reads, the colour scale of each
quantity, the turns with their roles and a strip chart per quantity. Token text is model output:
it travels as JSON strings and the page sets it with textContent only (static/js/tokens.js).

Turns: `turn[i]` is the index of token i's message in the rollout's transcript (0 for a plain
completion) and `offsets[i]` a character offset into that message's content (the data layer's
contract, webapp/tokens/models.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from webapp.tokens.charts import (
    QUANTITIES,
    nullable,
    quantity_values,
    strip_figures,
    turn_starts,
)

ARRAYS = ("sampler_logprobs", "trainer_logprobs", "ref_logprobs", "entropy", "advantages")
DIGITS = 4  # significant digits sent: values are stored as float16 (3 digits), the card reads 4
NEEDS = {  # the arrays each quantity is computed from
    "sampler": ("sampler_logprobs",),
    "trainer": ("trainer_logprobs",),
    "mismatch": ("sampler_logprobs", "trainer_logprobs"),
    "entropy": ("entropy",),
    "advantage": ("advantages",),
}


def messages(transcript: Any) -> list[dict[str, Any]]:
    """The transcript's messages (what `turn` indexes); anything else reads as an empty message."""
    if not isinstance(transcript, list):
        return []
    return [m if isinstance(m, dict) else {} for m in transcript]


def _content(m: dict[str, Any]) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else ""


def token_texts(tokens: dict[str, Any], completion: str, msgs: list[dict[str, Any]]) -> list[str]:
    """Each token's text: the stored "text"; else its message's content between its offset and
    the next token's in the same message (the last one to the end of the content); else the id
    in angle brackets. Without turns, offsets are into the completion."""
    ids = np.asarray(tokens["ids"]).tolist()
    if tokens.get("text") is not None:
        return [str(t) for t in tokens["text"]]
    offsets = tokens.get("offsets")
    if offsets is None:
        return [f"<{i}>" for i in ids]
    starts = np.asarray(offsets, dtype=np.int64)
    turns = tokens.get("turn")
    turns = np.zeros(len(starts), dtype=np.int64) if turns is None else np.asarray(turns)
    whole = tokens.get("turn") is None or not msgs
    out: list[str] = []
    # One slice per token, a turn (a run of tokens of one message) at a time.
    bounds = [*turn_starts(turns), len(starts)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        t = int(turns[lo])
        text = completion if whole else _content(msgs[t]) if 0 <= t < len(msgs) else ""
        a = starts[lo:hi].tolist()
        out += [text[x:y] for x, y in zip(a, [*a[1:], len(text)], strict=True)]
    return out


def _rounded(values: Any) -> list[float | None] | None:
    if values is None:
        return None
    a = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(a) & (a != 0)
    digits = np.zeros(a.shape)
    digits[finite] = DIGITS - 1 - np.floor(np.log10(np.abs(a[finite])))
    digits = np.clip(digits, 0, 12)  # log-probs and entropies: no value needs more decimals
    return nullable(np.round(a * 10.0**digits) / 10.0**digits)


def colour_range(key: str, values: np.ndarray) -> list[float]:
    """[lo, hi] of the colour scale: log-probs from their 2nd percentile (a few near-impossible
    tokens do not wash the rest out) to 0; |mismatch| and entropy from 0 to their 98th
    percentile (at least 0.05 nats: a healthy 0.01 stays pale); advantage symmetric about 0."""
    a = values[np.isfinite(values)]
    if key in ("sampler", "trainer"):
        lo = float(np.percentile(a, 2)) if a.size else -1.0
        return [min(lo, -1.0), 0.0]
    if key in ("mismatch", "entropy"):
        hi = float(np.percentile(a, 98)) if a.size else 0.0
        return [0.0, max(hi, 0.05)]
    m = float(np.abs(a).max()) if a.size else 0.0
    return [-(m or 1.0), m or 1.0]


def turn_list(turns: Any, messages: list[dict[str, Any]]) -> list[dict]:
    """Each turn's first token, its index and the role (and tool name) of its message."""
    if turns is None:
        return []
    out = []
    for i in turn_starts(turns):
        t = int(turns[i])
        m = messages[t] if 0 <= t < len(messages) else {}
        out.append(
            {
                "start": i,
                "turn": int(t),
                "role": str(m.get("role", "")),
                "name": str(m.get("name") or ""),
            }
        )
    return out


def token_payload(tokens: dict[str, Any], completion: str, transcript: Any) -> dict[str, Any]:
    """The JSON the token panel draws (module docstring)."""
    n = len(tokens["ids"])
    quantities = []
    for key, (label, unit) in QUANTITIES.items():
        available = all(tokens.get(name) is not None for name in NEEDS[key])
        values = quantity_values(tokens, key) if available else None
        quantities.append(
            {
                "key": key,
                "label": label,
                "unit": unit,
                "available": available,
                "range": colour_range(key, values) if values is not None else None,
            }
        )
    mask = tokens.get("loss_mask")
    turns = tokens.get("turn")
    msgs = messages(transcript)
    return {
        "n": n,
        "ids": np.asarray(tokens["ids"]).tolist(),
        "text": token_texts(tokens, completion, msgs),
        "arrays": {name: _rounded(tokens.get(name)) for name in ARRAYS},
        "loss_mask": None if mask is None else np.asarray(mask, dtype=np.int8).tolist(),
        "turn": None if turns is None else np.asarray(turns, dtype=np.int64).tolist(),
        "turns": turn_list(turns, msgs),
        "quantities": quantities,
        "default": next((q["key"] for q in quantities if q["available"]), None),
        "figures": strip_figures(tokens),
    }

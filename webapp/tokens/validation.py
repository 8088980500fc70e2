"""Check a rollout's `tokens` object (the contract in webapp/tokens/models.py) as part of a batch's
validation (webapp/rollouts/validation.py calls `parse_tokens` for every rollout that carries one).

Each problem is reported against its field, `groups[g].rollouts[r].tokens.<array>`, with the first
offending element's position and value, so a trainer can find the token; the batch is refused whole.
Arrays are converted to numpy once here: the statistics and the codec work on what this returns.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from django.conf import settings

from webapp.tokens.codec import FIELDS, FLOAT_FIELDS, TokenArrays

MAX_ID = 2**31 - 1  # ids are stored as uint32 and served as JSON integers; 2^31 keeps them int32
LOGPROB_TOL = 1e-3  # a log-prob up to this above 0 is float rounding (log_softmax in bf16)
LOGPROB_FIELDS = ("sampler_logprobs", "trainer_logprobs", "ref_logprobs")
DEFAULT_MAX_TOKENS = 262_144  # per rollout; settings.TOKENS_MAX_PER_ROLLOUT overrides

AddError = Callable[[str, str], None]


def max_tokens() -> int:
    return int(getattr(settings, "TOKENS_MAX_PER_ROLLOUT", DEFAULT_MAX_TOKENS))


def vocab_size(config: Any) -> int | None:
    """The vocabulary size a run declared (Run.config["vocab_size"], set by the recorder from the
    model's config), or None: ids are then only checked against MAX_ID."""
    v = config.get("vocab_size") if isinstance(config, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _first_bad(bad: np.ndarray, values: np.ndarray) -> str:
    i = int(np.argmax(bad))
    return f"element {i} is {values[i].item()!r}"


BINARY_DTYPES = {  # name -> little-endian numpy dtype, for {"dtype", "data"} arrays
    "int8": "<i1",
    "uint8": "<u1",
    "int16": "<i2",
    "uint16": "<u2",
    "int32": "<i4",
    "uint32": "<u4",
    "int64": "<i8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}


def _binary(v: dict, path: str, integer: bool, add: AddError) -> np.ndarray | None:
    """An array sent compactly: {"dtype": "float32", "data": base64 of the little-endian values}
    (the recorder's form: a quarter of the JSON and no per-number parsing), or with "data" the raw
    bytes themselves (a binary body's arrays, training/token_wire.py: no base64 either)."""
    dtype = BINARY_DTYPES.get(v.get("dtype")) if isinstance(v.get("dtype"), str) else None
    data = v.get("data")
    if set(v) != {"dtype", "data"} or dtype is None or not isinstance(data, (str, memoryview)):
        add(path, f"must be a list, or {{dtype, data}} with dtype one of {', '.join(BINARY_DTYPES)}"
            " and data the base64 of its little-endian values")  # fmt: skip
        return None
    if integer and dtype[1] == "f":
        add(f"{path}.dtype", f"must be an integer type, got {v['dtype']}")
        return None
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else data
    except (binascii.Error, ValueError):
        add(f"{path}.data", "is not valid base64")
        return None
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        add(f"{path}.data", f"{len(raw)} bytes is not a whole number of {v['dtype']} values")
        return None
    return np.frombuffer(raw, dtype=dtype)  # read-only, over the request's bytes


def _numbers(v: Any, path: str, n: int | None, integer: bool, add: AddError) -> np.ndarray | None:
    """`v` as a float64 or int64 array of length n (n None: any length), or None after an error."""
    kind = "integers" if integer else "numbers"
    if isinstance(v, dict):
        a = _binary(v, path, integer, add)
        if a is None:
            return None
        return _checked(a, path, n, integer, add)
    if not isinstance(v, list):
        add(path, f"must be a list of {kind}")
        return None
    if n is not None and len(v) != n:
        add(path, f"has {len(v)} elements; ids has {n} (every array must be as long as ids)")
        return None
    try:
        a = np.array(v) if v else np.zeros(0, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        a = np.array([0], dtype=object)
    if a.dtype.kind == "b" and integer:  # loss_mask as true/false; ids and turns then fail range
        a = a.astype(np.int64)
    if a.ndim != 1 or a.dtype.kind not in ("iu" if integer else "iuf"):
        add(path, f"must be a flat list of {kind}")
        return None
    return _checked(a, path, None, integer, add)


def _checked(
    a: np.ndarray, path: str, n: int | None, integer: bool, add: AddError
) -> np.ndarray | None:
    if n is not None and a.size != n:
        add(path, f"has {a.size} elements; ids has {n} (every array must be as long as ids)")
        return None
    # Binary arrays keep their type when it serves (no copy): integers of any width, float32
    # (the statistics sum in float64); the rest becomes int64 or float64.
    if integer and a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    elif not integer and a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float64)
    if not integer and not np.isfinite(a).all():
        add(path, f"must hold finite numbers; {_first_bad(~np.isfinite(a), a)}")
        return None
    return a


def _bounds(name: str, ctx: dict[str, Any]) -> tuple[float, float, str] | None:
    """The closed interval a field's values must lie in, and the rule in words; None: any."""
    if name in LOGPROB_FIELDS:
        return -math.inf, LOGPROB_TOL, "log-probabilities must be <= 0"
    if name == "entropy":
        return -LOGPROB_TOL, math.inf, "entropies must be >= 0"
    if name == "ids":
        top = ctx["vocab"] or MAX_ID + 1
        vocab = " (the run's vocab_size)" if ctx["vocab"] else ""
        return 0, top - 1, f"ids must be >= 0 and < {top}{vocab}"
    if name == "loss_mask":
        return 0, 1, "loss_mask values must be 0 or 1"
    if name == "turn":
        top = ctx["messages"]
        return 0, top - 1, f"turns must index the transcript's {top} messages"
    if name == "offsets":
        return 0, MAX_ID, "offsets must be >= 0"
    return None


def _check_range(name: str, a: np.ndarray, path: str, ctx: dict[str, Any], add: AddError) -> bool:
    b = _bounds(name, ctx)
    if b is None or not a.size:
        return True
    lo, hi, rule = b
    if a.min() >= lo and a.max() <= hi:  # two reductions, no temporary array (the common case)
        return True
    bad = (a < lo) | (a > hi)
    add(path, f"{rule}; {_first_bad(bad, a)}")
    return False


def _text(v: Any, path: str, n: int, add: AddError) -> list[str] | None:
    if not isinstance(v, list) or len(v) != n:
        add(path, f"must be a list of {n} strings (as long as ids)")
        return None
    for i, s in enumerate(v):
        if not isinstance(s, str):
            add(path, f"must be a list of strings; element {i} is {type(s).__name__}")
            return None
        if "\x00" in s or not s.isascii() and not _utf8(s):
            add(path, f"must not contain NUL characters or lone surrogates; element {i} does")
            return None
    return v


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_tokens(
    raw: Any, path: str, messages: int, vocab: int | None, add: AddError
) -> TokenArrays | None:
    """The arrays of one rollout's `tokens` object, checked; None after reporting through `add`.
    `messages`: how many messages the rollout's transcript has (for `turn`)."""
    if not isinstance(raw, dict):
        add(path, "must be an object of token arrays (ids required)")
        return None
    unknown = [k for k in raw if k not in FIELDS]
    if unknown:
        add(f"{path}.{str(unknown[0])[:100]}", f"unknown field; expected {', '.join(FIELDS)}")
        return None
    if "ids" not in raw:
        add(f"{path}.ids", "required: the token ids")
        return None
    ids = _numbers(raw["ids"], f"{path}.ids", None, True, add)
    if ids is None:
        return None
    if ids.size > max_tokens():
        add(f"{path}.ids", f"{ids.size} tokens; the limit is {max_tokens()} a rollout")
        return None
    ctx = {"vocab": vocab, "messages": messages}
    ok = _check_range("ids", ids, f"{path}.ids", ctx, add)
    out: dict[str, Any] = {"ids": ids}
    for name in FIELDS[1:]:
        if raw.get(name) is None:
            continue
        p = f"{path}.{name}"
        if name == "text":
            out[name] = _text(raw[name], p, ids.size, add)
            ok = out[name] is not None and ok
            continue
        a = _numbers(raw[name], p, ids.size, name not in FLOAT_FIELDS, add)
        good = a is not None and _check_range(name, a, p, ctx, add)
        ok = good and ok  # every field checked, so one answer lists all of a rollout's problems
        out[name] = a.astype(bool) if name == "loss_mask" and a is not None else a
    return TokenArrays(**out) if ok else None

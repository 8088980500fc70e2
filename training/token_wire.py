"""The binary request body for token arrays (Content-Type `application/x-rd-batch`): the batch's
JSON with each numeric token array replaced by a reference into a raw byte section after it, so
the server reads the arrays with numpy.frombuffer (no base64, no per-number parsing).

    u32 little-endian: JSON length n | n bytes of JSON | the data section
    an array in the JSON: {"dtype": "float32", "at": [offset, nbytes]} (offset into the data
    section, little-endian values)

`encode` builds a body from a batch whose token arrays are numpy arrays (or `pack`'s dicts, or
lists); `decode` turns one back into the JSON form with `{"dtype", "data": memoryview}` arrays,
which the ingestion's validation reads like base64 ones. No Django: clients use it too.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

CONTENT_TYPE = "application/x-rd-batch"
LENGTH = struct.Struct("<I")


class WireError(ValueError):
    """A malformed body: `path` names the field, `message` what is wrong."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def encode(body: dict[str, Any]) -> bytes:
    """The binary body of `body` (not modified): every numpy array in a rollout's `tokens` goes to
    the data section, 8-byte aligned; other values stay JSON."""
    parts: list[bytes] = []
    size = 0

    def ref(a: np.ndarray) -> dict[str, Any]:
        nonlocal size
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        out = {"dtype": a.dtype.name, "at": [size, len(raw)]}
        pad = -len(raw) % 8
        parts.append(raw + b"\0" * pad)
        size += len(raw) + pad
        return out

    groups = []
    for g in body.get("groups", []):
        rollouts = []
        for r in g.get("rollouts", []):
            t = r.get("tokens")
            if isinstance(t, dict):
                t = {k: ref(v) if isinstance(v, np.ndarray) else v for k, v in t.items()}
                r = {**r, "tokens": t}
            rollouts.append(r)
        groups.append({**g, "rollouts": rollouts})
    text = json.dumps({**body, "groups": groups}, allow_nan=False).encode()
    return LENGTH.pack(len(text)) + text + b"".join(parts)


def split(raw: bytes) -> tuple[bytes, memoryview]:
    """The JSON text and the data section of a binary body."""
    if len(raw) < LENGTH.size:
        raise WireError("body", "too short for a binary batch (a 4-byte JSON length first)")
    (n,) = LENGTH.unpack_from(raw)
    if LENGTH.size + n > len(raw):
        raise WireError("body", f"JSON length {n} runs past the body's {len(raw)} bytes")
    view = memoryview(raw)
    return bytes(view[LENGTH.size : LENGTH.size + n]), view[LENGTH.size + n :]


def resolve(body: Any, data: memoryview) -> None:
    """Replace, in place, each `{"dtype", "at"}` token array of `body` by `{"dtype", "data"}`, its
    bytes in `data` (a view, not a copy). Other shapes are left to the batch's validation."""
    groups = body.get("groups") if isinstance(body, dict) else None
    for gi, g in enumerate(groups if isinstance(groups, list) else []):
        rollouts = g.get("rollouts") if isinstance(g, dict) else None
        for ri, r in enumerate(rollouts if isinstance(rollouts, list) else []):
            t = r.get("tokens") if isinstance(r, dict) else None
            if not isinstance(t, dict):
                continue
            for k, v in t.items():
                if isinstance(v, dict) and "at" in v:
                    path = f"groups[{gi}].rollouts[{ri}].tokens.{k}"
                    t[k] = {"dtype": v.get("dtype"), "data": _slice(v["at"], data, path)}


def _slice(at: Any, data: memoryview, path: str) -> memoryview:
    ok = isinstance(at, list) and len(at) == 2 and all(type(x) is int and x >= 0 for x in at)
    if not ok:
        raise WireError(f"{path}.at", "must be [offset, nbytes], two integers >= 0")
    start, n = at
    if start + n > len(data):
        raise WireError(
            f"{path}.at", f"bytes {start}..{start + n} run past the data section's {len(data)}"
        )
    return data[start : start + n]

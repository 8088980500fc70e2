"""The binary request body for token arrays (Content-Type `application/x-rd-batch`): the batch's
JSON with each numeric token array replaced by a reference into a raw byte section after it, so
the server reads the arrays with numpy.frombuffer (no base64, no per-number parsing).

    u32 little-endian: JSON length n | n bytes of JSON | the data section
    an array in the JSON: {"dtype": "float32", "at": [offset, nbytes]} (offset into the data
    section, little-endian values)

`encode` builds a body from a batch whose token arrays are numpy arrays or base64 dicts (lists
stay JSON); `split` and `resolve` turn one back into the JSON form with `{"dtype", "data":
memoryview}` arrays, which the ingestion's validation reads like base64 ones. Standard library
only: training/client.py sends it.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Any

CONTENT_TYPE = "application/x-rd-batch"
LENGTH = struct.Struct("<I")


class WireError(ValueError):
    """A malformed body: `path` names the field, `message` what is wrong."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def _raw(v: Any) -> tuple[str, bytes] | None:
    """(dtype, little-endian bytes) of an array the body carries raw: a numpy array, or the base64
    form {"dtype", "data"} (decoded here, on the sender's CPU); None: it stays JSON."""
    if isinstance(v, dict) and set(v) == {"dtype", "data"} and isinstance(v["data"], str):
        try:
            return str(v["dtype"]), base64.b64decode(v["data"], validate=True)
        except (binascii.Error, ValueError):
            return None  # sent as it is: the server refuses it by field
    if hasattr(v, "dtype") and hasattr(v, "tobytes"):  # numpy, without importing it here
        a = v.astype(v.dtype.newbyteorder("<"), copy=False)
        return a.dtype.name, a.tobytes()
    return None


def carries_raw(group: dict[str, Any]) -> bool:
    """Whether a group has a token array that `encode` would send raw."""
    rollouts = group.get("rollouts")
    return any(
        _raw(v) is not None
        for r in (rollouts if isinstance(rollouts, list) else [])
        if isinstance(r, dict) and isinstance(r.get("tokens"), dict)
        for v in r["tokens"].values()
    )


def encode(body: dict[str, Any]) -> bytes:
    """The binary body of `body` (not modified): every numpy or base64 array in a rollout's
    `tokens` goes to the data section, 8-byte aligned; the rest stays JSON. Stdlib only."""
    parts: list[bytes] = []
    size = 0

    def ref(v: Any) -> Any:
        nonlocal size
        raw = _raw(v)
        if raw is None:
            return v
        out = {"dtype": raw[0], "at": [size, len(raw[1])]}
        pad = -len(raw[1]) % 8
        parts.append(raw[1] + b"\0" * pad)
        size += len(raw[1]) + pad
        return out

    groups = []
    for g in body.get("groups", []):
        rollouts = []
        for r in g.get("rollouts", []):
            t = r.get("tokens")
            if isinstance(t, dict):
                r = {**r, "tokens": {k: ref(v) for k, v in t.items()}}
            rollouts.append(r)
        groups.append({**g, "rollouts": rollouts})
    text = json.dumps({**body, "groups": groups}, allow_nan=False).encode()
    return LENGTH.pack(len(text)) + text + b"".join(parts)


def bound(group: dict[str, Any]) -> int:
    """At most the bytes `group` adds to a body of several groups (its offsets may have more
    digits there: 20 bytes a reference allow for any)."""
    one = encode({"groups": [group]})
    (n,) = LENGTH.unpack_from(one)
    return len(one) + 20 * one[LENGTH.size : LENGTH.size + n].count(b'"at": [') + 2


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

"""The packed per-group score matrix stored on `Group.packed_scores` (layout in Group's docstring).

Pure numpy: the ingestion service packs, the run reader (webapp/diagnostics/services.py) unpacks.
Records are fixed-width for a given K, so the blobs of many groups that share a header concatenate
into one buffer that numpy reads in place.
"""

from __future__ import annotations

import numpy as np


def record_dtype(k: int) -> np.dtype:
    """One rollout's record: id, length (NaN: NULL), K component values (NaN: not scored)."""
    return np.dtype([("id", "<i8"), ("length", "<f8"), ("values", "<f8", (k,))])


def header(component_ids: list[int]) -> str:
    return ",".join(str(int(c)) for c in component_ids)


def parse_header(text: str) -> list[int]:
    return [int(c) for c in text.split(",")] if text else []


def pack_groups(
    ids: np.ndarray, lengths: np.ndarray, matrix: np.ndarray, sizes: list[int]
) -> list[bytes]:
    """One blob per group for a batch whose rollouts are in group order: `sizes` rollouts each."""
    rec = np.empty(ids.size, dtype=record_dtype(matrix.shape[1]))
    rec["id"], rec["length"], rec["values"] = ids, lengths, matrix
    buf, width = rec.tobytes(), rec.dtype.itemsize
    ends = np.cumsum(sizes).tolist()
    return [buf[(end - n) * width : end * width] for n, end in zip(sizes, ends, strict=True)]


def records(buf: bytes, dtype: np.dtype) -> np.ndarray:
    """Fixed-width records read in place (a view, not a copy); ValueError if `buf` is
    not whole records."""
    if len(buf) % dtype.itemsize:
        raise ValueError(
            f"packed rows: {len(buf)} bytes is not a multiple of the {dtype.itemsize}-byte record"
        )
    return np.frombuffer(buf, dtype=dtype)


def unpack(buf: bytes, k: int) -> np.ndarray:
    """The records of one or more concatenated blobs with the same K (a view, not a copy)."""
    return records(buf, record_dtype(k))

"""The on-disk form of one rollout's token arrays (RolloutTokens.data): pure numpy and zstd, no
Django, so the bench and any reader can use it alone. A 12-byte header (magic, version, the
fields present, the token count), a size table, then one zstd frame per byte plane of each
field; floats are float16 with two mantissa bits dropped, trainer log-probs stored as their
difference from the sampler's. The layout and why: docs/tokens.md, "Module notes".
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zstandard

FIELDS = (
    "ids",
    "offsets",
    "text",
    "sampler_logprobs",
    "trainer_logprobs",
    "ref_logprobs",
    "entropy",
    "advantages",
    "loss_mask",
    "turn",
)
FLOAT_FIELDS = ("sampler_logprobs", "trainer_logprobs", "ref_logprobs", "entropy", "advantages")
INT_FIELDS = ("offsets", "turn")
TRAINER_AS_DELTA = 1 << 31
MAGIC = b"TK"
VERSION = 1
HEADER = struct.Struct("<2sBxII")
LEVEL = 1  # smaller than 3 on these planes (6.25 bytes a token against 6.27) and faster
MANTISSA_BITS = 8
_DROP = 10 - MANTISSA_BITS
_HALF, _KEEP, _EXP = 1 << (_DROP - 1), 0xFFFF >> _DROP << _DROP, 0x7C00  # float16 bit patterns
F16_MAX = 60000.0  # below float16's largest finite value (65504), so rounding never makes an inf
_CODEC = pa.Codec("zstd", compression_level=LEVEL)  # reading: any zstd frame
_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor. Writing uses zstandard rather than pyarrow's codec because it
    keeps its context: pyarrow builds one per call, ~20 us, which at 10 small planes a rollout
    cost as much as the compression itself. A compressor serves one thread at a time."""
    c = getattr(_LOCAL, "compressor", None)
    if c is None:
        c = _LOCAL.compressor = zstandard.ZstdCompressor(level=LEVEL)
    return c


@dataclass
class TokenArrays:
    """One rollout's arrays, each None when not recorded; all of length n."""

    ids: np.ndarray  # int64
    offsets: np.ndarray | None = None  # int64, char offset of each token
    text: list[str] | None = None
    sampler_logprobs: np.ndarray | None = None  # float64/32 on the way in, float32 read back
    trainer_logprobs: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None
    entropy: np.ndarray | None = None
    advantages: np.ndarray | None = None
    loss_mask: np.ndarray | None = None  # bool
    turn: np.ndarray | None = None  # int64

    def __len__(self) -> int:
        return int(self.ids.size)

    def present(self) -> list[str]:
        return [f for f in FIELDS if getattr(self, f) is not None]


def _planes(a: np.ndarray) -> list[np.ndarray]:
    """Byte planes of a fixed-width array: byte 0 of every element, then byte 1, ... (rows of one
    transposed copy: a strided copy per plane costs several times more)."""
    m = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, a.itemsize)
    return list(np.ascontiguousarray(m.T))


def _unplanes(streams: list[bytes], n: int, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    m = np.empty((n, width), dtype=np.uint8)
    for i in range(width):
        m[:, i] = np.frombuffer(streams.pop(0), dtype=np.uint8, count=n)
    return m.view(dtype).reshape(n)


def _f16(a: np.ndarray) -> np.ndarray:
    """float16 of `a`, rounded to the nearest value with MANTISSA_BITS of mantissa (on the bit
    pattern: sign and magnitude, so a carry into the exponent is the correct rounding)."""
    with np.errstate(over="ignore"):
        bits = a.astype("<f2").view("<u2")
    # uint16 arithmetic: a finite float16 (at most 0xFBFF) plus the half step cannot wrap
    bits = (bits + np.uint16(_HALF)) & np.uint16(_KEEP)
    if ((bits & _EXP) == _EXP).any():  # past float16's range, or rounded into inf: clip first
        return _f16(np.clip(a, -F16_MAX, F16_MAX))
    return bits.view("<f2")


def _diff(a: np.ndarray) -> np.ndarray:
    return np.diff(a.astype(np.int64), prepend=0).astype("<i4")


def _streams(t: TokenArrays) -> tuple[int, list]:
    n, flags, parts = len(t), 0, []
    for i, name in enumerate(FIELDS):
        v = getattr(t, name)
        if v is None:
            continue
        flags |= 1 << i
        if name == "ids":
            parts += _planes(np.asarray(v, dtype="<u4"))
        elif name in INT_FIELDS:
            parts += _planes(_diff(np.asarray(v)))
        elif name == "text":
            raw = [s.encode("utf-8") for s in v]
            parts += _planes(np.fromiter(map(len, raw), dtype="<u4", count=n))
            parts.append(b"".join(raw))
        elif name == "loss_mask":
            parts.append(np.packbits(np.asarray(v, dtype=bool)).tobytes())
        else:
            a = np.asarray(v, dtype=v.dtype if v.dtype == np.float32 else np.float64)
            if name == "trainer_logprobs" and t.sampler_logprobs is not None:
                a = a - t.sampler_logprobs  # float32 when both are: float16 rounds it anyway
                flags |= TRAINER_AS_DELTA
            parts += _planes(_f16(a))
    return flags, parts


def encode(t: TokenArrays) -> bytes:
    """The blob of `t` (validated: values in range, every array of length n)."""
    flags, streams = _streams(t)
    compress = _compressor().compress
    frames = [compress(s) if len(s) else b"" for s in streams]
    sizes = np.array([(len(s), len(f)) for s, f in zip(streams, frames, strict=True)], dtype="<u4")
    return HEADER.pack(MAGIC, VERSION, flags, len(t)) + sizes.tobytes() + b"".join(frames)


def _read_streams(blob: bytes, count: int) -> list[bytes]:
    sizes = np.frombuffer(blob, dtype="<u4", count=2 * count, offset=HEADER.size).reshape(count, 2)
    pos, out = HEADER.size + sizes.nbytes, []
    for raw, packed in sizes.tolist():
        frame = blob[pos : pos + packed]
        out.append(_CODEC.decompress(frame, raw, asbytes=True) if raw else b"")
        pos += packed
    return out


def _count(flags: int) -> int:
    """How many streams a blob with these fields holds (see _streams)."""
    per = {"ids": 4, "offsets": 4, "turn": 4, "text": 5, "loss_mask": 1}
    return sum(per.get(f, 2) for i, f in enumerate(FIELDS) if flags & (1 << i))


def decode(blob: bytes) -> TokenArrays:
    """The arrays of a blob written by `encode`; floats as float32, ints as int64."""
    magic, version, flags, n = HEADER.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a token blob (magic {magic!r}, version {version})")
    streams = _read_streams(blob, _count(flags))
    out: dict[str, object] = {}
    for i, name in enumerate(FIELDS):
        if not flags & (1 << i):
            continue
        if name == "ids":
            out[name] = _unplanes(streams, n, "<u4").astype(np.int64)
        elif name in INT_FIELDS:
            out[name] = np.cumsum(_unplanes(streams, n, "<i4"), dtype=np.int64)
        elif name == "text":
            lengths = _unplanes(streams, n, "<u4").tolist()
            raw, pos, words = streams.pop(0), 0, []
            for k in lengths:
                words.append(raw[pos : pos + k].decode("utf-8"))
                pos += k
            out[name] = words
        elif name == "loss_mask":
            bits = np.frombuffer(streams.pop(0), dtype=np.uint8)
            out[name] = np.unpackbits(bits, count=n).astype(bool)
        else:
            out[name] = _unplanes(streams, n, "<f2").astype(np.float32)
    if flags & TRAINER_AS_DELTA:
        out["trainer_logprobs"] = out["trainer_logprobs"] + out["sampler_logprobs"]
    return TokenArrays(**out)  # type: ignore[arg-type]

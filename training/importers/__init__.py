"""Readers for other trainers' rollout dumps, yielding groups in the web app's ingestion format.

`open_reader(format, path, components=..., group_size=...)` picks the reader; see each module's
docstring for the source format and how its groups are reconstructed. Plain Python, no Django.
"""

from __future__ import annotations

from pathlib import Path

from .art import ARTReader
from .base import (
    BadRecord,
    GroupItem,
    Item,
    MetricsItem,
    Reader,
    ReaderError,
    RecordError,
    SettingsItem,
    SkippedGroup,
)
from .byoo import ByooReader
from .jsonl import JsonlReader
from .prime_rl import PrimeRLReader
from .trl import TRLReader
from .verifiers import VerifiersReader
from .verl import VerlReader

READERS: dict[str, type[Reader]] = {
    "jsonl": JsonlReader,
    "trl": TRLReader,
    "verl": VerlReader,
    "prime-rl": PrimeRLReader,
    "byoo": ByooReader,
    "verifiers": VerifiersReader,
    "art": ARTReader,
}


def open_reader(
    fmt: str,
    path: str | Path,
    *,
    components: list[str] | None = None,
    group_size: int | None = None,
    weights: dict[str, float] | None = None,
    scale_rewards: str | None = None,
) -> Reader:
    if fmt not in READERS:
        raise ReaderError(f"format: must be one of {', '.join(READERS)}, got {fmt!r}")
    return READERS[fmt](
        Path(path),
        components=components,
        group_size=group_size,
        weights=weights,
        scale_rewards=scale_rewards,
    )


__all__ = [
    "READERS",
    "BadRecord",
    "GroupItem",
    "Item",
    "MetricsItem",
    "Reader",
    "ReaderError",
    "RecordError",
    "SettingsItem",
    "SkippedGroup",
    "open_reader",
]

"""Fixtures for the training tests: one tiny model per session, built offline from
the diagram text."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in these tests may download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from training.tiny import ensure_tiny_model

    return str(ensure_tiny_model("diagram", tmp_path_factory.mktemp("tiny-cache")))

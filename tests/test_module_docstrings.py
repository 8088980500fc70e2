"""Every module of webapp/, training/, workers/ and bench/ opens with a docstring of at most 150
words: what a newcomer needs to use or change it. Longer explanations live in docs/ (the "Module
notes" section of the matching page), where they can be as long as they need."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("webapp", "training", "workers", "bench")
MAX_WORDS = 150
# Django wiring, which says nothing a newcomer needs beyond its name.
WIRING = ("__init__.py", "apps.py", "admin.py", "wsgi.py", "asgi.py")
# Being rewritten on other branches right now (issue 26): checked once those land.
PENDING: tuple[str, ...] = ()  # modules being rewritten elsewhere, skipped until they land


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if "/migrations/" in name or name.startswith(PENDING):
                continue
            found.append(name)
    return found


def docstring(name: str) -> str | None:
    return ast.get_docstring(ast.parse((ROOT / name).read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", modules())
def test_it_opens_every_module_with_a_short_docstring(name):
    text = docstring(name)
    if text is None:
        assert name.endswith(WIRING) or name.endswith("urls.py"), f"{name}: no module docstring"
        return
    words = len(text.split())
    assert words <= MAX_WORDS, f"{name}: {words} words; move the essay to docs/ ('Module notes')"


def test_it_checks_the_modules_it_means_to():
    names = modules()
    assert "training/stats.py" in names and "bench/harness.py" in names
    assert "training/environments/diagram/rewards.py" in names  # packages are checked too
    assert len(names) > 100

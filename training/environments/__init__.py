"""Environment registry: name -> a factory taking no arguments (an Environment subclass, or a
function that imports it). The built-in factories import lazily, so listing names never pulls in
an environment's dependencies.

An environment is a package implementing `base.Environment` (docs/architecture.md, "Adding an
environment"): a built-in one is one entry below; a package outside this tree calls
`register_environment` at import.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Environment


def _diagram() -> Environment:
    from .diagram import DiagramEnvironment

    return DiagramEnvironment()


def _ask_to_code() -> Environment:
    from .ask_to_code import AskToCodeEnv

    return AskToCodeEnv()


_REGISTRY: dict[str, Callable[[], Environment]] = {
    "diagram": _diagram,
    "ask_to_code": _ask_to_code,
}


def register_environment(name: str, factory: Callable[[], Environment]) -> None:
    """Register (or replace) the environment `name`: an Environment subclass whose constructor
    takes no arguments, or a function returning a fresh instance."""
    _REGISTRY[name] = factory


def unregister_environment(name: str) -> None:
    _REGISTRY.pop(name, None)


def available_environments() -> list[str]:
    return sorted(_REGISTRY)


def get_environment(name: str) -> Environment:
    """A fresh instance of the environment registered under `name`; KeyError when unknown."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_environments())
        raise KeyError(f"unknown environment {name!r}; known: {known}") from None
    return factory()

"""Environment registry. Imports are lazy so listing names never pulls in an environment's deps.

Add an environment by mapping its name to "module:attribute" (a class or factory taking no args;
a module name starting with "." is relative to this package).
"""

from __future__ import annotations

import importlib

from .base import Environment

_REGISTRY: dict[str, str] = {
    "diagram": ".diagram:DiagramEnvironment",  # relative to this package (installed, it is
    "ask_to_code": ".ask_to_code:AskToCodeEnv",  # reward_debugger.environments)
}


def available_environments() -> list[str]:
    return sorted(_REGISTRY)


def get_environment(name: str) -> Environment:
    """A fresh instance of the environment registered under `name`; KeyError when unknown."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_environments())
        raise KeyError(f"unknown environment {name!r}; known: {known}") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name, __package__), attr)()

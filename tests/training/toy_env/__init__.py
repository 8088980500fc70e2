"""A toy environment, written the way docs/architecture.md ("Adding an environment") says: one
package filling in `training.environments.base.Environment`. The policy must shout a word back in
capitals. tests/training/test_toy_environment.py registers it and runs it through the generic
paths (prompts, scoring, demo data, the scripted teacher, reward versions and replays)."""

import contextlib
from collections.abc import Iterator

from training import reward_versions as rv
from training.environments import register_environment, unregister_environment

from .environment import ToyEnvironment, ToyPolicy
from .rewards import brevity, shouted

__all__ = ["ToyEnvironment", "ToyPolicy", "brevity", "registered", "shouted"]


@contextlib.contextmanager
def registered() -> Iterator[ToyEnvironment]:
    """The toy registered as "toy" for the block, then forgotten (registry and reward versions)."""
    register_environment("toy", ToyEnvironment)
    try:
        yield ToyEnvironment()
    finally:
        unregister_environment("toy")
        for key in [k for k in rv._REGISTRY if k[0] == "toy"]:
            rv._REGISTRY.pop(key)
        rv._loaded_environments.discard("toy")
        rv._rebuilder.cache_clear()

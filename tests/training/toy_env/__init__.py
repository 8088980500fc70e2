"""A toy environment, written the way docs/architecture.md ("Adding an environment") says: one
package filling in `training.environments.base.Environment`. The policy must shout a word back in
capitals. tests/training/test_toy_environment.py registers it and runs it through the generic
paths (prompts, scoring, demo data, the scripted teacher, reward versions and replays)."""

from .environment import ToyEnvironment, ToyPolicy
from .rewards import brevity, shouted

__all__ = ["ToyEnvironment", "ToyPolicy", "brevity", "shouted"]

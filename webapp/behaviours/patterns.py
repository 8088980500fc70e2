"""A behaviour's regular expression, checked on the candidates its query finds, bounded: the `regex`
module's per-call timeout stops a catastrophic backtrack on one rollout, and a pattern that times
out on MAX_TIMEOUTS rollouts of one computation is refused for good (the behaviour shows why)
instead of costing every step its timeouts again. Chosen over google-re2 (no backtracking at all):
`regex` is already installed (transformers depends on it) and keeps Python's syntax, lookarounds
and backreferences included; the timeout bounds what re2 would exclude."""

from __future__ import annotations

import regex

from webapp.errors import FieldError

MAX_CHARS = 500
TIMEOUT_S = 0.05  # per rollout (a ~10 KB document takes microseconds with a sane pattern)
MAX_TIMEOUTS = 5  # per computation: past this the pattern is refused (PatternTimeout)


class PatternTimeout(Exception):
    """The pattern backtracked past its time limit on too many rollouts."""


def compile_pattern(raw: str) -> regex.Pattern | None:
    """The compiled pattern ("" -> None); FieldError naming `pattern` when it is not one."""
    if not raw:
        return None
    if len(raw) > MAX_CHARS:
        raise FieldError("pattern", f"must be at most {MAX_CHARS} characters")
    try:
        return regex.compile(raw, regex.IGNORECASE | regex.VERSION0)
    except (regex.error, OverflowError, RecursionError) as e:
        raise FieldError("pattern", f"is not a regular expression: {e}") from None


class Checker:
    """Checks documents against a pattern, counting timeouts (each one counts as no match)."""

    def __init__(self, pattern: regex.Pattern, max_timeouts: int = MAX_TIMEOUTS) -> None:
        self.pattern, self.max_timeouts, self.timeouts = pattern, max_timeouts, 0

    def __call__(self, doc: str) -> bool:
        try:
            return self.pattern.search(doc, timeout=TIMEOUT_S) is not None
        except TimeoutError:
            self.timeouts += 1
            if self.timeouts >= self.max_timeouts:
                raise PatternTimeout(
                    f"the pattern took more than {TIMEOUT_S} s on {self.timeouts} rollouts "
                    "(catastrophic backtracking?): simplify it, e.g. no nested repetition like "
                    "(a+)+"
                ) from None
            return False

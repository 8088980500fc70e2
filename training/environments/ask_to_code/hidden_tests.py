"""The hidden unit tests of a task, run on submitted code in `training.sandbox`, at most once per
(task, code) and process; infrastructure failures are not cached (retried next time)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from ...sandbox import SandboxResult, run_tests
from .tasks import Task

TEST_TIMEOUT_S = 2.0
CACHE_SIZE = (
    4096  # (task, code) -> SandboxResult; a GRPO step re-scores the same codes per component
)

_cache: OrderedDict[tuple[str, str], SandboxResult] = OrderedDict()
INFRASTRUCTURE_ERRORS = ("sandbox setup failed", "sandbox unavailable", "sandbox error")
_cache_lock = threading.Lock()


def hidden_test_result(task: Task, code: str) -> SandboxResult:
    """Run the task's hidden tests on `code` in the sandbox, at most once per (task, code)."""
    key = (task.key, hashlib.sha256(code.encode()).hexdigest())
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    result = run_tests(code, task.func_name, task.tests, timeout_s=TEST_TIMEOUT_S)
    if result.error and result.error.startswith(INFRASTRUCTURE_ERRORS):
        return (
            result  # maybe our infrastructure failed, not the code: scored 0 now, retried next time
        )
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return result


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def summarise(result: SandboxResult) -> str:
    """The unit_tests tool message: counts and the error kind only, never the expected values (the
    transcript may be exported as training data)."""
    text = f"{result.passed}/{result.total} hidden tests passed"
    if result.error:
        text += f"; {result.error[:200]}"
    return text

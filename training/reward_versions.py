"""Versioned reward components: what a replay re-scores stored transcripts with.

A component version is an importable `module:function` deployed with the workers (never uploaded
from a browser), its JSON keyword parameters and a hash of the function's source, so a stored
replay says exactly which code produced its numbers. `make_version` builds one; environments
declare their named variants. Examples and rules: docs/replay.md, "Component versions" and
"Module notes".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .environments.base import Prompt, Score

DEFAULT_TIMEOUT_S = 10.0  # per rollout: the sandboxed ask_to_code tests take up to ~2.5 s
MAX_REASON = 500
MAX_PARAMS_CHARS = 10_000  # parameters are thresholds and small lists, not data


class VersionError(ValueError):
    """Bad version input; `field` names what is wrong (target, params.x, component...)."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}")


@dataclass(frozen=True)
class ComponentVersion:
    environment: str
    component: str  # the stored component whose values this version replaces in a replay
    target: str  # "module:function"
    params: dict[str, Any] = field(default_factory=dict)
    source_hash: str = ""
    name: str = ""  # e.g. "semantic_coverage@strict"; "" for the component as deployed

    @property
    def label(self) -> str:
        return self.name or self.component

    def as_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "component": self.component,
            "target": self.target,
            "params": self.params,
            "source_hash": self.source_hash,
            "name": self.name,
        }


@dataclass(frozen=True)
class Scored:
    """One replayed value. `ok=False`: the function failed on this rollout; `reason` says how."""

    value: float | None
    reason: str
    ok: bool


# ---------------------------------------------------------------------------------------- resolving


def resolve(target: str) -> Callable[..., Any]:
    """The function named by "module:function" (dotted attribute paths allowed after the colon)."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise VersionError("target", "must be 'module:function'")
    module_name, attr = target.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # a broken user module raises anything at import
        raise VersionError(
            "target",
            f"module {module_name[:100]!r} does not import: {type(e).__name__}: {str(e)[:200]}",
        ) from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise VersionError("target", f"{module_name[:100]} has no attribute {attr[:100]!r}")
    if not callable(obj):
        raise VersionError("target", f"{target[:200]} is not callable")
    return obj


def source_hash(fn: Callable[..., Any]) -> str:
    """sha256 of the function's source (first 16 hex digits), as
    Component.source_hash computes it."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(fn)
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def target_of(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def check_params(fn: Callable[..., Any], params: Any) -> dict[str, Any]:
    """`params` as a clean dict: a JSON object whose keys are keyword parameters of `fn`."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise VersionError("params", "must be a JSON object of parameter name -> value")
    try:
        text = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError):
        raise VersionError(
            "params", "must hold only JSON values (finite numbers, strings, lists, objects)"
        ) from None
    if len(text) > MAX_PARAMS_CHARS:
        raise VersionError("params", f"longer than {MAX_PARAMS_CHARS} characters")
    sig = inspect.signature(fn)
    named = {
        n: p
        for n, p in sig.parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    for key in params:
        if key not in named or key in ("prompt", "completion"):
            have = ", ".join(n for n in named if n not in ("prompt", "completion")) or "none"
            raise VersionError(
                f"params.{str(key)[:80]}", f"not a parameter of {target_of(fn)} (it takes: {have})"
            )
        _check_type(key, params[key], named[key].default)
    return json.loads(text)


def _check_type(key: str, value: Any, default: Any) -> None:
    """A value of the default's kind: a threshold stays a number, a switch a bool, a
    name a string."""
    number = (int, float)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, number):
        ok = isinstance(value, number) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        # No default, or a list/None default: the function checks it (and fails closed if not)
        return
    if not ok:
        raise VersionError(
            f"params.{key}", f"must be a {type(default).__name__} like its default {default!r}"
        )


def make_version(
    environment: str, component: str, target: str, params: Any = None, name: str = ""
) -> ComponentVersion:
    """A checked version: the target imports and is callable, the params fit its signature."""
    if not isinstance(component, str) or not component:
        raise VersionError("component", "must be a component name")
    fn = resolve(target)
    clean = check_params(fn, params)
    return ComponentVersion(environment, component, target, clean, source_hash(fn), name)


# ----------------------------------------------------------------------------------------- registry

_REGISTRY: dict[tuple[str, str], ComponentVersion] = {}  # (environment, label) -> version
_lock = threading.Lock()
_loaded = False


def register(
    environment: str, component: str, target: str, params: Any = None, name: str = ""
) -> ComponentVersion:
    """Register a version (a user's module calls this at import). Returns
    it; re-registering replaces."""
    version = make_version(environment, component, target, params, name)
    with _lock:
        _REGISTRY[(environment, version.label)] = version
    return version


def _register_environment(env_name: str) -> None:
    from .environments import get_environment

    env = get_environment(env_name)
    for comp in env.components:
        register(env_name, comp.name, target_of(comp.fn))
    for name, (comp_name, params) in env.reward_variants().items():
        fn = next(c.fn for c in env.components if c.name == comp_name)
        register(env_name, comp_name, target_of(fn), params, name=name)


def load(extra_modules: str | None = None) -> None:
    """Register the built-in environments' components and variants, then import the user modules
    named in RD_REWARD_MODULES (or `extra_modules`). Idempotent; a module that fails to import
    raises VersionError."""
    global _loaded
    if _loaded and extra_modules is None:
        return
    from .environments import available_environments

    for env_name in available_environments():
        _register_environment(env_name)
    names = os.environ.get("RD_REWARD_MODULES", "") if extra_modules is None else extra_modules
    for module_name in filter(None, (m.strip() for m in names.split(","))):
        try:
            importlib.import_module(module_name)
        except Exception as e:
            raise VersionError(
                "RD_REWARD_MODULES", f"{module_name[:100]} does not import: {e}"
            ) from None
    _loaded = True


def registered(environment: str | None = None) -> list[ComponentVersion]:
    load()
    with _lock:
        items = list(_REGISTRY.values())
    return [v for v in items if environment is None or v.environment == environment]


def lookup(environment: str, label: str) -> ComponentVersion:
    load()
    with _lock:
        version = _REGISTRY.get((environment, label))
    if version is None:
        have = ", ".join(v.label for v in registered(environment)) or "none"
        raise VersionError(
            "version",
            f"{label[:100]!r} is not registered for {environment[:100]} (registered: {have})",
        )
    return version


def from_spec(environment: str, spec: Any, path: str = "versions[0]") -> ComponentVersion:
    """A version from user input {"version": label, "params": {...}?}: the registered target,
    with the given parameters over the registered ones. Unregistered targets are refused: only
    deployed code runs."""
    if not isinstance(spec, dict) or not isinstance(spec.get("version"), str):
        raise VersionError(path, 'must be an object {"version": registered name, "params": {...}}')
    extra = set(spec) - {"version", "params"}
    if extra:
        raise VersionError(
            f"{path}.{sorted(extra)[0][:80]}", "unknown key; expected version, params"
        )
    try:
        base = lookup(environment, spec["version"])
        params = (
            {**base.params, **(spec.get("params") or {})}
            if spec.get("params") is not None
            else base.params
        )
        name = base.name if spec.get("params") is None else f"{base.label}+params"
        return make_version(environment, base.component, base.target, params, name)
    except VersionError as e:
        raise VersionError(f"{path}.{e.field}", e.message) from None


# ------------------------------------------------------------------------------------------ scoring


class _Timeout(BaseException):
    """BaseException: a component's own `except Exception` must not swallow our deadline."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _as_value(out: Any) -> tuple[Any, str]:
    """(value, reason) from a Score, a (value, reason) pair or a bare value."""
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], str(out[1] or "")
    if hasattr(out, "value"):
        return out.value, str(getattr(out, "reason", "") or "")
    return out, ""


_handler_installed = False


@contextlib.contextmanager
def deadlines() -> Iterator[None]:
    """Install the time-limit handler once around many `score_one` calls (installing it per call
    costs about as much as a cheap component)."""
    global _handler_installed
    if _handler_installed or not _can_alarm():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    _handler_installed = True
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _handler_installed = False


def _can_alarm() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


def score_one(
    fn: Callable[..., Any],
    params: dict[str, Any],
    prompt: Prompt,
    completion: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Scored:
    """Call the component on one rollout, failing closed. The time limit interrupts the call when we
    are on the main thread (a Celery worker's task, a command); elsewhere an over-long call is still
    refused after it returns."""
    use_alarm = _can_alarm()
    own_handler = use_alarm and not _handler_installed
    t0 = time.monotonic()
    if own_handler:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
    if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        out = fn(prompt, completion, **params)
    except _Timeout:
        return Scored(None, f"failed: took longer than {timeout_s:g} s", False)
    except Exception as e:
        return Scored(
            None, f"failed: raised {type(e).__name__}: {str(e)[:200]}"[:MAX_REASON], False
        )
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if own_handler:
            signal.signal(signal.SIGALRM, previous)
    if time.monotonic() - t0 > timeout_s:
        return Scored(None, f"failed: took longer than {timeout_s:g} s", False)
    value, reason = _as_value(out)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Scored(None, f"failed: returned {type(value).__name__}, not a number", False)
    if not math.isfinite(value):
        why = f" ({reason[:200]})" if reason else ""
        return Scored(None, f"failed: returned {value}{why}"[:MAX_REASON], False)
    return Scored(float(value), reason[:MAX_REASON], True)


@functools.lru_cache(maxsize=64)
def _rebuilder(environment: str) -> Callable[[str, Any], Prompt | None] | None:
    from .environments import get_environment

    try:
        env = get_environment(environment)
    except KeyError:
        return None
    return env.stored_prompt


def prompt_for(environment: str, key: str, prompt: Any) -> Prompt | None:
    """The environment's Prompt (with its hidden spec) for a stored group, through the
    environment's `stored_prompt(key, prompt)`; None when the environment cannot rebuild it."""
    rebuild = _rebuilder(environment)
    return None if rebuild is None else rebuild(key, prompt)


def apply_versions(env: Any, versions: list[dict[str, Any]]) -> Any:
    """`env` with the given versions (ComponentVersion.as_dict() form, as a replay stores them) in
    place of its components' functions, for a training job that should optimise the replayed reward
    (grpo.main's hook). Weights, kinds and ranges stay; a version whose source changed since it was
    recorded is refused (VersionError). Each swapped function fails closed (TrainedVersion)."""
    by_name = {v["component"]: v for v in versions}
    unknown = set(by_name) - {c.name for c in env.components}
    if unknown:
        raise VersionError(
            "reward_versions", f"{sorted(unknown)[0]!r} is not a component of {env.name}"
        )
    components = []
    for comp in env.components:
        v = by_name.get(comp.name)
        if v is not None:
            fn = _registered_fn(env.name, comp.name, v)
            comp = dataclasses.replace(comp, fn=TrainedVersion(fn, v, comp.min_value))
        components.append(comp)
    env.components = components
    return env


def _registered_fn(env_name: str, component: str, v: dict[str, Any]) -> Callable[..., Any]:
    """The version's function, only if its target is registered for that component (a job config is
    JSON anyone with the trainer role can write: it must not name an arbitrary importable callable),
    with its source unchanged and its parameters fitting the signature."""
    where = f"reward_versions.{component}"
    if not any(
        r.target == v.get("target") and r.component == component for r in registered(env_name)
    ):
        raise VersionError(
            where,
            f"{str(v.get('target'))[:200]} is not a registered version of {component} "
            f"for {env_name} (register it in a module named in RD_REWARD_MODULES)",
        )
    fn = resolve(v["target"])
    if v.get("source_hash") and source_hash(fn) != v["source_hash"]:
        raise VersionError(where, f"{v['target']} changed since the version was recorded")
    try:
        check_params(fn, v.get("params"))
    except VersionError as e:
        raise VersionError(f"{where}.{e.field}", e.message) from None
    return fn


class TrainedVersion:
    """A replayed version as an environment component function, fn(prompt, completion) -> Score, for
    a trainer: it fails closed like a replay (a raise, a non-number, NaN or a time-out scores the
    component's minimum with the reason), never raising into the trainer. Picklable; its repr names
    the version, so Component.source_hash() of the swapped component is stable."""

    def __init__(self, fn: Callable[..., Any], version: dict[str, Any], fail_value: float) -> None:
        self.fn, self.params, self.fail_value = (
            fn,
            dict(version.get("params") or {}),
            float(fail_value),
        )
        params = json.dumps(self.params, sort_keys=True)
        self.label = f"{version['target']}({params})#{version.get('source_hash', '')}"

    def __call__(self, prompt: Prompt, completion: Any) -> Any:
        scored = score_one(self.fn, self.params, prompt, completion)
        return Score(scored.value if scored.ok else self.fail_value, scored.reason)

    def __repr__(self) -> str:
        return f"TrainedVersion({self.label})"

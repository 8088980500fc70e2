"""Record OpenRLHF rollouts from its custom reward-function file.

OpenRLHF writes no rollout dump, but a run with `--remote_rm_url reward_func.py` calls
`reward_func(queries, prompts, labels, **kwargs)` on every batch of samples, where `queries` are
prompt + response texts. Wrap that function in the same file:

    # reward_func.py, passed to OpenRLHF as --remote_rm_url reward_func.py
    from training.openrlhf_reward import wrap_reward_func

    def my_reward(queries, prompts, labels):
        ...
        return {"rewards": r, "scores": s, "extra_logs": {"correct": c, "format": f}}

    reward_func = wrap_reward_func(my_reward, url="http://host:8000", token="...", run="openrlhf-math")

The wrapper calls the user's function and returns its result UNCHANGED (a dict with "rewards",
"scores", "extra_logs", or a bare tensor), then hands the batch to a background thread that posts it
through `training.client.Client`. Nothing it does can raise into training or slow it down: every
error is logged, and a batch that cannot be delivered is appended to a spool JSONL file in the
HttpSink spool format, which `python -m training.sinks upload SPOOL --url URL --token KEY --run ID`
sends later.

How a batch becomes groups:
- completion = query minus its prompt prefix (the whole query when it does not start with it);
- a group is the samples of one call with identical prompt (n_samples_per_prompt samples of a prompt
  normally arrive in the same call; when they do not, each call's share is its own group);
- the aggregate reward is "rewards"; per-sample entries of "extra_logs" (length == batch size) are
  reward components, scalar ones are ignored; "scores" and the label go into the rollout's state;
- the step is `step_fn()` when given, else the call's ordinal in this process (OpenRLHF does not pass
  one); group keys carry a random per-wrapper id and the call ordinal, so workers never collide;
- advantages are not known here (OpenRLHF computes them later, per its estimator): the recorded one
  is the GRPO advantage of "rewards" within the group.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.client import ApiError, Client
from training.importers.base import component_name, fill_advantages, finite_or_none, stable_hash
from training.sinks import storable  # NUL and lone surrogates would be refused by Postgres

logger = logging.getLogger(__name__)

_STOP = object()


def _as_list(x: Any) -> list[Any] | None:
    """A tensor / array / list as a Python list (a 0-d value -> None: not per-sample)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    return list(x) if isinstance(x, (list, tuple)) else None


def _json_safe(v: Any) -> Any:
    try:
        json.dumps(v, allow_nan=False)
        return v
    except (TypeError, ValueError):
        return str(v)


def batch_to_groups(queries: list[str], prompts: list[str], labels: list[Any] | None, result: Any, *, step: int,
                    call_id: str, components: set[str] | None = None) -> list[dict[str, Any]]:
    """One reward call's samples as ingestion-format groups (see the module docstring)."""
    n = len(queries)
    if isinstance(result, dict):
        rewards = _as_list(result.get("rewards"))
        scores = _as_list(result.get("scores")) if result.get("scores") is not None else None
        extra = result.get("extra_logs") or {}
    else:
        rewards, scores, extra = _as_list(result), None, {}
    if rewards is None or len(rewards) != n:
        raise ValueError(f"rewards: expected {n} per-sample values, got {None if rewards is None else len(rewards)}")
    per_sample: dict[str, list[Any]] = {}
    for k, v in extra.items():
        values = _as_list(v)
        name = component_name(k)
        if values is not None and len(values) == n and (components is None or name in components):
            per_sample[name] = values
    groups: dict[str, dict[str, Any]] = {}
    for i, (query, prompt) in enumerate(zip(queries, prompts)):
        key = f"p-{stable_hash(prompt, 12)}-{call_id}"
        group = groups.setdefault(key, {"step": step, "key": key, "prompt": prompt, "rollouts": []})
        completion = query[len(prompt):] if query.startswith(prompt) else query
        state: dict[str, Any] = {}
        if labels is not None and i < len(labels) and labels[i] is not None:
            state["label"] = _json_safe(labels[i])
        if scores is not None and i < len(scores):
            state["score"] = finite_or_none(scores[i])
        rollout: dict[str, Any] = {
            "index": len(group["rollouts"]),
            "completion": completion,
            "reward": finite_or_none(rewards[i]),
            "rewards": {name: finite_or_none(values[i]) for name, values in per_sample.items()},
        }
        if state:
            rollout["state"] = state
        group["rollouts"].append(rollout)
    for group in groups.values():
        fill_advantages(group["rollouts"])
    return list(groups.values())


class RewardRecorder:
    """The state behind a wrapped reward function: the client, the run, the upload thread, the spool."""

    def __init__(self, client: Any, run: int | str, *, environment: str | None = None,
                 spool_path: str | os.PathLike | None = None, step_fn: Callable[[], int] | None = None,
                 background: bool = True) -> None:
        self.client = client
        self.run = run
        self.run_id: int | None = run if isinstance(run, int) else None
        self.environment = environment
        self.step_fn = step_fn
        self.spool_path = Path(spool_path or f"openrlhf-spool-{os.getpid()}.jsonl")
        self.components: set[str] | None = None  # known when this recorder created the run
        self.calls = itertools.count()
        # In every group key: two wrappers (Ray actors, restarts, two reward files) never produce the
        # same (step, key), which ingestion would silently skip as "already stored".
        self.instance = uuid.uuid4().hex[:10]
        self.sent = 0  # groups delivered
        self.spooled = 0  # groups written to the spool
        self._lock = threading.Lock()
        self._queue: queue.Queue | None = queue.Queue(maxsize=1000) if background else None
        if self._queue is not None:
            self._thread = threading.Thread(target=self._worker, name="openrlhf-recorder", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def record(self, queries: list[str], prompts: list[str], labels: list[Any] | None, result: Any) -> None:
        """Build and hand over the batch. Never raises."""
        try:
            ordinal = next(self.calls)
            step = int(self.step_fn()) if self.step_fn is not None else ordinal
            groups = batch_to_groups(list(queries), list(prompts), labels, result, step=step,
                                     call_id=f"{self.instance}.{ordinal}")
        except Exception:  # noqa: BLE001 - a recording bug must never stop training
            logger.exception("openrlhf recorder: could not read this batch; not recorded")
            return
        if self._queue is None:
            self._deliver(groups)
            return
        try:
            self._queue.put_nowait(groups)
        except queue.Full:  # the server is far behind: spool rather than block the trainer
            self._spool(groups)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every batch handed over so far is delivered or spooled."""
        if self._queue is not None:
            done = threading.Event()
            self._queue.put(done)
            done.wait(timeout)

    def close(self) -> None:
        if self._queue is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=60)

    def _worker(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            self._deliver(item)

    def _deliver(self, groups: list[dict[str, Any]]) -> None:
        try:
            run_id = self._resolve_run(groups)
            if self.components is not None:
                _unknown_to_state(groups, self.components)
            self.client.post_groups(run_id, storable(groups))
            self.sent += len(groups)
        except ApiError as e:
            logger.error("openrlhf recorder: upload failed (%s); spooled to %s", e, self.spool_path)
            self._spool(groups)
        except Exception:  # noqa: BLE001
            logger.exception("openrlhf recorder: upload failed; spooled to %s", self.spool_path)
            self._spool(groups)

    def _resolve_run(self, groups: list[dict[str, Any]]) -> int:
        if self.run_id is not None:
            return self.run_id
        found = self.client.find_run(str(self.run))
        if found is not None:
            self.run_id = int(found["id"])
            return self.run_id
        names = sorted({n for g in groups for r in g["rollouts"] for n in r["rewards"]})
        self.run_id = self.client.create_run(str(self.run), environment=self.environment or str(self.run),
                                             components=names, config={"source": "openrlhf reward wrapper"})
        self.components = set(names)
        return self.run_id

    def _spool(self, groups: list[dict[str, Any]]) -> None:
        line = json.dumps({"kind": "groups", "payload": {"groups": storable(groups)}}) + "\n"
        try:
            with self._lock:
                self.spool_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.spool_path, "a", encoding="utf-8") as f:
                    f.write(line)
            self.spooled += len(groups)
        except OSError:  # a full disk must not stop training either
            logger.exception("openrlhf recorder: could not spool %d groups", len(groups))


def _unknown_to_state(groups: list[dict[str, Any]], known: set[str]) -> None:
    """Components that appear after the run was created are not in its environment (the API would
    refuse the batch): keep their values in the rollout's state instead."""
    for g in groups:
        for r in g["rollouts"]:
            extra = {k: r["rewards"].pop(k) for k in list(r["rewards"]) if k not in known}
            if extra:
                r.setdefault("state", {})["extra_logs"] = extra


def wrap_reward_func(reward_func: Callable[..., Any], url: str | None = None, token: str | None = None,
                     run: int | str = "openrlhf", *, client: Any = None, environment: str | None = None,
                     spool_path: str | os.PathLike | None = None, step_fn: Callable[[], int] | None = None,
                     background: bool = True, retries: int = 2, timeout: float = 10.0) -> Callable[..., Any]:
    """Return `reward_func` with recording: same signature, same result. `run` is a run id, or a
    name (found, or created with the components of the first batch). `client` replaces the HTTP
    client (anything with find_run / create_run / post_groups)."""
    if client is None:
        if not url or not token:
            raise ValueError("url and token are required (or pass a client)")
        client = Client(url, token, timeout=timeout, retries=retries)
    recorder = RewardRecorder(client, run, environment=environment, spool_path=spool_path, step_fn=step_fn,
                              background=background)

    @functools.wraps(reward_func)
    def wrapped(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> Any:
        result = reward_func(queries, prompts, labels, **kwargs)
        recorder.record(queries, prompts, labels, result)
        return result

    wrapped.recorder = recorder  # type: ignore[attr-defined]  # flush()/close() and counters, for tests and scripts
    return wrapped

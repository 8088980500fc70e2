"""Record OpenRLHF rollouts from its custom reward-function file.

OpenRLHF writes no rollout dump, but a run with `--remote_rm_url reward_func.py` loads `reward_func`
from that file and calls it with `(queries, prompts, labels)`, where `queries` are prompt + response
texts. Wrap that function in the same file:

    # reward_func.py, passed to OpenRLHF as --remote_rm_url reward_func.py
    from training.openrlhf_reward import wrap_reward_func

    def my_reward(queries, prompts, labels):
        ...
        return {"rewards": r, "scores": s, "extra_logs": {"correct": c, "format": f}}

    reward_func = wrap_reward_func(
        my_reward, url="http://host:8000", token="...", run="openrlhf-math",
        n_samples_per_prompt=8,  # the run's --n_samples_per_prompt
    )

The two ways OpenRLHF calls it (read from its published code):

- since 0.9.1 (`openrlhf/utils/agent.py`, SingleTurnAgentExecutor): once per sample,
  `reward_func([query], [prompt], [label])`, from `asyncio.to_thread`, concurrently, in each vLLM
  engine's process. Every sample of a prompt goes to the same engine (`generate_responses(prompt,
  num_samples=n_samples_per_prompt)`), so each process sees whole groups, sample by sample;
- up to 0.9.0 (`openrlhf/utils/remote_rm_utils.py`, RemoteRewardModel): `ray.remote(reward_func)` on
  chunks of `micro_rollout_batch_size` samples, where a prompt's samples are consecutive. Ray
  pickles the function into its worker processes.

The wrapper is a plain function (Ray's `ray.remote` takes functions and classes, not callable
objects) whose only state is a picklable `RecordedRewardFunc`: its HTTP client, lock, queue and
upload thread are created on the first call in the process that calls it, and left out when it is
pickled (Ray pickles the function by value with cloudpickle). `wrapped.recorded.recorder` is that
process's recorder. It calls the user's function and returns the result UNCHANGED; nothing it does
raises into training or blocks it. Every error is logged; a batch that cannot be delivered goes to a
spool JSONL file in the HttpSink spool format (`python -m training.sinks upload SPOOL --url URL
--token KEY --run ID`).

How samples become groups:
- samples are buffered by prompt; `n_samples_per_prompt` of them make a group, posted when complete
  (a prompt drawn twice makes two groups); what is still incomplete after `straggler_timeout`
  seconds (a filtered or failed sample) is posted as a smaller group. Without
  `n_samples_per_prompt`, a batch call's samples of a prompt are one group and per-sample calls are
  grouped by the timeout alone;
- completion = query minus its prompt prefix (the whole query when it does not start with it);
- the aggregate reward is "rewards"; per-sample entries of "extra_logs" are reward components,
  scalar ones are ignored; "scores" and the label go into the rollout's state;
- the step: OpenRLHF passes none (only queries, prompts, labels). It is `step_fn()` when given (e.g.
  read from a file your launcher updates); otherwise the generation phase: OpenRLHF generates a
  whole rollout batch, then trains while the reward function sits idle, so a call that comes
  `step_gap` seconds after the previous one starts the next step (1, 2, ...). With asynchronous
  training (`--async_train`) generation overlaps training: give `step_fn`;
- the recorded advantage is OpenRLHF's `group_norm` estimate, (r - mean) / (std + 1e-9) within the
  group (its other estimators differ; the rewards and components are exact whatever the estimator);
- every process naming one run lands in one run: the run is got-or-created by name on the server,
  atomically, and group keys carry a per-process id, so processes never collide.
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
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.client import ApiError, Client
from training.importers.base import component_name, fill_advantages, finite_or_none, stable_hash
from training.sinks import storable  # NUL and lone surrogates would be refused by Postgres

logger = logging.getLogger(__name__)

OPENRLHF_EPS = (
    1e-9  # group_norm: (r - mean) / (std + 1e-9), openrlhf/trainer/ppo_utils/experience_maker.py
)
_STOP = object()
_CREATE = threading.Lock()  # module-level: made on import in each process, never pickled


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


def batch_to_samples(
    queries: list[str], prompts: list[str], labels: list[Any] | None, result: Any
) -> list[tuple[str, dict[str, Any]]]:
    """One reward call's samples as (prompt, rollout without index) pairs."""
    n = len(queries)
    if isinstance(result, dict):
        rewards = _as_list(result.get("rewards"))
        scores = _as_list(result.get("scores")) if result.get("scores") is not None else None
        extra = result.get("extra_logs") or {}
    else:
        rewards, scores, extra = _as_list(result), None, {}
    if rewards is None or len(rewards) != n:
        raise ValueError(
            f"rewards: expected {n} per-sample values, got "
            f"{None if rewards is None else len(rewards)}"
        )
    per_sample: dict[str, list[Any]] = {}
    for k, v in extra.items():
        values = _as_list(v)
        if values is not None and len(values) == n:
            per_sample[component_name(k)] = values
    out = []
    for i, (query, prompt) in enumerate(zip(queries, prompts, strict=True)):
        state: dict[str, Any] = {}
        if labels is not None and i < len(labels) and labels[i] is not None:
            state["label"] = _json_safe(labels[i])
        if scores is not None and i < len(scores):
            state["score"] = finite_or_none(scores[i])
        rollout: dict[str, Any] = {
            "completion": query[len(prompt) :] if query.startswith(prompt) else query,
            "reward": finite_or_none(rewards[i]),
            "rewards": {name: finite_or_none(values[i]) for name, values in per_sample.items()},
        }
        if state:
            rollout["state"] = state
        out.append((prompt, rollout))
    return out


def make_group(
    prompt: str, rollouts: list[dict[str, Any]], *, step: int, key: str
) -> dict[str, Any]:
    group = {
        "step": step,
        "key": key,
        "prompt": prompt,
        "rollouts": [{"index": i, **r} for i, r in enumerate(rollouts)],
    }
    fill_advantages(group["rollouts"], eps=OPENRLHF_EPS)
    return group


def batch_to_groups(
    queries: list[str],
    prompts: list[str],
    labels: list[Any] | None,
    result: Any,
    *,
    step: int,
    call_id: str,
) -> list[dict[str, Any]]:
    """One batch call's samples as groups, one per prompt (no buffering across calls)."""
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for prompt, rollout in batch_to_samples(queries, prompts, labels, result):
        by_prompt.setdefault(prompt, []).append(rollout)
    return [
        make_group(p, rs, step=step, key=f"p-{stable_hash(p, 12)}-{call_id}")
        for p, rs in by_prompt.items()
    ]


class _Pending:
    """A group being assembled: the step of its first sample, when that arrived, the
    rollouts so far."""

    def __init__(self, step: int, since: float) -> None:
        self.step = step
        self.since = since
        self.rollouts: list[dict[str, Any]] = []


class RewardRecorder:
    """The per-process state behind a wrapped reward function: buffers, client, run,
    upload thread, spool."""

    def __init__(
        self,
        client: Any,
        run: int | str,
        *,
        environment: str | None = None,
        spool_path: str | os.PathLike | None = None,
        step_fn: Callable[[], int] | None = None,
        background: bool = True,
        n_samples_per_prompt: int | None = None,
        straggler_timeout: float = 120.0,
        step_gap: float = 20.0,
    ) -> None:
        self.client = client
        self.run = run
        self.run_id: int | None = run if isinstance(run, int) else None
        self.environment = environment
        self.step_fn = step_fn
        self.n = n_samples_per_prompt
        self.straggler_timeout = straggler_timeout
        self.step_gap = step_gap
        self.spool_path = Path(spool_path or f"openrlhf-spool-{os.getpid()}.jsonl")
        # In every group key: two processes (engines, Ray workers, restarts) never produce the same
        # (step, key), which ingestion would silently skip as "already stored".
        self.instance = uuid.uuid4().hex[:10]
        self._groups = itertools.count()
        self.sent = 0  # groups delivered
        self.spooled = 0  # groups written to the spool
        self.step = 0  # the generation phase (step_gap rule); 0 before the first call
        self._last_call: float | None = None
        self._components: set[str] = set()  # components the run's environment is known to have
        self._pending: dict[str, list[_Pending]] = {}
        self._lock = threading.Lock()  # calls arrive concurrently (OpenRLHF's asyncio.to_thread)
        self._spool_lock = threading.Lock()
        self._queue: queue.Queue | None = queue.Queue(maxsize=1000) if background else None
        if self._queue is not None:
            self._thread = threading.Thread(
                target=self._worker, name="openrlhf-recorder", daemon=True
            )
            self._thread.start()
            atexit.register(self.close)

    # ---- assembling groups

    def record(
        self, queries: list[str], prompts: list[str], labels: list[Any] | None, result: Any
    ) -> None:
        """Buffer the call's samples and hand over every group that is complete. Never raises."""
        try:
            samples = batch_to_samples(list(queries), list(prompts), labels, result)
            now = time.monotonic()
            with self._lock:
                step = self._current_step(now)
                if (
                    self.n is None and len(samples) > 1
                ):  # a batch call, group size unknown: the call's share
                    ready = self._call_groups(samples, step)
                else:
                    ready = self._assemble(samples, step, now) + self._stale(now)
        except Exception:  # noqa: BLE001 - a recording bug must never stop training
            logger.exception("openrlhf recorder: could not read this batch; not recorded")
            return
        if ready:
            self._hand_over(ready)

    def _current_step(self, now: float) -> int:
        if self.step_fn is not None:
            return int(self.step_fn())
        if self._last_call is None or now - self._last_call > self.step_gap:
            self.step += (
                1  # the reward function was idle: OpenRLHF trained, this is the next rollout batch
            )
        self._last_call = now
        return self.step

    def _assemble(
        self, samples: list[tuple[str, dict[str, Any]]], step: int, now: float
    ) -> list[dict[str, Any]]:
        ready = []
        for prompt, rollout in samples:
            open_groups = self._pending.setdefault(prompt, [])
            if not open_groups or (self.n is not None and len(open_groups[-1].rollouts) >= self.n):
                open_groups.append(_Pending(step, now))
            pending = open_groups[-1]
            pending.rollouts.append(rollout)
            if self.n is not None and len(pending.rollouts) == self.n:
                open_groups.remove(pending)
                ready.append(self._group(prompt, pending))
            if not open_groups:
                del self._pending[prompt]
        return ready

    def _stale(self, now: float, everything: bool = False) -> list[dict[str, Any]]:
        """Groups still incomplete after straggler_timeout (all of them when `everything`): posted
        as they are."""
        ready = []
        for prompt in list(self._pending):
            keep = []
            for pending in self._pending[prompt]:
                if everything or now - pending.since >= self.straggler_timeout:
                    ready.append(self._group(prompt, pending))
                else:
                    keep.append(pending)
            if keep:
                self._pending[prompt] = keep
            else:
                del self._pending[prompt]
        return ready

    def _call_groups(
        self, samples: list[tuple[str, dict[str, Any]]], step: int
    ) -> list[dict[str, Any]]:
        by_prompt: dict[str, _Pending] = {}
        for prompt, rollout in samples:
            by_prompt.setdefault(prompt, _Pending(step, 0.0)).rollouts.append(rollout)
        return [self._group(p, pending) for p, pending in by_prompt.items()]

    def _group(self, prompt: str, pending: _Pending) -> dict[str, Any]:
        key = f"p-{stable_hash(prompt, 12)}-{self.instance}.{next(self._groups)}"
        return make_group(prompt, pending.rollouts, step=pending.step, key=key)

    # ---- delivery

    def _hand_over(self, groups: list[dict[str, Any]]) -> None:
        if self._queue is None:
            self._deliver(groups)
            return
        try:
            self._queue.put_nowait(groups)
        except queue.Full:  # the server is far behind: spool rather than block the trainer
            self._spool(groups)

    def flush(self, timeout: float | None = None, *, partial: bool = False) -> None:
        """Wait until every group handed over so far is delivered or spooled; `partial` also posts
        the groups still being assembled (end of training)."""
        if partial:
            with self._lock:
                ready = self._stale(time.monotonic(), everything=True)
            if ready:
                self._hand_over(ready)
        if self._queue is not None and self._thread.is_alive():  # nobody would answer otherwise
            done = threading.Event()
            self._queue.put(done)
            done.wait(timeout)

    def close(self) -> None:
        """Post what is left and stop the upload thread; later calls deliver in the caller's thread.
        Idempotent: a recorder closed by its owner is not flushed again (and waited on) at exit."""
        if self._queue is None:
            return
        self.flush(timeout=60, partial=True)
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=60)
        self._queue = None
        atexit.unregister(self.close)

    def _worker(self) -> None:
        q = self._queue  # its own reference: close() drops the recorder's once the thread stops
        assert q is not None
        while True:
            try:
                item = q.get(timeout=min(5.0, self.straggler_timeout))
            except queue.Empty:
                with self._lock:  # no calls for a while: stragglers must not wait for the next one
                    item = self._stale(time.monotonic())
                if not item:
                    continue
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            self._deliver(item)

    def _deliver(self, groups: list[dict[str, Any]]) -> None:
        try:
            run_id = self._resolve_run(groups)
            self.client.post_groups(run_id, storable(groups))
            self.sent += len(groups)
        except ApiError as e:
            logger.error("openrlhf recorder: upload failed (%s); spooled to %s", e, self.spool_path)
            self._spool(groups)
        except Exception:  # noqa: BLE001
            logger.exception("openrlhf recorder: upload failed; spooled to %s", self.spool_path)
            self._spool(groups)

    def _resolve_run(self, groups: list[dict[str, Any]]) -> int:
        """The run id: given, or got-or-created by name on the server (atomic there: every
        process naming the run gets the same one). Components first seen in this batch
        join its environment."""
        names = sorted({n for g in groups for r in g["rollouts"] for n in r["rewards"]})
        if self.run_id is not None and (
            isinstance(self.run, int) or set(names) <= self._components
        ):
            return self.run_id
        settings = {"group_size": self.n} if self.n else {}
        run_id, created = self.client.get_or_create_run(
            str(self.run),
            environment=self.environment or str(self.run),
            components=names,
            config={"source": "openrlhf reward wrapper"},
            reward_settings={
                **settings,
                "advantage_epsilon": OPENRLHF_EPS,
                "source": "openrlhf wrapper",
            },
        )
        self.run_id = run_id
        self._components |= set(names)
        return run_id

    def _spool(self, groups: list[dict[str, Any]]) -> None:
        line = json.dumps({"kind": "groups", "payload": {"groups": storable(groups)}}) + "\n"
        try:
            with self._spool_lock:
                self.spool_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.spool_path, "a", encoding="utf-8") as f:
                    f.write(line)
            self.spooled += len(groups)
        except OSError:  # a full disk must not stop training either
            logger.exception("openrlhf recorder: could not spool %d groups", len(groups))


class RecordedRewardFunc:
    """The state of a wrapped reward function, picklable: Ray (OpenRLHF <= 0.9.0) pickles it into
    its workers. The RewardRecorder (client, lock, thread) is made on the first call in each process
    and is never pickled."""

    def __init__(self, reward_func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.reward_func = reward_func
        self.options = options
        self._recorder: RewardRecorder | None = None

    def __call__(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> Any:
        result = self.reward_func(queries, prompts, labels, **kwargs)
        self.recorder.record(queries, prompts, labels, result)
        return result

    @property
    def recorder(self) -> RewardRecorder:
        if self._recorder is None:
            with _CREATE:  # concurrent first calls (OpenRLHF's threads) make one recorder
                if self._recorder is None:
                    self._recorder = _make_recorder(self.options)
        return self._recorder

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_recorder"] = None  # threads and locks stay in the process that made them
        return state


def _make_recorder(o: dict[str, Any]) -> RewardRecorder:
    client = o["client"]
    if client is None:
        client = Client(o["url"], o["token"], timeout=o["timeout"], retries=o["retries"])
    return RewardRecorder(
        client,
        o["run"],
        environment=o["environment"],
        spool_path=o["spool_path"],
        step_fn=o["step_fn"],
        background=o["background"],
        n_samples_per_prompt=o["n_samples_per_prompt"],
        straggler_timeout=o["straggler_timeout"],
        step_gap=o["step_gap"],
    )


def wrap_reward_func(
    reward_func: Callable[..., Any],
    url: str | None = None,
    token: str | None = None,
    run: int | str = "openrlhf",
    *,
    client: Any = None,
    environment: str | None = None,
    spool_path: str | os.PathLike | None = None,
    step_fn: Callable[[], int] | None = None,
    background: bool = True,
    retries: int = 2,
    timeout: float = 10.0,
    n_samples_per_prompt: int | None = None,
    straggler_timeout: float = 120.0,
    step_gap: float = 20.0,
) -> Callable[..., Any]:
    """Return `reward_func` with recording: same signature, same result, a function Ray can pickle
    (`wrapped.recorded` holds its state, `wrapped.recorded.recorder` the process's recorder). `run`
    is a run id, or a name (got or created on the server with the components of the first groups).
    `client` replaces the HTTP client (anything with get_or_create_run / post_groups; it must be
    picklable to cross into Ray workers). See the module docstring for `n_samples_per_prompt`,
    `step_fn`, `step_gap`."""
    if client is None and (not url or not token):
        raise ValueError("url and token are required (or pass a client)")
    if n_samples_per_prompt is not None and n_samples_per_prompt < 1:
        raise ValueError("n_samples_per_prompt: must be a positive integer")
    options = {
        "client": client,
        "url": url,
        "token": token,
        "run": run,
        "environment": environment,
        "spool_path": spool_path,
        "step_fn": step_fn,
        "background": background,
        "retries": retries,
        "timeout": timeout,
        "n_samples_per_prompt": n_samples_per_prompt,
        "straggler_timeout": straggler_timeout,
        "step_gap": step_gap,
    }
    recorded = RecordedRewardFunc(reward_func, options)

    @functools.wraps(reward_func)
    def wrapped(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> Any:
        return recorded(queries, prompts, labels, **kwargs)

    wrapped.recorded = recorded  # type: ignore[attr-defined]
    return wrapped

"""Record OpenRLHF rollouts from its custom reward-function file.

OpenRLHF writes no rollout dump, but `--reward.remote_url reward_func.py` loads `reward_func`
from a file; wrap that function there with `wrap_reward_func`: the result goes back unchanged,
and the samples, grouped by prompt, are posted to the app's API (to a spool file when they
cannot be). The setup, how groups and steps are recovered and what is flagged:
docs/recording.md, "OpenRLHF" and "Module notes".
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

from .client import ApiError, Client
from .importers.base import (
    component_name,
    fill_advantages,
    finite_or_none,
    group_record,
    stable_hash,
)
from .importers.weights import UNEXPLAINED, WeightPlan, plan_weights
from .sinks import storable  # NUL and lone surrogates would be refused by Postgres

logger = logging.getLogger(__name__)

OPENRLHF_EPS = (
    1e-9  # group_norm: (r - mean) / (std + 1e-9), openrlhf/trainer/ppo_utils/experience_maker.py
)
PLAN_ROWS = 32  # samples before the weights of "rewards" are fitted (more with many components)
_STOP = object()
_CREATE = threading.Lock()  # module-level: made on import in each process, never pickled


def _as_list(x: Any) -> list[Any] | None:
    """A tensor / array / list as a Python list (a 0-d value -> None: not per-sample)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    return list(x) if isinstance(x, (list, tuple)) else None


def _per_sample(x: Any, n: int) -> list[Any] | None:
    """The per-sample values of a result field. In a one-sample call (OpenRLHF >= 0.9.1 calls the
    function once per sample) a plain number or a 0-d tensor IS the sample's value: OpenRLHF wraps
    it with torch.tensor([value]) itself (samples_generator). In a batch call it is a batch-level
    number, not per-sample: None."""
    values = _as_list(x)
    if values is None and n == 1:
        if hasattr(x, "detach"):
            x = x.detach().float().cpu()
        if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
            x = x.item()
        if isinstance(x, (int, float)):  # bool too: OpenRLHF logs it as 0/1
            values = [float(x)]
    return values


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
        rewards = _per_sample(result.get("rewards"), n)
        scores = _per_sample(result.get("scores"), n) if result.get("scores") is not None else None
        extra = result.get("extra_logs") or {}
    else:
        rewards, scores, extra = _per_sample(result, n), None, {}
    if rewards is None or len(rewards) != n:
        raise ValueError(
            f"rewards: expected {n} per-sample values, got "
            f"{None if rewards is None else len(rewards)}"
        )
    per_sample: dict[str, list[Any]] = {}
    for k, v in extra.items():
        values = _per_sample(v, n)
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
    indexed = [{"index": i, **r} for i, r in enumerate(rollouts)]
    fill_advantages(indexed, eps=OPENRLHF_EPS)
    return group_record(step, key, prompt, indexed)


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
    """The samples of one prompt at one step so far: the step, when the first and the last
    arrived, the rollouts."""

    def __init__(self, step: int, now: float) -> None:
        self.step = step
        self.since = now
        self.last = now
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
        # (step, prompt) -> its samples so far; held until the step is over (or straggler_timeout
        # after its last sample), so that a prompt drawn twice in a step shows as > n samples
        self._pending: dict[tuple[int, str], _Pending] = {}
        self.plan: WeightPlan | None = None  # how "rewards" relates to extra_logs (weights.py)
        self._planned = False
        self._unplanned: list[tuple[str, _Pending]] = []  # groups waiting for the plan
        self._settings_due = False  # the plan's weights are still to be posted to the run
        self._closed = False  # after close(): a group of n goes at once (nobody waits for more)
        self.left_out: dict[int, int] = {}  # step -> samples of prompts drawn twice: not posted
        self._metrics_due: dict[int, int] = {}
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
                if self.n is None and len(samples) > 1:  # a batch call, G unknown: its share
                    ready = self._planned_groups(self._call_groups(samples, step), force=False)
                else:
                    for prompt, rollout in samples:
                        key = (step, prompt)
                        pending = self._pending.setdefault(key, _Pending(step, now))
                        pending.rollouts.append(rollout)
                        pending.last = now
                    ready = self._release(now, step)
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

    def _release(
        self, now: float, step: int | None = None, everything: bool = False
    ) -> list[dict[str, Any]]:
        """The groups whose step is over (a call of a later step came), whose last sample is
        straggler_timeout old, or all of them (`everything`: end of training)."""
        done = [
            (key, p)
            for key, p in self._pending.items()
            if everything
            or key[0] != step
            or now - p.last >= self.straggler_timeout
            or (self._queue is None and self._closed and len(p.rollouts) == self.n)
        ]
        out = []
        for key, pending in done:
            del self._pending[key]
            if self.n is not None and len(pending.rollouts) > self.n:
                self._leave_out(key[1], pending)
            else:
                out.append((key[1], pending))
        return self._planned_groups(out)

    def _leave_out(self, prompt: str, pending: _Pending) -> None:
        """More than n samples of one prompt in one step: OpenRLHF drew it more than once and
        groups by the sample's index, which its reward function never sees, so the samples of
        the draws cannot be told apart. They are not posted (no advantage from a guessed
        split); the run gets a per-step count, metric recorder/ungroupable_samples."""
        c = len(pending.rollouts)
        self.left_out[pending.step] = self.left_out.get(pending.step, 0) + c
        self._metrics_due[pending.step] = self.left_out[pending.step]
        logger.warning(
            "openrlhf recorder: step %d: %d samples of one prompt (n_samples_per_prompt %d): "
            "drawn %s times, its groups cannot be told apart; not recorded (prompt %s)",
            pending.step,
            c,
            self.n,
            f"{c / self.n:g}",
            stable_hash(prompt, 12),
        )

    def _call_groups(
        self, samples: list[tuple[str, dict[str, Any]]], step: int
    ) -> list[tuple[str, _Pending]]:
        by_prompt: dict[str, _Pending] = {}
        for prompt, rollout in samples:
            by_prompt.setdefault(prompt, _Pending(step, 0.0)).rollouts.append(rollout)
        return list(by_prompt.items())

    def _planned_groups(
        self, pending: list[tuple[str, _Pending]], force: bool = True
    ) -> list[dict[str, Any]]:
        """Groups completed by the weight plan: the first groups wait until there are enough rows
        to relate "rewards" to the extra_logs components (or `force`), then all go out."""
        if not self._planned:
            if not pending and not self._unplanned:
                return []  # nothing to fit on yet
            self._unplanned.extend(pending)
            rows = [(r["rewards"], r["reward"]) for _, p in self._unplanned for r in p.rollouts]
            width = len({k for r, _ in rows for k in r})
            if not force and len(rows) < max(PLAN_ROWS, 2 * (width + 1)):
                return []
            self.plan = plan_weights(rows, total="rewards") if width else None
            self._planned, self._settings_due = True, True
            pending, self._unplanned = self._unplanned, []
        out = []
        for prompt, p in pending:
            if self.plan is not None:
                for r in p.rollouts:
                    self.plan.complete(r["rewards"], r["reward"])
            out.append(self._group(prompt, p))
        return out

    def _stale(self, now: float, everything: bool = False) -> list[dict[str, Any]]:
        """Groups still incomplete after straggler_timeout (all of them when `everything`)."""
        return self._release(now, None if everything else self._open_step(), everything)

    def _open_step(self) -> int | None:
        """The step calls are in now (None: every buffered step is over)."""
        if self.step_fn is not None:
            return max((k[0] for k in self._pending), default=None)
        return self.step

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
        self._closed = True
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
            if self._settle_weights(run_id):  # another process's fit won: complete with it
                self._recomplete(groups)
                run_id = self._resolve_run(groups)  # an `unexplained` first seen joins the run
            self.client.post_groups(run_id, storable(groups))
            self.sent += len(groups)
            self._post_run_facts(run_id)
        except ApiError as e:
            logger.error("openrlhf recorder: upload failed (%s); spooled to %s", e, self.spool_path)
            self._spool(groups)
        except Exception:  # noqa: BLE001
            logger.exception("openrlhf recorder: upload failed; spooled to %s", self.spool_path)
            self._spool(groups)

    def _settle_weights(self, run_id: int) -> bool:
        """Post the plan's weights before the first groups, first wins: every process of a
        trainer (Ray workers, vLLM engines) fits its own from its own samples, and the run keeps
        the first posted. True when the run's differ from this process's plan, which then becomes
        the run's (`_recomplete` redoes the rows already completed)."""
        with self._lock:
            due, self._settings_due = self._settings_due, False
            plan = self.plan
        post_settings = getattr(self.client, "post_settings", None)
        if not due or plan is None or post_settings is None:
            return False
        answer = post_settings(
            run_id,
            {
                "weights": plan.weights,
                "trainer": {"weights_note": plan.note[:500]},
                "source": "openrlhf wrapper",
                "first_wins": True,
            },
        )
        settled = (answer or {}).get("reward_settings") or {}
        weights = settled.get("weights")
        if not isinstance(weights, dict) or weights == plan.weights:
            return False
        note = (settled.get("trainer") or {}).get("weights_note") or plan.note
        adopted = WeightPlan(dict(weights), UNEXPLAINED in weights, str(note))
        with self._lock:
            self.plan = adopted
        return True

    def _recomplete(self, groups: list[dict[str, Any]]) -> None:
        """The rows' `unexplained` again, from the plan the run settled on."""
        plan = self.plan
        if plan is None:
            return
        for g in groups:
            for r in g["rollouts"]:
                r["rewards"].pop(UNEXPLAINED, None)
                plan.complete(r["rewards"], r["reward"])

    def _post_run_facts(self, run_id: int) -> None:
        """What the run must say besides its groups: the per-step count of samples left out.
        Clients without the call skip it."""
        with self._lock:
            metrics, self._metrics_due = self._metrics_due, {}
        post_metrics = getattr(self.client, "post_metrics", None)
        if metrics and post_metrics is not None:
            post_metrics(
                run_id,
                [
                    {"step": step, "values": {"recorder/ungroupable_samples": float(n)}}
                    for step, n in sorted(metrics.items())
                ],
            )

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

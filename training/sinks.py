"""Where recorded rollouts, metrics, logs and progress go: a `Sink` receives records in the
ingestion format the web app takes verbatim (groups: `training.records.GroupRecord`s or their
`to_json()`; step metrics; the run's reward settings).
The database sink (workers), the HTTP sink (the API, for training on another machine, with a
spool while the server is down) and the JSONL sink (offline, imported later) implement it.
Record shapes and delivery rules: docs/recording.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from . import records
from .client import ApiError, Client
from .records import GroupRecord

logger = logging.getLogger(__name__)

SETTINGS_FILE = (
    "reward_settings.json"  # the recorder's settings, beside TRL's completions/ in an output_dir
)


Groups = Sequence[GroupRecord | dict[str, Any]]  # a sink takes records or their to_json()


@runtime_checkable
class Sink(Protocol):
    def write_groups(self, groups: Groups) -> None: ...

    def write_metrics(self, step: int, values: dict[str, float]) -> None: ...

    def log(self, line: str) -> None: ...

    def progress(self, step: int, total: int) -> None: ...

    def close(self) -> None: ...


def storable(obj: Any) -> Any:
    """A copy the web app can store: NaN/inf become None (JSON has no NaN; the schema says value:
    float | None), and a NUL character or a lone surrogate in any string (or key) becomes U+FFFD.
    Ingestion refuses both (Postgres text and jsonb cannot hold NUL, UTF-8 cannot encode a lone
    surrogate) and refuses the whole batch with them, yet a byte-level tokenizer does decode a NUL
    from a model's output now and then: one odd character must not cost a batch of rollouts."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return _storable_text(obj)
    if isinstance(obj, dict):
        return {_storable_text(k) if isinstance(k, str) else k: storable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [storable(v) for v in obj]
    if isinstance(obj, GroupRecord):
        return storable(obj.to_json())
    return obj


def _storable_text(s: str) -> str:
    s = s.replace("\x00", "\ufffd")  # returns s itself when there is none
    if s.isascii():  # the common case, and cheap: nothing else can be wrong in ASCII
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (from a "\ud800" JSON escape, say)
        s = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in s)
    return s


# --------------------------------------------------------------------------------------------------


class DiscardSink:
    """Takes everything and keeps nothing: the sink of the non-primary processes of a multi-process
    job (TRL gathers their rollouts and metrics to process 0, which records them once)."""

    def write_groups(self, groups: Groups) -> None:
        pass

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def write_settings(self, settings: dict[str, Any]) -> None:
        pass

    def log(self, line: str) -> None:
        pass

    def progress(self, step: int, total: int) -> None:
        pass

    def close(self) -> None:
        pass


class MemorySink:
    def __init__(self) -> None:
        self.groups: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.settings: list[dict[str, Any]] = []
        self.logs: list[str] = []
        self.progress_events: list[tuple[int, int]] = []
        self.closed = False

    def write_groups(self, groups: Groups) -> None:
        self.groups.extend(storable(groups))

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        self.metrics.append({"step": int(step), "values": storable(dict(values))})

    def write_settings(self, settings: dict[str, Any]) -> None:
        self.settings.append(storable(dict(settings)))

    def log(self, line: str) -> None:
        self.logs.append(line)

    def progress(self, step: int, total: int) -> None:
        self.progress_events.append((int(step), int(total)))

    def close(self) -> None:
        self.closed = True


class JsonlSink:
    """Append-only JSONL; each write is flushed so a crashed run keeps everything written before."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - the sink's lifetime; close()
        self._lock = threading.Lock()

    def _write(self, records: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(storable(r), ensure_ascii=False) + "\n" for r in records)
        with self._lock:
            self._f.write(text)
            self._f.flush()

    def write_groups(self, groups: Groups) -> None:
        self._write([{"type": "group", **g} for g in records.to_json(groups)])

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        self._write([{"type": "metrics", "step": int(step), "values": dict(values)}])

    def write_settings(self, settings: dict[str, Any]) -> None:
        self._write([{"type": "settings", **settings}])

    def log(self, line: str) -> None:
        self._write([{"type": "log", "line": line, "time": time.time()}])

    def progress(self, step: int, total: int) -> None:
        self._write([{"type": "progress", "step": int(step), "total": int(total)}])

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


def read_jsonl_sink(path: str | os.PathLike) -> dict[str, list[Any]]:
    """Split a JsonlSink file back into {"settings", "groups", "metrics", "logs", "progress"}
    (type field removed)."""
    out: dict[str, list[Any]] = {
        "settings": [],
        "groups": [],
        "metrics": [],
        "logs": [],
        "progress": [],
    }
    plural = {
        "settings": "settings",
        "group": "groups",
        "metrics": "metrics",
        "log": "logs",
        "progress": "progress",
    }
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out[plural[rec.pop("type")]].append(rec)
    return out


# --------------------------------------------------------------------------------------------------


class HttpSink:
    """Posts groups and metrics to the web app's API through `training.client.Client` (one HTTP
    client, one retry policy); logs go to the `logging` module, progress is derived by the app
    from the metrics.

    A POST goes out every `batch_size` records or when a write finds the oldest buffered record
    older than `flush_interval` seconds (so the app stays live at a few groups per step), and on
    flush/close. The client retries a connection error, a timeout, a 5xx or a 429 `retries` times
    with exponential backoff (backoff, 2*backoff, ...); if it still fails, or the server answers
    another 4xx (a request that will never succeed as is, e.g. a component the run's environment
    lacks), the batch is appended to the spool file, the reason is logged, and training continues.
    Once the server has been unreachable, later batches skip straight to the spool for `cooldown`
    seconds, so a dead server costs one round of retries, not one per step. Records pass through
    `storable` first, so the server never refuses a batch for a NUL in a completion. Nothing here
    raises into training."""

    def __init__(
        self,
        base_url: str,
        token: str,
        run_id: str | int,
        *,
        spool_path: str | os.PathLike | None = None,
        batch_size: int = 64,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 10.0,
        cooldown: float = 30.0,
        flush_interval: float = 5.0,
    ) -> None:
        self.client = Client(base_url, token, timeout=timeout, retries=retries, backoff=backoff)
        self.run_id = str(run_id)
        self.spool_path = Path(spool_path) if spool_path else Path(f"spool-run-{self.run_id}.jsonl")
        self.batch_size = batch_size
        self.cooldown = cooldown
        self.flush_interval = flush_interval
        self._groups: list[dict[str, Any]] = []
        self._metrics: list[dict[str, Any]] = []
        self._down_until = 0.0
        self._oldest: float | None = None  # monotonic time of the oldest unsent record
        self.sent = {"groups": 0, "metrics": 0, "settings": 0}
        self.spooled = {"groups": 0, "metrics": 0, "settings": 0}
        self.settings_changed: list[
            str
        ] = []  # what the server said the trainer's settings replaced

    @property
    def base_url(self) -> str:
        return self.client.base_url

    # ---- Sink protocol

    def write_groups(self, groups: Groups) -> None:
        self._groups.extend(storable(groups))
        self._maybe_flush(len(self._groups))

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        self._metrics.append({"step": int(step), "values": storable(dict(values))})
        self._maybe_flush(len(self._metrics))

    def _maybe_flush(self, buffered: int) -> None:
        now = time.monotonic()
        if self._oldest is None:
            self._oldest = now
        if buffered >= self.batch_size or now - self._oldest >= self.flush_interval:
            self.flush()

    def write_settings(self, settings: dict[str, Any]) -> None:
        """Sent at once (training is starting; nothing is buffered yet), spooled like a batch
        if it fails."""
        self._deliver("settings", storable(dict(settings)), 1)

    def log(self, line: str) -> None:
        logger.info(line)

    def progress(self, step: int, total: int) -> None:
        pass  # the app derives progress from the metrics it receives

    def flush(self) -> None:
        self._oldest = None
        self._flush_groups()
        self._flush_metrics()

    def close(self) -> None:
        self.flush()

    # ---- transport

    def _flush_groups(self) -> None:
        batch, self._groups = self._groups, []
        if batch:
            self._deliver("groups", {"groups": batch}, len(batch))

    def _flush_metrics(self) -> None:
        batch, self._metrics = self._metrics, []
        if batch:
            self._deliver("metrics", {"metrics": batch}, len(batch))

    def _deliver(self, kind: str, payload: dict[str, Any], n: int) -> None:
        if time.monotonic() < self._down_until or not self.post(kind, payload):
            self._spool(kind, payload)
            self.spooled[kind] += n
        else:
            self.sent[kind] += n

    def post(self, kind: str, payload: dict[str, Any]) -> bool:
        """One POST of a spool-format batch ({"groups": [...]} or {"metrics": [...]}), with the
        client's retries. True when the server accepted it (2xx). Never raises."""
        return self.send(kind, payload) == "sent"

    def send(self, kind: str, payload: dict[str, Any]) -> Literal["sent", "rejected", "down"]:
        """`post`, telling apart a batch the server refused ("rejected": it would be refused
        again as is) from a server that could not be reached or failed ("down": the same batch
        may go later)."""
        send = {
            "groups": self.client.post_groups,
            "metrics": self.client.post_metrics,
            "settings": self._post_settings,
        }.get(kind)
        body = (
            payload
            if kind == "settings"
            else payload.get(kind)
            if isinstance(payload, dict)
            else None
        )
        if (
            send is None
            or not isinstance(payload, dict)
            or not isinstance(body, dict if kind == "settings" else list)
        ):
            logger.error("HttpSink: not a %r batch; kept unsent", kind)
            return "rejected"
        try:
            send(self.run_id, body)  # type: ignore[arg-type]  # the client formats the id into the URL
            return "sent"
        except ApiError as e:
            if (
                not e.retryable
            ):  # a 4xx repeats identically on retry: keep the batch for a human, say why
                logger.warning(
                    "HttpSink: %s rejected (%s); spooling. Server said: %s", kind, e, e.errors[:3]
                )
                return "rejected"
            # The client already retried: the server is down or overloaded.
            logger.warning(
                "HttpSink: %s not delivered after %d tries (%s); spooling",
                kind,
                self.client.retries + 1,
                e,
            )
        except Exception:  # noqa: BLE001 - e.g. the server died mid-response (http.client errors)
            logger.exception("HttpSink: %s failed; spooling", kind)
        self._down_until = time.monotonic() + self.cooldown
        return "down"

    def _post_settings(self, run_id: str, settings: dict[str, Any]) -> None:
        answer = self.client.post_settings(run_id, settings)  # type: ignore[arg-type]
        self.settings_changed = list(answer.get("changed") or [])
        for line in self.settings_changed:  # the trainer wins; say what it replaced
            logger.warning("HttpSink: run %s: the trainer's %s", self.run_id, line)

    def _spool(self, kind: str, payload: dict[str, Any]) -> None:
        try:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spool_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": kind, "payload": payload}) + "\n")
        except OSError as e:  # never raise into training, even with a full disk
            logger.error("HttpSink: could not spool %s: %s", kind, e)


def upload_spool(
    spool_path: str | os.PathLike, base_url: str, token: str, run_id: str | int, **kwargs: Any
) -> dict[str, int]:
    """Send a spool file's batches in order; returns {"sent": batches, "left": batches}.

    What is not sent stays in the spool, rewritten in place, so a later upload resumes where this
    one stopped: when the server cannot be reached, that batch and every later one; when the server
    rejects a batch (4xx, logged with its reasons), that batch alone, and the later ones still go. A
    line that is not JSON (a write cut short by a crash) is kept as it is. Ingestion is idempotent,
    so a batch sent twice is harmless."""
    path = Path(spool_path)
    if not path.exists():
        return {"sent": 0, "left": 0}
    sink = HttpSink(base_url, token, run_id, spool_path=path.with_suffix(".retry"), **kwargs)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    left: list[str] = []
    sent = 0
    for i, line in enumerate(lines):
        try:
            entry = json.loads(line)
            kind, payload = entry["kind"], entry["payload"]
        except (ValueError, KeyError, TypeError):
            logger.error("upload: line %d of %s is not a spooled batch; kept", i + 1, path)
            left.append(line)
            continue
        outcome = sink.send(kind, storable(payload))  # spools written by older code may hold a NUL
        if outcome == "sent":
            sent += 1
        elif outcome == "rejected":
            left.append(line)
        else:
            left.extend(
                lines[i:]
            )  # the server went away: keep the rest, in order, for the next attempt
            break
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in left), encoding="utf-8")
    os.replace(tmp, path)
    return {"sent": sent, "left": len(left)}


# --------------------------------------------------------------------------------------------------


class BatchingSink:
    """Runs another sink on a background thread. Calls return immediately; `close()` drains
    the queue, closes the inner sink and joins the thread. An error in the inner sink is
    logged, never raised."""

    _STOP = object()

    def __init__(self, inner: Sink, *, close_inner: bool = True, max_queue: int = 10_000) -> None:
        self.inner = inner
        self.close_inner = (
            close_inner  # False when the caller keeps using the inner sink afterwards
        )
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="sink-writer", daemon=True)
        self._closed = False
        self._thread.start()

    def _put(self, item: tuple) -> None:
        if self._closed:
            return
        try:
            self._queue.put(item, timeout=60)
        except queue.Full:
            logger.error("BatchingSink: queue full for 60s, dropping a %s record", item[0])

    def write_groups(self, groups: Groups) -> None:
        self._put(("write_groups", (groups,)))

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        self._put(("write_metrics", (step, dict(values))))

    def write_settings(self, settings: dict[str, Any]) -> None:
        if hasattr(
            self.inner, "write_settings"
        ):  # an inner sink without it simply does not take them
            self._put(("write_settings", (dict(settings),)))

    def log(self, line: str) -> None:
        self._put(("log", (line,)))

    def progress(self, step: int, total: int) -> None:
        self._put(("progress", (step, total)))

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued so far has been handed to the inner sink (and the inner
        sink's own `flush`, if it has one, has run)."""
        if self._closed:
            return
        done = threading.Event()
        self._put(("_flush", (done,)))
        done.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put((self._STOP, ()))
        self._thread.join()

    def _run(self) -> None:
        while True:
            method, args = self._queue.get()
            if method is self._STOP:
                break
            try:
                if method == "_flush":
                    inner_flush = getattr(self.inner, "flush", None)
                    if inner_flush is not None:
                        inner_flush()
                else:
                    getattr(self.inner, method)(*args)
            except Exception:  # noqa: BLE001 - a sink failure must never reach the training loop
                logger.exception("BatchingSink: inner sink failed in %s", method)
            finally:
                if method == "_flush":
                    args[0].set()
        if self.close_inner:
            try:
                self.inner.close()
            except Exception:  # noqa: BLE001
                logger.exception("BatchingSink: inner sink failed to close")


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sink utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "upload",
        help="send a HttpSink spool file to the server; exit status 1 while batches are left in it",
    )
    up.add_argument("spool", help="spool JSONL file written by HttpSink")
    up.add_argument("--url", required=True, help="base URL of the web app, e.g. http://host:8000")
    up.add_argument("--token", required=True, help="API token")
    up.add_argument("--run", required=True, help="run id")
    args = parser.parse_args(argv)
    result = upload_spool(args.spool, args.url, args.token, args.run)
    print(json.dumps(result))
    if result["left"]:
        raise SystemExit(1)  # something is still in the spool: a script's retry loop should know


if __name__ == "__main__":
    main()

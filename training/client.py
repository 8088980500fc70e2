"""A dependency-free Python client for the web app's REST API v1 (stdlib urllib only), for training
scripts on other machines, notebooks, and the HTTP sink.

    from .client import Client
    api = Client("http://host:8000", token="...")
    run_id = api.create_run("grpo-7b", environment="math", components=["correct", "format"])
    api.post_groups(run_id, [{"step": 0, "key": "p1", "prompt": "...", "rollouts": [...]}])
    api.post_metrics(run_id, [{"step": 0, "values": {"loss": 0.3}}])
    for r in api.iter_rollouts(run_id, sort="correct", order="asc", step_min=100):
        ...
    api.finish(run_id)

Transient failures (connection errors, timeouts, 5xx, 429) are retried with exponential backoff
(backoff, 2*backoff, 4*backoff, ...; a 429's Retry-After wins when longer); a 4xx is the request's
fault and raises `ApiError` at once with the server's `errors` list ([{"field", "error"}]). Posting
groups is idempotent on (step, key), so retrying it after a lost response is safe. Creating a run is
not, so `create_run` retries only failures where the server cannot have created it (connection
refused, 429, 503).

Plain Python: never imports Django.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from . import token_wire

logger = logging.getLogger(__name__)

UNPROCESSED = (429, 503)  # the server (or a proxy in front of it) did not handle the request


class ApiError(Exception):
    """The API refused a request (status 4xx/5xx), or could not be reached after every retry
    (status None). `errors` is the server's list of {"field", "error"}."""

    def __init__(
        self, status: int | None, errors: list[dict[str, str]], method: str = "", url: str = ""
    ) -> None:
        self.status = status
        self.errors = errors
        self.method = method
        self.url = url
        self.retry_after = 0.0  # seconds the server asked us to wait (429/503 Retry-After)
        first = errors[0] if errors else {"field": "", "error": "request failed"}
        where = f"{first['field']}: " if first.get("field") else ""
        super().__init__(
            f"{method} {url} -> {status if status is not None else 'unreachable'}: "
            f"{where}{first.get('error', '')}"
        )

    @property
    def retryable(self) -> bool:
        """True when sending the same request later may succeed (server down or overloaded)."""
        return self.status is None or self.status >= 500 or self.status == 429


MAX_BODY = 32 * 1024 * 1024  # the server's default request limit (MAX_REQUEST_BYTES)


class Client:
    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 30,
        retries: int = 5,
        backoff: float = 0.5,
        max_body: int = MAX_BODY,
    ) -> None:
        self.max_body = max_body  # bytes a request may carry: post_groups splits batches to fit
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout  # seconds per attempt
        self.retries = retries  # attempts after the first
        self.backoff = backoff  # seconds before the first retry; doubles each time

    # ---- runs

    def list_runs(self) -> list[dict[str, Any]]:
        """The newest runs (the server returns up to 500), newest first."""
        return self._request("GET", "/api/v1/runs/")["runs"]

    def find_run(self, name: str) -> dict[str, Any] | None:
        """The newest run with this name, or None (the server filters by name: any age)."""
        q = urllib.parse.urlencode({"name": name})
        return next(
            (r for r in self._request("GET", f"/api/v1/runs/?{q}")["runs"] if r["name"] == name),
            None,
        )

    def create_run(
        self,
        name: str,
        environment: str,
        components: list[str | dict[str, Any]] | None = None,
        config: dict[str, Any] | None = None,
        kind: str = "import",
        base_model: str = "",
        reward_settings: dict[str, Any] | None = None,
    ) -> int:
        """Create a run (and its environment, or the components it lacks). `components` are names
        or {"name", "weight", "kind", "min_value", "max_value", "description"}; a weight given here
        is this run's weight even when the environment exists with another. `reward_settings` may
        add scale_rewards, aggregation, advantage_epsilon, group_size (see `post_settings`).
        Returns the run id."""
        comps = [c if isinstance(c, dict) else {"name": c} for c in components or []]
        body: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "config": config or {},
            "base_model": base_model,
            "environment": {"name": environment, "components": comps},
        }
        if reward_settings:
            body["reward_settings"] = reward_settings
        return int(self._request("POST", "/api/v1/runs/", body, idempotent=False)["id"])

    def get_or_create_run(
        self,
        name: str,
        environment: str,
        components: list[str | dict[str, Any]] | None = None,
        config: dict[str, Any] | None = None,
        kind: str = "import",
        base_model: str = "",
        reward_settings: dict[str, Any] | None = None,
    ) -> tuple[int, bool]:
        """The run named `name`, created (as `create_run`) when no run has it: (run id, created).
        Atomic on the server, so many processes naming one run land in one run, and safe to
        retry. Components the environment lacks are added to it; `reward_settings` apply only to
        a run created here."""
        comps = [c if isinstance(c, dict) else {"name": c} for c in components or []]
        body: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "config": config or {},
            "base_model": base_model,
            "environment": {"name": environment, "components": comps},
            "get_or_create": True,
        }
        if reward_settings:
            body["reward_settings"] = reward_settings
        answer = self._request("POST", "/api/v1/runs/", body)
        return int(answer["id"]), bool(answer.get("created"))

    def post_settings(self, run_id: int, settings: dict[str, Any]) -> dict[str, Any]:
        """Store the reward settings a trainer trains with: {"weights": {component: w},
        "scale_rewards", "aggregation", "advantage_epsilon", "group_size", "trainer": {name:
        scalar}, "source"}. They win over the run's; returns {"reward_settings": merged, "changed":
        [one line per value replaced]}."""
        return self._request("POST", f"/api/v1/runs/{run_id}/settings/", settings)

    def finish(self, run_id: int) -> dict[str, Any]:
        return self._request("POST", f"/api/v1/runs/{run_id}/finish/")

    # ---- writes

    def post_groups(self, run_id: int, groups: list[dict[str, Any]]) -> dict[str, int]:
        """Ingest a batch. Returns {"groups", "rollouts", "skipped_groups"}. A batch larger than
        `max_body` (token arrays make them large) goes as several requests of whole groups, each
        all or nothing (ingestion is idempotent per group, so a retry after a partial failure
        stores nothing twice); a single group past it raises ApiError 413 naming its largest
        rollout's tokens, before anything is sent."""
        path = f"/api/v1/runs/{run_id}/groups/"
        total = {"groups": 0, "rollouts": 0, "skipped_groups": 0}
        for chunk, kind in _chunks(groups, self.max_body, "POST", self.base_url + path):
            answer = self._request("POST", path, raw=chunk, content_type=kind)
            for k in total:
                total[k] += int(answer.get(k, 0))
        return total

    def post_metrics(self, run_id: int, metrics: list[dict[str, Any]]) -> dict[str, int]:
        """`metrics` is a list of {"step": int, "values": {name: float}}."""
        return self._request("POST", f"/api/v1/runs/{run_id}/metrics/", {"metrics": metrics})

    # ---- reads

    def get_group(self, run_id: int, step: int, key: str) -> dict[str, Any]:
        q = urllib.parse.urlencode({"step": step, "key": key})
        return self._request("GET", f"/api/v1/runs/{run_id}/groups/?{q}")

    def iter_rollouts(
        self,
        run_id: int,
        sort: str = "reward",
        order: str = "desc",
        limit: int = 500,
        **filters: Any,
    ) -> Iterator[dict[str, Any]]:
        """Every rollout matching the filters (step_min, step_max, split, zero_std, q,
        min_<component>, max_<component>, ...), in the server's keyset order, one page of `limit`
        at a time."""
        params = {
            "sort": sort,
            "order": order,
            "limit": limit,
            **{k: _param(v) for k, v in filters.items() if v is not None},
        }
        cursor: str | None = None
        while True:
            q = urllib.parse.urlencode({**params, **({"cursor": cursor} if cursor else {})})
            page = self._request("GET", f"/api/v1/runs/{run_id}/rollouts/?{q}")
            yield from page["rollouts"]
            cursor = page.get("next")
            if not cursor:
                return

    # ---- transport

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool = True,
        raw: bytes | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.base_url + path
        data = (
            raw if raw is not None or body is None else json.dumps(body, allow_nan=False).encode()
        )
        headers = {"Authorization": f"Token {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        last: ApiError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._delay(attempt, last))
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                return json.loads(raw) if raw else {}
            except urllib.error.HTTPError as e:
                last = ApiError(e.code, _errors(e), method, url)
                last.retry_after = _retry_after(e)
                if not last.retryable or (not idempotent and e.code not in UNPROCESSED):
                    raise last from None
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                reason = getattr(e, "reason", e)
                last = ApiError(
                    None,
                    [{"field": "", "error": f"cannot reach the server: {reason}"}],
                    method,
                    url,
                )
                if not idempotent and not isinstance(reason, ConnectionRefusedError):
                    # The request may have arrived: a retry could create a second run
                    raise last from None
            logger.warning("%s (attempt %d of %d)", last, attempt + 1, self.retries + 1)
        assert last is not None
        raise last

    def _delay(self, attempt: int, last: ApiError | None) -> float:
        delay = self.backoff * 2 ** (attempt - 1)
        return max(delay, last.retry_after if last is not None else 0.0)


def _chunks(
    groups: list[dict[str, Any]], limit: int, method: str, url: str
) -> Iterator[tuple[bytes, str]]:
    """(body, content type) requests of at most `limit` bytes, whole groups each, in order: JSON,
    or binary bodies (token_wire) when a group has base64 token arrays (the recorder's form), which
    then travel as raw bytes: a quarter less to send and no base64 for the server to decode."""
    binary = any(token_wire.carries_raw(g) for g in groups)
    empty = len(token_wire.encode({"groups": []})) if binary else len(b'{"groups": []}')
    chunk: list[dict[str, Any]] = []
    parts: list[bytes] = []
    size = empty
    for i, g in enumerate(groups):
        part = b"" if binary else json.dumps(g, allow_nan=False).encode()
        n = token_wire.bound(g) if binary else len(part) + 2
        if n + empty > limit:
            raise ApiError(413, [_too_big(i, g, n, limit)], method, url)
        if chunk and size + n > limit:
            yield _body(chunk, parts, binary)
            chunk, parts, size = [], [], empty
        chunk.append(g)
        parts.append(part)
        size += n
    if chunk or not groups:  # an empty batch is still one request: the server answers it
        yield _body(chunk, parts, binary)


def _body(groups: list[dict[str, Any]], parts: list[bytes], binary: bool) -> tuple[bytes, str]:
    if binary:
        return token_wire.encode({"groups": groups}), token_wire.CONTENT_TYPE
    return b'{"groups": [' + b", ".join(parts) + b"]}", "application/json"


def _too_big(i: int, group: dict[str, Any], size: int, limit: int) -> dict[str, str]:
    rollouts = group.get("rollouts") or []
    sizes = [len(json.dumps(r.get("tokens") or {})) for r in rollouts]
    j = max(range(len(sizes)), key=sizes.__getitem__) if sizes else 0
    field = f"groups[{i}].rollouts[{j}].tokens" if sizes and sizes[j] > 2 else f"groups[{i}]"
    return {
        "field": field,
        "error": f"group {group.get('key')!r} is {size} bytes, past the server's "
        f"{limit}-byte request limit (its largest token arrays are here): send fewer tokens "
        "or raise MAX_REQUEST_BYTES on the server and max_body here",
    }


def _param(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _errors(e: urllib.error.HTTPError) -> list[dict[str, str]]:
    """The server's error list, or the status text when the body is not our JSON
    (a proxy's page)."""
    try:
        body = json.loads(e.read() or b"null")
    except (ValueError, OSError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("errors"), list):
        return body["errors"]
    if isinstance(body, dict) and "detail" in body:  # DRF's own errors (authentication, 404)
        return [{"field": "", "error": str(body["detail"])}]
    return [{"field": "", "error": f"HTTP {e.code} {e.reason}"}]


def _retry_after(e: urllib.error.HTTPError) -> float:
    try:
        return min(
            float(e.headers.get("Retry-After") or 0), 300.0
        )  # never sleep longer than 5 minutes
    except (TypeError, ValueError):
        return 0.0

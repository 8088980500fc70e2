"""training/client.py against a real server (pytest-django's live_server: a threaded HTTP server in
this process on a transactional database) and its retry rules against a scripted local HTTP server.
The OpenRLHF wrapper's tests are in test_openrlhf_reward.py."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from training.client import ApiError, Client


@pytest.fixture
def token(transactional_db) -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from webapp.accounts.roles import set_role

    user = get_user_model().objects.create_user(username="trainer-bot", password="x" * 12)
    set_role(user, "trainer")
    return Token.objects.create(user=user).key


@pytest.fixture
def api(live_server, token) -> Client:
    return Client(live_server.url, token, timeout=10, retries=1, backoff=0.01)


def group(step: int, key: str, values: list[float]) -> dict[str, Any]:
    return {
        "step": step,
        "key": key,
        "prompt": f"prompt {key}",
        "rollouts": [
            {"index": i, "completion": f"c{i}", "rewards": {"correct": v, "format": 1.0 - v}}
            for i, v in enumerate(values)
        ],
    }


# -------------------------------------------------------------------------------------- live server


def test_it_creates_a_run_posts_and_reads_it_back(api):
    run_id = api.create_run(
        "remote",
        environment="remote-env",
        components=["correct", {"name": "format", "weight": 0.5}],
        config={"lr": 1e-5},
        kind="grpo",
    )
    assert api.find_run("remote")["id"] == run_id
    assert api.find_run("absent") is None
    assert api.post_groups(run_id, [group(0, "a", [1.0, 0.0, 0.5]), group(1, "b", [0.2, 0.9])]) == {
        "groups": 2,
        "rollouts": 5,
        "skipped_groups": 0,
    }
    assert (
        api.post_groups(run_id, [group(0, "a", [1.0, 0.0, 0.5])])["skipped_groups"] == 1
    )  # idempotent retry
    assert api.post_metrics(run_id, [{"step": 0, "values": {"loss": 0.5}}]) == {"metrics": 1}
    g = api.get_group(run_id, 1, "b")
    assert g["size"] == 2 and g["components"]["correct"]["std"] == pytest.approx(0.4949747)
    finished = api.finish(run_id)
    assert finished["status"] == "succeeded"


def test_it_finds_a_run_by_name_however_old_it_is(api):
    from webapp.runs.models import Run

    old_id = api.create_run("old-run", environment="client-env", components=["correct"])
    Run.objects.bulk_create(
        [Run(name=f"newer-{i}") for i in range(501)]
    )  # past the list's 500 newest
    assert api.find_run("old-run")["id"] == old_id
    assert api.find_run("nope") is None and api.find_run("newer-3")["name"] == "newer-3"


def test_it_iterates_rollouts_across_pages_following_the_cursor(api):
    run_id = api.create_run("paged", environment="paged-env", components=["correct", "format"])
    api.post_groups(run_id, [group(s, f"k{s}", [0.1 * s, 0.05 * s + 0.3]) for s in range(5)])
    rows = list(api.iter_rollouts(run_id, sort="correct", order="asc", limit=3))
    assert len(rows) == 10
    values = [r["rewards"]["correct"] for r in rows]
    assert values == sorted(values)
    assert len({r["id"] for r in rows}) == 10  # no page repeats a row
    assert [
        r["step"] for r in api.iter_rollouts(run_id, sort="step", order="asc", step_min=3, limit=1)
    ] == [3, 3, 4, 4]


def test_it_raises_the_servers_errors_on_a_4xx(api, live_server):
    run_id = api.create_run("strict", environment="strict-env", components=["correct"])
    bad = group(0, "a", [1.0])
    bad["rollouts"][0]["rewards"] = {"nope": 1.0}
    with pytest.raises(ApiError) as e:
        api.post_groups(run_id, [bad])
    assert e.value.status == 400 and not e.value.retryable
    assert e.value.errors[0]["field"] == "groups[0].rollouts[0].rewards.nope"
    with pytest.raises(ApiError) as e:
        Client(live_server.url, "wrong-token", retries=0).list_runs()
    assert e.value.status == 401 and "token" in str(e.value).lower()
    with pytest.raises(ApiError, match="404"):
        api.get_group(run_id, 0, "missing")


# ------------------------------------------------------------------------------------------ retries


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers) of the server's script."""

    def _answer(self) -> None:
        self.server.calls.append((self.command, self.path))  # type: ignore[attr-defined]
        status, headers = self.server.script.pop(0) if self.server.script else (200, {})  # type: ignore[attr-defined]
        body = json.dumps(
            {"runs": [], "id": 7}
            if status < 400
            else {"errors": [{"field": "x", "error": f"status {status}"}]}
        ).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[http.server.HTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.calls, server.script = [], []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: http.server.HTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_it_retries_5xx_and_429_then_succeeds(scripted):
    scripted.script = [(503, {}), (500, {}), (429, {"Retry-After": "0.05"})]
    assert Client(url(scripted), "t", retries=5, backoff=0.01).list_runs() == []
    assert len(scripted.calls) == 4


def test_it_gives_up_after_the_retries(scripted):
    scripted.script = [(502, {})] * 10
    with pytest.raises(ApiError) as e:
        Client(url(scripted), "t", retries=2, backoff=0.01).post_groups(1, [])
    assert e.value.status == 502 and e.value.retryable and len(scripted.calls) == 3


def test_it_never_retries_a_4xx(scripted):
    scripted.script = [(400, {}), (200, {})]
    with pytest.raises(ApiError) as e:
        Client(url(scripted), "t", retries=5, backoff=0.01).post_metrics(1, [])
    assert e.value.errors == [{"field": "x", "error": "status 400"}] and len(scripted.calls) == 1


def test_it_does_not_retry_creating_a_run_after_a_500(scripted):
    scripted.script = [(500, {}), (200, {})]
    with pytest.raises(ApiError):
        Client(url(scripted), "t", retries=5, backoff=0.01).create_run("r", "env")
    assert len(scripted.calls) == 1  # the run may exist: a retry could create a second one
    scripted.script, scripted.calls[:] = [(503, {}), (200, {})], []
    assert Client(url(scripted), "t", retries=5, backoff=0.01).create_run("r", "env") == 7
    assert len(scripted.calls) == 2


def test_it_retries_connection_errors_then_reports_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(ApiError) as e:
        Client(f"http://127.0.0.1:{port}", "t", retries=2, backoff=0.01).list_runs()
    assert (
        e.value.status is None and e.value.retryable and "cannot reach the server" in str(e.value)
    )

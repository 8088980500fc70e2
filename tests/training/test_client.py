"""training/client.py against a real server (pytest-django's live_server: a threaded HTTP server in
this process on a transactional database), its retry rules against a scripted local HTTP server, and
training/openrlhf_reward.py with a fake client (unit) and against the live server (end to end)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from training.client import ApiError, Client
from training.openrlhf_reward import batch_to_groups, wrap_reward_func


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
    return {"step": step, "key": key, "prompt": f"prompt {key}",
            "rollouts": [{"index": i, "completion": f"c{i}", "rewards": {"correct": v, "format": 1.0 - v}}
                         for i, v in enumerate(values)]}


# ------------------------------------------------------------------------------------------------ live server


def test_it_creates_a_run_posts_and_reads_it_back(api):
    run_id = api.create_run("remote", environment="remote-env", components=["correct", {"name": "format",
                                                                                        "weight": 0.5}],
                            config={"lr": 1e-5}, kind="grpo")
    assert api.find_run("remote")["id"] == run_id
    assert api.find_run("absent") is None
    assert api.post_groups(run_id, [group(0, "a", [1.0, 0.0, 0.5]), group(1, "b", [0.2, 0.9])]) == {
        "groups": 2, "rollouts": 5, "skipped_groups": 0}
    assert api.post_groups(run_id, [group(0, "a", [1.0, 0.0, 0.5])])["skipped_groups"] == 1  # idempotent retry
    assert api.post_metrics(run_id, [{"step": 0, "values": {"loss": 0.5}}]) == {"metrics": 1}
    g = api.get_group(run_id, 1, "b")
    assert g["size"] == 2 and g["components"]["correct"]["std"] == pytest.approx(0.4949747)
    finished = api.finish(run_id)
    assert finished["status"] == "succeeded"


def test_it_finds_a_run_by_name_however_old_it_is(api):
    from webapp.runs.models import Run

    old_id = api.create_run("old-run", environment="client-env", components=["correct"])
    Run.objects.bulk_create([Run(name=f"newer-{i}") for i in range(501)])  # past the list's 500 newest
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
    assert [r["step"] for r in api.iter_rollouts(run_id, sort="step", order="asc", step_min=3, limit=1)] == [3, 3, 4, 4]


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


# ------------------------------------------------------------------------------------------------ retries


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers) of the server's script."""

    def _answer(self) -> None:
        self.server.calls.append((self.command, self.path))  # type: ignore[attr-defined]
        status, headers = self.server.script.pop(0) if self.server.script else (200, {})  # type: ignore[attr-defined]
        body = json.dumps({"runs": [], "id": 7} if status < 400 else
                          {"errors": [{"field": "x", "error": f"status {status}"}]}).encode()
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
    assert e.value.status is None and e.value.retryable and "cannot reach the server" in str(e.value)


# ------------------------------------------------------------------------------------------------ OpenRLHF wrapper


class FakeClient:
    """Stands in for training.client.Client: records what would be posted; can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.posted: list[tuple[int, list[dict[str, Any]]]] = []
        self.created: list[dict[str, Any]] = []

    def find_run(self, name: str) -> dict[str, Any] | None:
        return None

    def create_run(self, name: str, environment: str, components: list[str], config: dict, **kw: Any) -> int:
        self.created.append({"name": name, "environment": environment, "components": components})
        return 42

    def post_groups(self, run_id: int, groups: list[dict[str, Any]]) -> dict[str, int]:
        if self.fail:
            raise ApiError(None, [{"field": "", "error": "cannot reach the server"}], "POST", "/x")
        self.posted.append((run_id, groups))
        return {"groups": len(groups)}


def openrlhf_batch() -> tuple[list[str], list[str], list[str]]:
    prompts = ["Q: 1+1?", "Q: 1+1?", "Q: 2+2?", "Q: 1+1?", "Q: 2+2?"]
    answers = [" 2", " 3", " 4", " 2", " 5"]
    return [p + a for p, a in zip(prompts, answers)], prompts, ["2", "2", "4", "2", "4"]


def reward_dict(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
    """An OpenRLHF custom reward function in the dict form (torch tensors, as OpenRLHF expects)."""
    import torch

    correct = torch.tensor([float(q.endswith(" " + lab)) for q, lab in zip(queries, labels)])
    return {"rewards": correct + 0.1, "scores": correct,
            "extra_logs": {"correct": correct, "length": torch.tensor([len(q) for q in queries]).float(),
                           "batch_mean": correct.mean()}}


def test_it_passes_the_reward_result_through_unchanged_and_records_groups():
    client = FakeClient()
    wrapped = wrap_reward_func(reward_dict, client=client, run="openrlhf-math", background=False)
    queries, prompts, labels = openrlhf_batch()
    result = wrapped(queries, prompts, labels)
    expected = reward_dict(queries, prompts, labels)
    assert set(result) == {"rewards", "scores", "extra_logs"}
    assert result["rewards"].tolist() == pytest.approx(expected["rewards"].tolist())
    assert client.created == [{"name": "openrlhf-math", "environment": "openrlhf-math",
                               "components": ["correct", "length"]}]  # the scalar extra log is not per sample
    (run_id, groups), = client.posted
    assert run_id == 42 and [len(g["rollouts"]) for g in groups] == [3, 2]
    one = groups[0]
    assert one["prompt"] == "Q: 1+1?" and one["step"] == 0
    assert [r["completion"] for r in one["rollouts"]] == [" 2", " 3", " 2"]
    assert [r["reward"] for r in one["rollouts"]] == pytest.approx([1.1, 0.1, 1.1])
    assert one["rollouts"][1]["rewards"] == {"correct": 0.0, "length": 9.0}
    assert one["rollouts"][1]["state"] == {"label": "2", "score": 0.0}
    assert [r["advantage"] for r in one["rollouts"]] == pytest.approx([0.57735, -1.1547, 0.57735], rel=1e-3)
    wrapped(queries, prompts, labels)
    assert client.posted[1][1][0]["step"] == 1  # the call ordinal: OpenRLHF passes no step


def test_it_returns_a_bare_tensor_unchanged():
    import torch

    client = FakeClient()
    out = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    wrapped = wrap_reward_func(lambda q, p, lab, **kw: out, client=client, run=5, background=False)
    assert wrapped(*openrlhf_batch(), extra="ignored") is out
    assert client.posted[0][0] == 5 and client.created == []


def test_it_spools_a_batch_it_cannot_deliver_and_never_raises(tmp_path):
    spool = tmp_path / "spool.jsonl"
    wrapped = wrap_reward_func(reward_dict, client=FakeClient(fail=True), run=3, spool_path=spool, background=False)
    result = wrapped(*openrlhf_batch())
    assert "rewards" in result
    entry = json.loads(spool.read_text().splitlines()[0])
    assert entry["kind"] == "groups" and len(entry["payload"]["groups"]) == 2  # HttpSink's spool format
    assert wrapped.recorder.spooled == 2


def test_it_survives_a_reward_result_it_cannot_read(caplog):
    client = FakeClient()
    wrapped = wrap_reward_func(lambda q, p, lab: {"rewards": [1.0]}, client=client, run=1, background=False)
    assert wrapped(*openrlhf_batch()) == {"rewards": [1.0]}  # wrong length: logged, not recorded, not raised
    assert client.posted == [] and "could not read this batch" in caplog.text


def test_it_uploads_in_the_background():
    client = FakeClient()
    wrapped = wrap_reward_func(reward_dict, client=client, run=9)
    for _ in range(3):
        wrapped(*openrlhf_batch())
    wrapped.recorder.flush(timeout=10)
    assert len(client.posted) == 3 and wrapped.recorder.sent == 6
    wrapped.recorder.close()


def test_it_keeps_late_components_in_the_state():
    groups = batch_to_groups(["a x"], ["a"], None, {"rewards": [1.0], "extra_logs": {"new": [0.5]}},
                             step=0, call_id="t")
    from training.openrlhf_reward import _unknown_to_state

    _unknown_to_state(groups, {"correct"})
    assert groups[0]["rollouts"][0]["rewards"] == {} and groups[0]["rollouts"][0]["state"]["extra_logs"] == {
        "new": 0.5}


@pytest.mark.slow  # a live server plus torch: several seconds on the shared machine
def test_it_records_openrlhf_batches_into_the_live_server_and_uploads_the_spool(live_server, token, tmp_path):
    from training.sinks import upload_spool
    from webapp.rollouts.models import Group
    from webapp.runs.models import Run

    wrapped = wrap_reward_func(reward_dict, url=live_server.url, token=token, run="orl-live", background=False)
    wrapped(*openrlhf_batch())
    run = Run.objects.get(name="orl-live")
    assert sorted(run.environment.components.values_list("name", flat=True)) == ["correct", "length"]
    assert sorted(Group.objects.filter(run=run).values_list("size", flat=True)) == [2, 3]
    # A batch spooled while the server was away goes up later with the sinks' upload command.
    spool = tmp_path / "spool.jsonl"
    down = wrap_reward_func(reward_dict, client=FakeClient(fail=True), run=run.id, spool_path=spool, background=False)
    down(*openrlhf_batch())
    assert upload_spool(spool, live_server.url, token, run.id) == {"sent": 1, "left": 0}
    assert Group.objects.filter(run=run).count() == 4

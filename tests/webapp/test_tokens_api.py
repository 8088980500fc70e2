"""The token API: a rollout's arrays and a run's per-step token statistics, behind the run's read
permission; tokens ingested through the API itself."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_group
from webapp.rollouts.models import Rollout


def _batch(step: int, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    g = make_group(step, f"p{step}", [{"correct": 1}, {"correct": 0}])
    sampler = -rng.exponential(0.5, n)
    g["rollouts"][0]["tokens"] = {
        "ids": rng.integers(0, 1000, n).tolist(),
        "sampler_logprobs": sampler.tolist(),
        "trainer_logprobs": (sampler - 0.01).tolist(),
        "entropy": rng.exponential(0.3, n).tolist(),
        "loss_mask": [1] * n,
    }
    return {"groups": [g]}


@pytest.fixture
def posted(run, api, personas):
    c = api(personas["trainer"])
    for step in (0, 1, 2):
        res = c.post(f"/api/v1/runs/{run.id}/groups/", _batch(step, 50, step), format="json")
        assert res.status_code == 201, res.json()
    return run


def test_it_serves_a_rollouts_arrays_to_a_viewer(posted, api, personas):
    rid = Rollout.objects.get(step=1, index=0).id
    res = api(personas["viewer"]).get(f"/api/v1/rollouts/{rid}/tokens/")
    assert res.status_code == 200
    data = res.json()
    sent = _batch(1, 50, 1)["groups"][0]["rollouts"][0]["tokens"]
    assert data["n"] == 50 and data["arrays"]["ids"] == sent["ids"]
    assert data["fields"] == ["ids", "sampler_logprobs", "trainer_logprobs", "entropy", "loss_mask"]
    assert data["arrays"]["loss_mask"] == [1] * 50
    assert np.allclose(data["arrays"]["sampler_logprobs"], sent["sampler_logprobs"], rtol=4e-3)
    assert data["summary"]["mismatch"] == pytest.approx(0.01)


def test_it_says_when_a_rollout_has_no_tokens(posted, api, personas):
    rid = Rollout.objects.get(step=1, index=1).id
    res = api(personas["viewer"]).get(f"/api/v1/rollouts/{rid}/tokens/")
    assert res.status_code == 404
    assert res.json()["errors"][0]["field"] == "tokens"
    assert api(personas["viewer"]).get("/api/v1/rollouts/999999/tokens/").status_code == 404


def test_it_serves_per_step_statistics(posted, api, personas):
    res = api(personas["viewer"]).get(f"/api/v1/runs/{posted.id}/token-stats/")
    steps = res.json()["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["tokens"] == 50 and steps[0]["mean_abs_delta"] == pytest.approx(0.01)
    assert steps[0]["masked_fraction"] == 0.0
    since = api(personas["viewer"]).get(f"/api/v1/runs/{posted.id}/token-stats/?since=1")
    assert [s["step"] for s in since.json()["steps"]] == [2]
    bad = api(personas["viewer"]).get(f"/api/v1/runs/{posted.id}/token-stats/?since=x")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "since"


def test_it_refuses_an_anonymous_request(posted, client):
    rid = Rollout.objects.get(step=1, index=0).id
    assert client.get(f"/api/v1/rollouts/{rid}/tokens/").status_code in (401, 403)
    assert client.get(f"/api/v1/runs/{posted.id}/token-stats/").status_code in (401, 403)


def test_a_bad_array_over_the_api_is_a_400_naming_it_and_stores_nothing(run, api, personas):
    body = _batch(0, 10)
    body["groups"][0]["rollouts"][0]["tokens"]["entropy"][4] = -1.0
    res = api(personas["trainer"]).post(f"/api/v1/runs/{run.id}/groups/", body, format="json")
    assert res.status_code == 400
    assert res.json()["errors"][0]["field"] == "groups[0].rollouts[0].tokens.entropy"
    assert Rollout.objects.count() == 0

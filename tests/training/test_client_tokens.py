"""The HTTP client and sink carry token arrays: a batch past the request limit goes as several
requests of whole groups; a single group past it is refused before sending, naming its tokens."""

from __future__ import annotations

import pytest

from tests.training.test_client import api, group, token  # noqa: F401 - fixtures
from training.client import ApiError, Client


def _with_tokens(step: int, key: str, n: int) -> dict:
    g = group(step, key, [1.0, 0.0])
    for r in g["rollouts"]:
        r["tokens"] = {
            "ids": list(range(n)),
            "trainer_logprobs": [-0.5] * n,
            "entropy": [0.25] * n,
            "loss_mask": [1] * n,
        }
    return g


@pytest.mark.django_db(transaction=True)
def test_it_splits_a_large_batch_into_requests_of_whole_groups(
    api,  # noqa: F811
    live_server,
    settings,
):
    from webapp.tokens.models import RolloutTokens, TokenStepStat

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 40_000  # the server refuses one request of the batch

    run_id = api.create_run("tok", environment="tok-env", components=["correct", "format"])
    small = Client(live_server.url, api.token, retries=0, max_body=40_000)
    batch = [_with_tokens(s, f"k{s}", 700) for s in range(4)]  # ~28 kB of JSON each: one a request
    assert small.post_groups(run_id, batch) == {"groups": 4, "rollouts": 8, "skipped_groups": 0}
    assert RolloutTokens.objects.filter(run_id=run_id).count() == 8
    assert TokenStepStat.objects.get(run_id=run_id, step=2).n_tokens == 1400
    again = small.post_groups(run_id, batch)  # a retry stores nothing twice
    assert again["skipped_groups"] == 4 and RolloutTokens.objects.count() == 8


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_group_past_the_limit_naming_its_tokens(api, live_server):  # noqa: F811
    from webapp.rollouts.models import Rollout

    run_id = api.create_run("tok2", environment="tok-env", components=["correct", "format"])
    g = _with_tokens(0, "big", 10)
    g["rollouts"][1]["tokens"] = _with_tokens(0, "x", 3000)["rollouts"][0]["tokens"]
    small = Client(live_server.url, api.token, retries=0, max_body=40_000)
    with pytest.raises(ApiError) as e:
        small.post_groups(run_id, [_with_tokens(1, "ok", 10), g])
    assert e.value.status == 413 and not e.value.retryable
    assert e.value.errors[0]["field"] == "groups[1].rollouts[1].tokens"
    assert "request limit" in e.value.errors[0]["error"]
    assert Rollout.objects.count() == 0  # checked before anything was sent


@pytest.mark.django_db(transaction=True)
def test_it_sends_base64_arrays_raw_in_binary_bodies_split_to_fit(
    api,  # noqa: F811
    live_server,
    settings,
):
    """The recorder's base64 arrays go as binary bodies (training/token_wire.py), each under the
    limit, and are stored as the same values."""
    import numpy as np

    from training.token_wire import bound
    from webapp.tokens.models import RolloutTokens

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 40_000
    run_id = api.create_run("tok3", environment="tok-env", components=["correct", "format"])
    batch = _with_tokens_b64(4, 1000)
    assert all(20_000 < bound(g) < 40_000 for g in batch)  # two groups do not fit one request
    small = Client(live_server.url, api.token, retries=0, max_body=40_000)
    assert small.post_groups(run_id, batch) == {"groups": 4, "rollouts": 8, "skipped_groups": 0}
    stored = RolloutTokens.objects.filter(run_id=run_id).order_by("rollout_id")[0].arrays()
    assert stored.ids.tolist() == list(range(1000))
    assert np.allclose(stored.entropy, 0.25) and stored.loss_mask.all()
    tiny = Client(live_server.url, api.token, retries=0, max_body=20_000)
    with pytest.raises(ApiError) as e:  # one group past the limit: refused before sending
        tiny.post_groups(run_id, _with_tokens_b64(1, 1000))
    assert e.value.status == 413 and e.value.errors[0]["field"].startswith("groups[0].rollouts")


def _with_tokens_b64(groups: int, n: int) -> list[dict]:
    from training.token_capture import pack

    out = []
    for s in range(groups):
        g = _with_tokens(s, f"b{s}", n)
        for r in g["rollouts"]:
            t = r["tokens"]
            r["tokens"] = {
                "ids": pack(t["ids"], "int32"),
                "trainer_logprobs": pack(t["trainer_logprobs"], "float32"),
                "entropy": pack(t["entropy"], "float32"),
                "loss_mask": t["loss_mask"],  # a list among raw arrays stays JSON
            }
        out.append(g)
    return out

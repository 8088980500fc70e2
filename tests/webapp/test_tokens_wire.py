"""Token arrays in a binary request body (training/token_wire.py) over the ingestion API: stored as
the JSON forms store them, every bad-input rule a 400 naming the rollout and field with nothing of
the batch stored; and the codec's writer (zstandard, level 1) against blobs of the earlier one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import make_group
from training import token_wire
from webapp.rollouts.models import Group, Rollout
from webapp.tokens import codec
from webapp.tokens.models import RolloutTokens, TokenStepStat


def _arrays(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sampler = -rng.exponential(0.5, n).astype(np.float32)
    return {
        "ids": rng.integers(0, 1000, n).astype(np.int32),
        "sampler_logprobs": sampler,
        "trainer_logprobs": np.minimum(sampler + rng.normal(0, 0.01, n), 0).astype(np.float32),
        "entropy": rng.exponential(0.3, n).astype(np.float32),
        "loss_mask": (rng.random(n) < 0.8).astype(np.uint8),
    }


def _batch(tokens: list[dict]) -> dict:
    groups = []
    for i, t in enumerate(tokens):
        g = make_group(0, f"p{i}", [{"correct": 1}, {"correct": 0}])
        g["rollouts"][1]["tokens"] = t
        groups.append(g)
    return {"groups": groups}


def _post(api, personas, run, raw: bytes):
    return api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/groups/", raw, content_type=token_wire.CONTENT_TYPE
    )


def test_it_stores_a_binary_body_as_it_stores_json_lists(run, api, personas):
    a = _arrays(300)
    res = _post(api, personas, run, token_wire.encode(_batch([a])))
    assert res.status_code == 201, res.json()
    stored = RolloutTokens.objects.get().arrays()
    assert stored.ids.tolist() == a["ids"].tolist()
    assert stored.loss_mask.tolist() == a["loss_mask"].astype(bool).tolist()
    assert np.allclose(stored.entropy, a["entropy"], rtol=4e-3, atol=1e-6)
    binary = TokenStepStat.objects.get().as_dict()
    RolloutTokens.objects.all().delete()
    TokenStepStat.objects.all().delete()
    Group.objects.all().delete()
    lists = {k: v.tolist() for k, v in a.items()}
    c = api(personas["trainer"])
    res = c.post(f"/api/v1/runs/{run.id}/groups/", _batch([lists]), format="json")
    assert res.status_code == 201
    assert TokenStepStat.objects.get().as_dict() == pytest.approx(binary)


def _bad(case: str) -> tuple[dict, str, str]:
    """A second rollout's token arrays broken one way, the field the 400 names, words of it."""
    a = _arrays(40, seed=1)
    if case == "unequal":
        a["entropy"] = a["entropy"][:39]
        return a, "entropy", "has 39 elements; ids has 40"
    if case == "nan":
        a["trainer_logprobs"][7] = np.nan
        return a, "trainer_logprobs", "finite"
    if case == "inf":
        a["sampler_logprobs"][3] = -np.inf
        return a, "sampler_logprobs", "finite"
    if case == "positive":
        a["sampler_logprobs"][5] = 0.5
        return a, "sampler_logprobs", "must be <= 0; element 5"
    if case == "id":
        a["ids"][2] = -4
        return a, "ids", "ids must be >= 0"
    a["loss_mask"][0] = 2
    return a, "loss_mask", "0 or 1"


@pytest.mark.parametrize("case", ["unequal", "nan", "inf", "positive", "id", "mask"])
def test_a_bad_binary_array_is_a_400_naming_the_rollout_and_field(run, api, personas, case):
    bad, field, words = _bad(case)
    res = _post(api, personas, run, token_wire.encode(_batch([_arrays(30), bad])))
    assert res.status_code == 400
    err = res.json()["errors"][0]
    assert err["field"] == f"groups[1].rollouts[1].tokens.{field}" and words in err["error"]
    assert Rollout.objects.count() == 0 and RolloutTokens.objects.count() == 0


def test_a_reference_past_the_data_or_a_short_body_is_refused(run, api, personas):
    raw = token_wire.encode(_batch([_arrays(30)]))
    res = _post(api, personas, run, raw[:-8])  # the last array's bytes cut short
    assert res.status_code == 400
    err = res.json()["errors"][0]
    assert err["field"] == "groups[0].rollouts[1].tokens.loss_mask.at"
    assert "run past the data section" in err["error"]
    for short in (b"\x01", b"\xff\x00\x00\x00{}"):
        res = _post(api, personas, run, short)
        assert res.status_code == 400 and res.json()["errors"][0]["field"] == "body"
    assert Rollout.objects.count() == 0


def test_a_binary_body_past_the_request_limit_is_refused(run, api, personas, settings):
    raw = token_wire.encode(_batch([_arrays(3000)]))
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = len(raw) - 1
    res = _post(api, personas, run, raw)
    assert res.status_code == 400 and "larger than" in res.json()["errors"][0]["error"]
    assert Rollout.objects.count() == 0


def _blob_of_the_earlier_writer(t: codec.TokenArrays) -> bytes:
    """What the codec wrote before zstandard (pyarrow's zstd at level 3, the same layout)."""
    old = pa.Codec("zstd", compression_level=3)
    flags, streams = codec._streams(t)
    frames = [old.compress(bytes(s), asbytes=True) if len(s) else b"" for s in streams]
    sizes = np.array([(len(s), len(f)) for s, f in zip(streams, frames, strict=True)], "<u4")
    return codec.HEADER.pack(codec.MAGIC, 1, flags, len(t)) + sizes.tobytes() + b"".join(frames)


def test_blobs_of_the_earlier_writer_and_of_this_one_decode_alike():
    a = _arrays(500, seed=2)
    t = codec.TokenArrays(**{k: v.astype(bool) if k == "loss_mask" else v for k, v in a.items()})
    t.text = [f"w{i}" for i in range(500)]
    old, new = codec.decode(_blob_of_the_earlier_writer(t)), codec.decode(codec.encode(t))
    for name in t.present():
        assert np.array_equal(np.asarray(getattr(old, name)), np.asarray(getattr(new, name)))


def _f16_reference(a: np.ndarray) -> np.ndarray:
    """The rounding as first written: clip, float16, round the bit pattern in uint32."""
    bits = np.clip(a, -codec.F16_MAX, codec.F16_MAX).astype("<f2").view("<u2").astype(np.uint32)
    bits = (bits + (1 << (codec._DROP - 1))) >> codec._DROP << codec._DROP
    return bits.astype("<u2").view("<f2")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_float16_rounding_matches_the_reference_below_its_clip(dtype):
    rng = np.random.default_rng(3)
    a = np.concatenate(
        [-rng.exponential(1.0, 5000), rng.normal(0, 1e-6, 500), rng.uniform(-59_000, 59_000, 500)]
    ).astype(dtype)
    assert np.array_equal(codec._f16(a).view("<u2"), _f16_reference(a).view("<u2"))
    big = np.array([-1e9, 65_500, 70_000], dtype=dtype)
    assert np.isfinite(codec._f16(big).astype(np.float32)).all()

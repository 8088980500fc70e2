"""Token arrays through the ingestion service: round trip, per-step and per-rollout statistics
against numpy, bad input refused by field with nothing of the batch stored."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import make_group
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, Rollout
from webapp.tokens.models import RolloutTokens, TokenStepStat


def _tokens(rng: np.random.Generator, n: int, drift: float = 0.0) -> dict:
    """A realistic shape: most tokens confident, a tail of uncertain ones, a trainer pass that
    differs from the sampler by bf16-sized noise (plus `drift`), the last quarter a tool output."""
    sampler = np.where(rng.random(n) < 0.7, -rng.exponential(0.01, n), -rng.exponential(1.5, n))
    trainer = np.minimum(sampler + rng.normal(drift, 0.01, n), 0.0)
    mask = np.ones(n, dtype=int)
    turn = np.zeros(n, dtype=int)
    turn[3 * n // 4 :] = 1
    mask[3 * n // 4 :] = 0
    return {
        "ids": rng.integers(0, 50_000, n).tolist(),
        "offsets": np.arange(n).tolist(),
        "sampler_logprobs": sampler.tolist(),
        "trainer_logprobs": trainer.tolist(),
        "entropy": np.abs(sampler * 2 + rng.normal(0, 0.001, n)).tolist(),
        "advantages": [0.5] * n,
        "loss_mask": mask.tolist(),
        "turn": turn.tolist(),
    }


def _group(step: int, key: str, tokens: list[dict | None]) -> dict:
    g = make_group(step, key, [{"correct": i % 2} for i in range(len(tokens))])
    for r, t in zip(g["rollouts"], tokens, strict=True):
        del r["completion"]
        r["transcript"] = [
            {"role": "assistant", "content": "let me call the tool"},
            {"role": "tool", "content": "42"},
        ]
        if t is not None:
            r["tokens"] = t
    return g


def test_it_round_trips_every_array(run):
    rng = np.random.default_rng(1)
    t = _tokens(rng, 300)
    t["text"] = [f"t{i}" for i in range(300)]
    ingest_groups(run, {"groups": [_group(0, "p", [t, None])]})
    stored = RolloutTokens.objects.get()
    assert Rollout.objects.count() == 2 and stored.rollout.index == 0
    a = stored.arrays()
    assert a.ids.tolist() == t["ids"] and a.offsets.tolist() == t["offsets"]
    assert a.text == t["text"] and a.turn.tolist() == t["turn"]
    assert a.loss_mask.astype(int).tolist() == t["loss_mask"]
    for name in ("sampler_logprobs", "entropy", "advantages"):
        sent = np.array(t[name])
        assert np.allclose(getattr(a, name), sent, rtol=4e-3, atol=1e-6), name
    # The trainer's is read back as sampler + delta: off by the sampler's rounding at most.
    sampler, trainer = np.array(t["sampler_logprobs"]), np.array(t["trainer_logprobs"])
    scale = np.maximum(np.abs(sampler), np.abs(trainer))
    assert (np.abs(a.trainer_logprobs - trainer) <= 4e-3 * scale + 1e-6).all()
    delta = np.array(t["trainer_logprobs"]) - np.array(t["sampler_logprobs"])
    assert np.allclose(a.trainer_logprobs - a.sampler_logprobs, delta, rtol=1e-2, atol=2e-3)
    assert stored.fields == "ids,offsets,text,sampler_logprobs,trainer_logprobs,entropy," + (
        "advantages,loss_mask,turn"
    )


def test_it_computes_step_and_rollout_statistics_as_numpy_does(run):
    rng = np.random.default_rng(2)
    sent = [_tokens(rng, n, drift) for n, drift in ((400, 0.0), (250, 0.3), (333, -0.9))]
    ingest_groups(run, {"groups": [_group(5, "a", sent[:2])]})
    ingest_groups(run, {"groups": [_group(5, "b", sent[2:])]})  # a second batch adds to step 5
    keep = [np.array(t["loss_mask"]) == 1 for t in sent]
    d = np.concatenate(
        [
            (np.array(t["trainer_logprobs"]) - np.array(t["sampler_logprobs"]))[k]
            for t, k in zip(sent, keep, strict=True)
        ]
    )
    ent = np.concatenate([np.array(t["entropy"])[k] for t, k in zip(sent, keep, strict=True)])
    s = TokenStepStat.objects.get(run=run, step=5)
    ratio = np.exp(d)
    assert s.n_tokens == 983 and s.n_rollouts == 3 and s.n_pairs == d.size
    assert s.mean_abs_delta == pytest.approx(np.abs(d).mean())
    assert s.k3 == pytest.approx(np.mean(ratio - 1 - d))
    assert s.ratio_out_fraction == pytest.approx(np.mean((ratio < 0.5) | (ratio > 2)))
    assert s.max_abs_delta == pytest.approx(np.abs(d).max())
    assert s.mean_entropy == pytest.approx(ent.mean())
    assert s.low_entropy_fraction == pytest.approx(np.mean(ent < 0.01))
    masks = np.concatenate([t["loss_mask"] for t in sent])
    assert s.masked_fraction == pytest.approx(np.mean(masks == 0))
    assert s.n_tool_unmasked == 0
    second = RolloutTokens.objects.get(rollout__group__key="a", rollout__index=1)
    d1 = (np.array(sent[1]["trainer_logprobs"]) - np.array(sent[1]["sampler_logprobs"]))[keep[1]]
    assert second.mismatch == pytest.approx(np.abs(d1).mean())
    assert second.mean_entropy == pytest.approx(np.array(sent[1]["entropy"])[keep[1]].mean())
    assert second.masked_fraction == pytest.approx(0.25, abs=0.01)
    assert second.tool_unmasked == 0


def test_it_counts_tool_output_tokens_left_in_the_loss(run):
    t = _tokens(np.random.default_rng(3), 40)
    t["loss_mask"] = [1] * 40  # the masking bug: the tool's 10 tokens are trained on
    ingest_groups(run, {"groups": [_group(0, "p", [t])]})
    assert RolloutTokens.objects.get().tool_unmasked == 10
    assert TokenStepStat.objects.get().n_tool_unmasked == 10


def _refused(run, t: dict) -> FieldError:
    rng = np.random.default_rng(4)
    good = _group(0, "good", [_tokens(rng, 20)])
    with pytest.raises(FieldError) as e:
        ingest_groups(run, {"groups": [good, _group(0, "bad", [_tokens(rng, 20), t])]})
    assert Group.objects.count() == 0 and RolloutTokens.objects.count() == 0
    assert TokenStepStat.objects.count() == 0
    return e.value


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("sampler_logprobs", [-0.1] * 19, "has 19 elements"),
        ("trainer_logprobs", [-0.1] * 19 + [0.5], "must be <= 0; element 19 is 0.5"),
        ("entropy", [1.0] * 19 + [-2.0], "must be >= 0"),
        ("ids", [1] * 19 + [2**31], "ids must be >= 0 and < 2147483648"),
        ("ids", [1] * 19 + [-1], "element 19 is -1"),
        ("ids", [1.5] * 20, "must be a flat list of integers"),
        ("loss_mask", [1] * 19 + [2], "must be 0 or 1"),
        ("turn", [0] * 19 + [2], "must index the transcript's 2 messages"),
        ("advantages", "x", "must be a list of numbers"),
        ("text", ["a"] * 3, "must be a list of 20 strings"),
    ],
)
def test_it_refuses_a_bad_array_naming_the_rollout_and_field(run, field, value, words):
    t = _tokens(np.random.default_rng(5), 20)
    t[field] = value
    e = _refused(run, t)
    assert e.field == f"groups[1].rollouts[1].tokens.{field}"
    assert words in e.message


def test_it_refuses_non_finite_log_probs(run):
    t = _tokens(np.random.default_rng(6), 20)
    t["sampler_logprobs"][3] = float("nan")
    e = _refused(run, t)
    assert e.field == "groups[1].rollouts[1].tokens.sampler_logprobs"
    assert "finite" in e.message and "element 3" in e.message


def test_it_refuses_ids_past_the_runs_vocabulary(run):
    run.config = {"vocab_size": 1000}
    run.save()
    t = _tokens(np.random.default_rng(7), 20)
    t["ids"][7] = 1000
    e = _refused(run, t)
    assert e.field.endswith("tokens.ids") and "< 1000 (the run's vocab_size)" in e.message


def test_it_refuses_a_rollout_past_the_token_limit(run, settings):
    settings.TOKENS_MAX_PER_ROLLOUT = 10
    e = _refused(run, _tokens(np.random.default_rng(8), 20))
    assert e.field == "groups[0].rollouts[0].tokens.ids" and "limit is 10" in e.message


def test_it_refuses_unknown_token_fields_and_missing_ids(run):
    t = _tokens(np.random.default_rng(9), 20)
    t["logprobs"] = t.pop("sampler_logprobs")
    assert _refused(run, t).field == "groups[1].rollouts[1].tokens.logprobs"
    assert _refused(run, {"entropy": [0.1]}).field == "groups[1].rollouts[1].tokens.ids"


def test_it_stores_nothing_when_a_later_write_fails(run, monkeypatch):
    from webapp.tokens import ingest

    def boom(*args):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(ingest, "upsert_steps", boom)  # after the token rows were written
    with pytest.raises(RuntimeError):
        ingest_groups(run, {"groups": [_group(0, "p", [_tokens(np.random.default_rng(1), 30)])]})
    assert (Rollout.objects.count(), RolloutTokens.objects.count()) == (0, 0)


def test_a_retried_batch_adds_no_tokens_twice(run):
    body = {"groups": [_group(0, "p", [_tokens(np.random.default_rng(1), 30)])]}
    ingest_groups(run, body)
    ingest_groups(run, body)
    assert RolloutTokens.objects.count() == 1
    assert TokenStepStat.objects.get().n_tokens == 30


def _b64(values, dtype: str) -> dict:
    import base64

    raw = np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    return {"dtype": dtype, "data": base64.b64encode(raw).decode()}


def test_it_takes_arrays_as_base64_binary_like_lists(run):
    t = _tokens(np.random.default_rng(10), 64)
    binary = {
        "ids": _b64(t["ids"], "int32"),
        "sampler_logprobs": _b64(t["sampler_logprobs"], "float32"),
        "trainer_logprobs": _b64(t["trainer_logprobs"], "float64"),
        "entropy": _b64(t["entropy"], "float16"),
        "loss_mask": _b64(t["loss_mask"], "uint8"),
        "turn": t["turn"],  # the two forms mix
    }
    ingest_groups(run, {"groups": [_group(0, "p", [binary])]})
    a = RolloutTokens.objects.get().arrays()
    assert a.ids.tolist() == t["ids"] and a.loss_mask.astype(int).tolist() == t["loss_mask"]
    assert np.allclose(a.sampler_logprobs, t["sampler_logprobs"], rtol=4e-3, atol=1e-6)
    s = TokenStepStat.objects.get()
    keep = np.array(t["loss_mask"]) == 1
    assert s.mean_abs_delta == pytest.approx(
        np.abs(np.array(t["trainer_logprobs"]) - np.float32(t["sampler_logprobs"]))[keep].mean()
    )


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"dtype": "float32", "data": "AAAAAA=="}, "entropy", "has 1 elements; ids has 3"),
        ({"dtype": "float32", "data": "not base64!"}, "entropy.data", "not valid base64"),
        ({"dtype": "float32", "data": "AAA="}, "entropy.data", "whole number of float32"),
        ({"dtype": "complex64", "data": ""}, "entropy", "dtype one of"),
        ({"dtype": "float32"}, "entropy", "dtype one of"),
    ],
)
def test_it_refuses_bad_binary_arrays_by_field(run, value, field, words):
    t = _tokens(np.random.default_rng(11), 20)
    t["ids"] = t["ids"][:3]
    for k in ("sampler_logprobs", "trainer_logprobs", "advantages", "loss_mask", "turn", "offsets"):
        t[k] = t[k][:3]
    t["entropy"] = value
    e = _refused(run, t)
    assert e.field == f"groups[1].rollouts[1].tokens.{field}" and words in e.message


def test_it_refuses_float_ids_sent_as_binary_and_nan_in_binary(run):
    t = _tokens(np.random.default_rng(12), 20)
    t["ids"] = _b64(t["ids"], "float32")
    assert _refused(run, t).field == "groups[1].rollouts[1].tokens.ids.dtype"
    t = _tokens(np.random.default_rng(12), 20)
    t["trainer_logprobs"] = _b64([np.nan] + t["trainer_logprobs"][1:], "float32")
    e = _refused(run, t)
    assert e.field.endswith("tokens.trainer_logprobs") and "finite" in e.message


def test_it_refuses_token_text_it_cannot_store(run):
    t = _tokens(np.random.default_rng(13), 20)
    t["text"] = ["a"] * 19 + ["\udc80"]
    e = _refused(run, t)
    assert e.field == "groups[1].rollouts[1].tokens.text" and "element 19" in e.message


_element = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrays=st.dictionaries(
        st.sampled_from(
            ["ids", "text", "sampler_logprobs", "entropy", "loss_mask", "turn", "offsets", "x"]
        ),
        st.one_of(
            st.lists(_element, max_size=4),
            st.dictionaries(st.sampled_from(["dtype", "data"]), st.text(max_size=8), max_size=2),
            _element,
        ),
        max_size=4,
    )
)
def test_any_tokens_object_is_stored_whole_or_refused_by_field(run, arrays):
    body = {"groups": [_group(0, "fuzz", [arrays])]}
    try:
        ingest_groups(run, body)
    except FieldError as e:
        assert e.field.startswith("groups[0].rollouts[0].tokens"), e.errors
        assert Group.objects.count() == 0
        return
    stored = RolloutTokens.objects.get(rollout__group__key="fuzz")
    assert stored.n_tokens == len(arrays["ids"])
    Group.objects.all().delete()

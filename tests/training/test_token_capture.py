"""The recorder's per-token arrays, from real TRL GRPO runs on the tiny model (shrunken arguments as
in test_recorder.py, each shrink said there). The recorded values are checked against the model
itself and against what TRL logs, never against the recorder's own arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.test_recorder import _grpo_trainer
from training.sinks import MemorySink
from training.token_capture import unpack


def _spy_on_generation(trainer) -> list[dict]:
    """Each generation's completion ids and the model's own log-probs of them, computed here by a
    separate forward pass at generation time (the weights the loss pass of GA=1 also uses)."""
    import torch

    seen: list[dict] = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logits = trainer.model(input_ids=ids, attention_mask=mask).logits
        k = out["completion_ids"].shape[1]
        logps = torch.log_softmax(logits[:, -k - 1 : -1].float() / trainer.temperature, dim=-1)
        chosen = logps.gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)
        seen.append({"ids": out["completion_ids"].tolist(), "logps": chosen.tolist()})
        return out

    trainer._generate_and_score_completions = spy
    return seen


def _rollouts(sink: MemorySink, step: int) -> list[dict]:
    return [r for g in sink.groups if g["step"] == step for r in g["rollouts"]]


@pytest.mark.slow
def test_it_records_ids_trainer_logprobs_entropies_and_masks_from_trl(tiny_model, tmp_path):
    from training.recorder import RolloutRecorder

    trainer = _grpo_trainer(tiny_model, tmp_path)
    generations = _spy_on_generation(trainer)
    sink = MemorySink()
    RolloutRecorder.attach(trainer, sink, background=False)
    trainer.train()

    tok = trainer.processing_class
    for step, gen in zip((1, 2, 3), generations, strict=True):
        rollouts = _rollouts(sink, step)
        assert len(rollouts) == 8
        for row, r in enumerate(rollouts):
            t = {k: unpack(v) for k, v in r["tokens"].items()}
            n = len(t["ids"])
            assert n == r["length"] and t["ids"].tolist() == gen["ids"][row][:n]
            assert {len(t[k]) for k in t} == {n}
            assert "sampler_logprobs" not in t  # no vLLM: TRL has no sampler log-probs
            np.testing.assert_allclose(t["trainer_logprobs"], gen["logps"][row][:n], atol=2e-4)
            assert all(e >= 0 for e in t["entropy"]) and max(t["entropy"]) > 0.01
            assert t["loss_mask"].tolist() == [1] * n
            assert t["advantages"].tolist() == [pytest.approx(r["advantage"], abs=1e-5)] * n
            assert "".join(t["text"]) == tok.decode(t["ids"])
        # TRL's logged entropy of the step is the mean over the loss pass's unmasked tokens.
        logged = next(
            m["values"]["entropy"]
            for m in sink.metrics
            if m["step"] == step and "entropy" in m["values"]
        )
        ours = np.concatenate([unpack(r["tokens"]["entropy"]) for r in rollouts])
        assert ours.mean() == pytest.approx(logged, rel=1e-3)


@pytest.mark.slow
def test_it_records_the_reference_models_logprobs_when_beta_is_set(tiny_model, tmp_path):
    from training.recorder import RolloutRecorder

    trainer = _grpo_trainer(tiny_model, tmp_path, beta=0.1, max_steps=2)
    sink = MemorySink()
    RolloutRecorder.attach(trainer, sink, background=False, token_text=False)
    trainer.train()
    rollouts = _rollouts(sink, 2)
    assert rollouts and all(
        len(unpack(r["tokens"]["ref_logprobs"])) == len(unpack(r["tokens"]["ids"]))
        for r in rollouts
    )
    assert all("text" not in r["tokens"] for r in rollouts)
    ref = np.concatenate([unpack(r["tokens"]["ref_logprobs"]) for r in rollouts])
    trained = np.concatenate([unpack(r["tokens"]["trainer_logprobs"]) for r in rollouts])
    assert (ref <= 0).all() and np.abs(ref - trained).max() > 1e-4  # step 2: the policy moved


@pytest.mark.slow
def test_tokens_can_be_turned_off(tiny_model, tmp_path):
    from training.recorder import RolloutRecorder

    trainer = _grpo_trainer(tiny_model, tmp_path, max_steps=1)
    sink = MemorySink()
    RolloutRecorder.attach(trainer, sink, background=False, tokens=False)
    trainer.train()
    assert sink.groups and all("tokens" not in r for g in sink.groups for r in g["rollouts"])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_run_posts_its_tokens_through_the_http_sink(tiny_model, tmp_path, live_server):
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from tests.conftest import PASSWORD
    from training.client import Client
    from training.recorder import RolloutRecorder
    from webapp.accounts.roles import set_role
    from webapp.tokens.models import RolloutTokens, TokenStepStat

    user = get_user_model().objects.create_user(username="bot", password=PASSWORD)
    set_role(user, "trainer")
    key = Token.objects.create(user=user).key
    run_id = Client(live_server.url, key).create_run(
        "tokens-e2e", environment="tok-grpo", components=["distinct_chars", "has_digit"]
    )
    trainer = _grpo_trainer(tiny_model, tmp_path, max_steps=2)
    recorder = RolloutRecorder.attach(
        trainer, url=live_server.url, token=key, run=run_id, spool=str(tmp_path / "s")
    )
    trainer.train()
    recorder.close()
    assert RolloutTokens.objects.filter(run_id=run_id).count() == 16
    stats = {s.step: s for s in TokenStepStat.objects.filter(run_id=run_id)}
    assert set(stats) == {1, 2} and all(
        s.n_tokens > 0 and s.mean_entropy > 0 for s in stats.values()
    )
    assert all(s.n_pairs == 0 for s in stats.values())  # no sampler log-probs without vLLM
    row = RolloutTokens.objects.filter(run_id=run_id).first()
    assert row.fields == "ids,text,trainer_logprobs,entropy,advantages,loss_mask"
    assert row.masked_fraction == 0.0 and row.mismatch is None

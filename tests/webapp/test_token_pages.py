"""The token view's pages: the transcript's token panel (or the line saying none were recorded),
the JSON it fetches, the dashboard's token charts (live too), and the token findings of the
diagnostics with their onset, on multi-turn rollouts stored through the ingestion service."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.demo_tokens import rollout_tokens
from webapp.diagnostics.links import with_links
from webapp.diagnostics.services import diagnose_run
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout

HOSTILE = "<script>window.__pwned=1</script>"


def transcript(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You write code."},
        {"role": "user", "content": "Write add(a, b)."},
        {"role": "assistant", "content": f"Let me test it {i}.", "tool_calls": [{"name": "run"}]},
        {"role": "tool", "name": "unit_tests", "content": f"{HOSTILE} 2 passed"},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
    ]


def groups(
    steps: int,
    drift: int | None = None,
    leak: int | None = None,
    tokens: bool = True,
    seed: int = 0,
    per_step: int = 2,
    collapse: int | None = None,
) -> list[dict]:
    """Groups of 4 multi-turn rollouts per step, with tokens whose sampler drifts from step
    `drift` on, whose tool output is in the loss from step `leak` on, and whose entropy collapses
    from step `collapse` on (7 tokens in 10 near certain, the rest a third as uncertain)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        for g in range(per_step):
            rollouts = []
            for i in range(4):
                r = {
                    "index": i,
                    "transcript": transcript(i),
                    "rewards": {"correct": float((i + s + g) % 2), "format": 1.0, "penalty": 0.0},
                }
                if tokens:
                    t = rollout_tokens(r["transcript"], 0.5, s, steps, rng, drift_step=drift)
                    if leak is not None and s >= leak:
                        t["loss_mask"] = [1] * len(t["ids"])
                    if collapse is not None and s >= collapse:
                        t["entropy"] = [
                            1e-4 if k % 10 < 7 else e / 3 for k, e in enumerate(t["entropy"])
                        ]
                    r["tokens"] = t
                rollouts.append(r)
            out.append({"step": s, "key": f"p{g}", "prompt": "Write add", "rollouts": rollouts})
    return out


@pytest.fixture
def token_run(run):
    ingest_groups(run, {"groups": groups(30, drift=18)})
    return run


def test_a_rollout_without_tokens_shows_the_page_with_a_line_saying_so(client_as, run):
    ingest_groups(run, {"groups": groups(1, tokens=False)})
    rollout = Rollout.objects.first()
    page = client_as("viewer").get(f"/rollouts/{rollout.id}/")
    body = page.content.decode()
    assert page.status_code == 200
    assert "No tokens were recorded for this rollout" in body
    assert 'id="token-view"' not in body and "tokens.js" not in body
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in body  # the transcript, escaped
    missing = client_as("viewer").get(f"/rollouts/{rollout.id}/tokens.json")
    assert missing.status_code == 404 and "no tokens were recorded" in missing.json()["error"]


def test_the_transcript_offers_the_panel_without_reading_the_tokens(client_as, token_run):
    rollout = Rollout.objects.order_by("id").first()
    n = len(rollout.tokens.arrays())
    client = client_as("viewer")
    page = client.get(f"/rollouts/{rollout.id}/")
    body = page.content.decode()
    assert f'data-n="{n}"' in body and f'data-src="/rollouts/{rollout.id}/tokens.json"' in body
    assert 'id="token-body" hidden' in body and "Show tokens" in body
    assert 'plotly.min.js" defer' not in body  # plotly is fetched by the panel, when it opens
    client.cookies["tokens_open"] = "1"
    opened = client.get(f"/rollouts/{rollout.id}/").content.decode()
    assert 'id="token-body" hidden' not in opened and "data-open" in opened


def test_the_tokens_json_carries_every_value_the_card_shows(client_as, token_run):
    rollout = Rollout.objects.order_by("id").first()
    stored = rollout.tokens.arrays()
    r = client_as("viewer").get(f"/rollouts/{rollout.id}/tokens.json")
    assert r.status_code == 200 and r["Content-Type"] == "application/json"
    data = r.json()
    n = len(stored)
    assert data["n"] == n and data["ids"] == stored.ids.tolist()
    # Token text is the turn's content cut at the offsets: the tool turn's hostile text is a JSON
    # string, never markup (the page sets it with textContent).
    tool_text = "".join(t for t, turn in zip(data["text"], data["turn"], strict=True) if turn == 3)
    assert tool_text == f"{HOSTILE} 2 passed"
    assert [(t["turn"], t["role"]) for t in data["turns"]] == [
        (2, "assistant"),
        (3, "tool"),
        (4, "assistant"),
    ]
    tool = [i for i, t in enumerate(data["turn"]) if t == 3]
    assert {data["loss_mask"][i] for i in tool} == {0}
    assert data["arrays"]["sampler_logprobs"][5] == pytest.approx(
        float(stored.sampler_logprobs[5]), rel=1e-3
    )
    assert {q["key"] for q in data["quantities"] if q["available"]} == {
        "sampler",
        "trainer",
        "mismatch",
        "entropy",
        "advantage",
    }
    assert set(data["figures"]) == {"sampler", "trainer", "mismatch", "entropy", "advantage"}


def test_the_tokens_json_needs_a_login(client_as, token_run):
    rollout = Rollout.objects.first()
    r = client_as(None).get(f"/rollouts/{rollout.id}/tokens.json")
    assert r.status_code in (302, 401, 403)
    assert b"sampler" not in r.content


def test_the_dashboard_charts_the_run_tokens_per_step(client_as, token_run, run):
    body = client_as("viewer").get(f"/runs/{token_run.id}/").content.decode()
    figures = json.loads(
        body.split('id="dashboard-figures" type="application/json">')[1].split("<")[0]
    )
    for chart in ("tokens-mismatch", "tokens-offpolicy", "tokens-entropy", "tokens-masked"):
        assert f'data-chart="{chart}"' in body
        assert figures[chart]["data"][0]["x"] == list(range(30))
    mean = figures["tokens-mismatch"]["data"][0]["y"]
    assert max(mean[:18]) < 0.02 < 0.08 < min(mean[18:])


def test_a_run_without_tokens_has_no_token_charts(client_as, run):
    ingest_groups(run, {"groups": groups(3, tokens=False)})
    body = client_as("viewer").get(f"/runs/{run.id}/").content.decode()
    assert "tokens-mismatch" not in body and 'id="token-charts"' not in body


def test_the_live_dashboard_gets_the_new_token_points(client_as, run):
    ingest_groups(run, {"groups": groups(4)})
    r = client_as("viewer").get(f"/runs/{run.id}/live.json?version=old&since=2").json()
    points = r["points"]["tokens-entropy"]
    assert points["x"] == [[2, 3], [2, 3]] and len(points["y"][0]) == 2


def test_the_diagnostics_flag_the_planted_mismatch_at_its_onset(client_as, token_run):
    findings = diagnose_run(token_run, window=None)["findings"]
    mismatch = [f for f in findings if f["code"] == "token_mismatch"]
    assert len(mismatch) == 1 and mismatch[0]["onset_step"] == 18
    assert "since step 18" in mismatch[0]["title"]
    # Its example transcripts: the explorer from the onset on, sorted by mismatch where it can.
    link = with_links(token_run.id, mismatch)[0]["link"]
    assert (
        "sort=tokens.mismatch" in link
        and "step_min=18" in link
        and client_as("viewer").get(link).status_code == 200
    )
    page = client_as("viewer").get(f"/diagnostics/runs/{token_run.id}/").content.decode()
    assert "Sampler/trainer mismatch rising since step 18" in page
    assert not [f for f in findings if f["code"] in ("entropy_collapse", "tool_tokens_in_loss")]


def test_the_diagnostics_flag_tool_output_in_the_loss_and_are_quiet_when_healthy(run, env3):
    from webapp.rollouts.services import create_run

    ingest_groups(run, {"groups": groups(20, leak=8)})
    found = {f["code"]: f for f in diagnose_run(run, window=None)["findings"]}
    assert found["tool_tokens_in_loss"]["onset_step"] == 8
    assert found["tool_tokens_in_loss"]["severity"] == "critical"
    assert "token_mismatch" not in found

    healthy = create_run(name="healthy", kind="import", environment=env3, config={})
    ingest_groups(healthy, {"groups": groups(20, seed=1)})
    codes = {f["code"] for f in diagnose_run(healthy, window=None)["findings"]}
    assert not codes & {"token_mismatch", "entropy_collapse", "tool_tokens_in_loss"}


def test_the_diagnostics_flag_a_planted_entropy_collapse_at_its_onset(run):
    ingest_groups(run, {"groups": groups(24, collapse=12)})
    found = {f["code"]: f for f in diagnose_run(run, window=None)["findings"]}
    assert found["entropy_collapse"]["onset_step"] == 12
    assert "Entropy collapse since step 12" in found["entropy_collapse"]["title"]
    assert "token_mismatch" not in found and "tool_tokens_in_loss" not in found

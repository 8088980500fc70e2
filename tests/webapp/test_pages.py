"""The pages: runs list, run dashboard, explorer, group, no-signal, transcript. Test
client, no browser."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from django.urls import reverse
from django.utils.html import escape

from tests.conftest import make_group
from webapp.explorer.paging import encode_cursor
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run, StepMetric
from webapp.runs.queries import component_series, reward_series, run_summaries

XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"></textarea>'


def _seed(run, steps: int = 3) -> None:
    """Per step: a group with signal on `correct`, a tied group, and an all-unscorable group."""
    groups = []
    for s in range(steps):
        groups.append(
            make_group(
                s,
                "mixed",
                [
                    {"correct": 1, "format": 1, "penalty": 0},
                    {"correct": 0, "format": 1, "penalty": -0.5},
                    {"correct": 1, "format": 0, "penalty": 0},
                    {"correct": 0, "format": 1, "penalty": 0},
                ],
            )
        )
        groups.append(make_group(s, "tied", [{"correct": 1, "format": 1}] * 4))
        groups.append(make_group(s, "unscorable", [{"correct": None}] * 2))
    groups[0]["split"] = "holdout"
    ingest_groups(run, {"groups": groups})


@pytest.fixture
def seeded(run):
    _seed(run)
    return run


def _pages(run) -> dict[str, str]:
    r = Rollout.objects.filter(run=run).first()
    return {
        "list": reverse("runs-list"),
        "dashboard": reverse("runs-dashboard", args=[run.id]),
        "explorer": reverse("rollouts-explorer", args=[run.id]),
        "no_signal": reverse("rollouts-no-signal", args=[run.id]),
        "group": reverse("rollouts-group", args=[r.group_id]),
        "transcript": reverse("rollouts-transcript", args=[r.id]),
    }


PAGE_NAMES = ["list", "dashboard", "explorer", "no_signal", "group", "transcript"]


# --- permissions -----------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_it_redirects_anonymous_users_to_login(client, seeded, page):
    url = _pages(seeded)[page]
    resp = client.get(url)
    assert resp.status_code == 302
    assert resp["Location"].startswith(reverse("accounts-login")) and "next=" in resp["Location"]


@pytest.mark.parametrize("role", ["viewer", "annotator", "trainer", "admin"])
@pytest.mark.parametrize("page", PAGE_NAMES)
def test_it_shows_every_page_to_every_role(client_as, seeded, role, page):
    resp = client_as(role).get(_pages(seeded)[page])
    assert resp.status_code == 200
    assert f"role-{role}" in resp.content.decode()


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_it_refuses_state_changing_methods_on_read_only_pages(client_as, seeded, page):
    resp = client_as("admin").post(_pages(seeded)[page])
    assert resp.status_code == 405


def test_it_treats_a_user_without_a_role_as_a_viewer(client, make_user, seeded):
    client.force_login(make_user("norole", None))
    assert client.get(reverse("runs-dashboard", args=[seeded.id])).status_code == 200


def test_it_renders_the_login_form_with_csrf(client):
    resp = client.get(reverse("accounts-login"))
    body = resp.content.decode()
    assert resp.status_code == 200 and "csrfmiddlewaretoken" in body and 'name="password"' in body


# --- runs list -------------------------------------------------------------------------------


def test_it_lists_runs_with_counts_last_reward_and_sparkline(client_as, seeded):
    body = client_as("viewer").get(reverse("runs-list")).content.decode()
    assert "toy-run" in body
    row = body[body.index("toy-run") :]
    s = run_summaries([seeded.id])[seeded.id]
    assert s.steps == 3 and s.rollouts == 3 * (4 + 4 + 2)
    assert f'<td class="num">{s.rollouts}</td>' in row
    assert "<polyline points=" in row
    # last reward mean: the rollout-weighted mean of the last step's scorable rewards
    last = list(
        Rollout.objects.filter(run=seeded, step=2, reward__isnull=False).values_list(
            "reward", flat=True
        )
    )
    assert s.last_reward == pytest.approx(np.mean(last))


def test_it_counts_runs_in_a_constant_number_of_queries(
    client_as, seeded, env3, django_assert_max_num_queries
):
    from webapp.rollouts.services import create_run

    for i in range(6):
        r = create_run(
            name=f"extra-{i}", kind="grpo", environment=env3, config={}, status="running"
        )
        ingest_groups(r, {"groups": [make_group(0, "g", [{"correct": 1}, {"correct": 0}])]})
    c = client_as("viewer")
    with django_assert_max_num_queries(
        6
    ):  # session, user, role, runs, one aggregate: never one per row
        body = c.get(reverse("runs-list")).content.decode()
    assert body.count("<polyline") == 7


def test_it_filters_runs_by_kind_and_status(client_as, seeded, env3):
    from webapp.rollouts.services import create_run

    create_run(name="an-sft-run", kind="sft", environment=env3, config={}, status="succeeded")
    c = client_as("viewer")
    body = c.get(reverse("runs-list"), {"kind": "sft"}).content.decode()
    assert "an-sft-run" in body and "toy-run" not in body
    body = c.get(reverse("runs-list"), {"status": "running"}).content.decode()
    assert "toy-run" in body and "an-sft-run" not in body


def test_it_rejects_an_unknown_run_filter_naming_it(client_as, seeded):
    resp = client_as("viewer").get(reverse("runs-list"), {"kind": "banana"})
    assert resp.status_code == 400
    assert "kind: must be one of" in resp.content.decode()


# --- dashboard -------------------------------------------------------------------------------


def _figures(resp) -> dict:
    body = resp.content.decode()
    m = re.search(
        r'<script id="dashboard-figures" type="application/json">(.*?)</script>', body, re.S
    )
    assert m, "the dashboard embeds its figures as JSON"
    return json.loads(m.group(1))


def test_it_charts_reward_components_and_zero_std_per_step(client_as, seeded):
    resp = client_as("viewer").get(reverse("runs-dashboard", args=[seeded.id]))
    figs = _figures(resp)
    assert figs["reward"]["data"][2]["x"] == [0, 1, 2]
    # each step: 3 groups, two of them (tied, unscorable) have zero std
    assert figs["zero-std"]["data"][0]["y"] == pytest.approx(
        [2 / 3] * 3, rel=1e-4
    )  # charts keep 5 digits
    std_traces = {t["name"]: t for t in figs["std-0"]["data"]}
    assert "within-group std (mean over groups)" in std_traces
    assert any(name.startswith("batch std") for name in std_traces)
    body = resp.content.decode()
    assert "Two different stds." in body and "only it makes an advantage" in body
    assert f'data-explorer="/runs/{seeded.id}/rollouts/"' in body


def test_it_prefers_the_trainer_logged_batch_std_and_charts_other_metrics(client_as, seeded):
    StepMetric.objects.bulk_create(
        [
            StepMetric(run=seeded, step=s, name=n, value=v)
            for s in range(3)
            for n, v in (("rewards/correct/std", 0.123), ("kl", 0.01 * s), ("clip_ratio/low", 0.0))
        ]
    )
    resp = client_as("viewer").get(reverse("runs-dashboard", args=[seeded.id]))
    figs = _figures(resp)
    batch = next(t for t in figs["std-0"]["data"] if t["name"].startswith("batch std"))
    assert batch["name"] == "batch std (trainer log)" and batch["y"] == [0.123] * 3
    metric_titles = {
        f["layout"]["title"]["text"] for k, f in figs.items() if k.startswith("metric:")
    }
    assert metric_titles == {
        "kl",
        "clip_ratio/low",
    }  # rewards/correct/std is folded into its component


def test_it_shows_provenance_commit_hashes_and_config(client_as, seeded):
    seeded.provenance = {"git_commit": "abc123def", "components": {"correct": "h-old"}}
    seeded.config = {"learning_rate": 1e-5, "reward_weights": {"correct": 1.0}}
    seeded.save()
    comp = seeded.environment.components.get(name="correct")
    comp.source_hash = "h-new"
    comp.save()
    body = client_as("viewer").get(reverse("runs-dashboard", args=[seeded.id])).content.decode()
    assert "abc123def" in body and "h-new" in body and "h-old" in body and "(changed since)" in body
    assert "learning_rate" in body
    assert 'id="diagnostics"' in body


def test_it_escapes_hostile_names_in_the_dashboard(client_as, env3, personas):
    from webapp.rollouts.services import create_run

    run = create_run(name=XSS, kind="grpo", environment=env3, config={"x": XSS}, status="running")
    ingest_groups(run, {"groups": [make_group(0, "g", [{"correct": 1}, {"correct": 0}])]})
    StepMetric.objects.create(run=run, step=0, name="</script><script>alert(1)</script>", value=1.0)
    body = client_as("viewer").get(reverse("runs-dashboard", args=[run.id])).content.decode()
    assert "<script>window.__pwned" not in body and "<script>alert(1)" not in body
    assert "&lt;script&gt;window.__pwned" in body


def test_it_computes_batch_std_exactly_from_the_stored_group_stats(seeded):
    comps = list(seeded.environment.components.order_by("position"))
    series = {cs.name: cs for cs in component_series(seeded, comps)}
    for cs_name in ("correct", "format", "penalty"):
        cs = series[cs_name]
        for i, step in enumerate(cs.steps):
            raw = [
                v
                for v in Rollout.objects.filter(
                    run=seeded, step=step, scores__component__name=cs_name
                ).values_list("scores__value", flat=True)
                if v is not None
            ]
            assert cs.mean[i] == pytest.approx(np.mean(raw))
            expected = np.std(raw, ddof=1) if len(raw) > 1 else None
            assert (
                (cs.batch_std[i] is None)
                if expected is None
                else cs.batch_std[i] == pytest.approx(expected)
            )
    correct = series["correct"]
    # within-group std: mean over groups of each group's own std (mixed: std of 1,0,1,0; tied: 0)
    assert correct.within_std[0] == pytest.approx((np.std([1, 0, 1, 0], ddof=1) + 0.0) / 2)
    assert correct.zero_std_frac[0] == pytest.approx(1 / 2)  # the unscorable group has no stat row
    reward, _, _, _ = reward_series(seeded)
    rewards = [
        r
        for r in Rollout.objects.filter(run=seeded, step=0).values_list("reward", flat=True)
        if r is not None
    ]
    assert reward.mean[0] == pytest.approx(np.mean(rewards))
    assert reward.std[0] == pytest.approx(np.std(rewards, ddof=1))


def test_it_shows_an_empty_dashboard_for_a_run_without_rollouts(client_as, run):
    body = client_as("viewer").get(reverse("runs-dashboard", args=[run.id])).content.decode()
    assert "No rollouts stored for this run yet." in body


def test_it_answers_404_for_a_missing_run(client_as, db, personas):
    assert client_as("viewer").get(reverse("runs-dashboard", args=[999999])).status_code == 404


# --- explorer --------------------------------------------------------------------------------


def _ids(resp) -> list[int]:
    return [
        int(x)
        for x in re.findall(
            r'<tr data-href="[^"]*" data-group-href="[^"]*" data-id="(\d+)"', resp.content.decode()
        )
    ]


def _sort_values(resp) -> list[str]:
    return re.findall(r'data-sort-value="([^"]*)"', resp.content.decode())


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_it_sorts_the_explorer_by_a_component(client_as, seeded, order):
    resp = client_as("viewer").get(
        reverse("rollouts-explorer", args=[seeded.id]), {"sort": "penalty", "order": order}
    )
    assert resp.status_code == 200
    values = [float(v) for v in _sort_values(resp)]
    assert values == sorted(values, reverse=order == "desc") and -0.5 in values


def test_it_pages_the_explorer_with_a_keyset_cursor(client_as, seeded):
    c = client_as("viewer")
    url = reverse("rollouts-explorer", args=[seeded.id])
    resp = c.get(url, {"sort": "reward", "order": "desc", "limit": 7})
    pages = [_ids(resp)]
    while m := re.search(r'id="next-page" href="[^"?]*\?([^"]+)"', resp.content.decode()):
        resp = c.get(url + "?" + m.group(1).replace("&amp;", "&"))
        pages.append(_ids(resp))
    seen = [i for p in pages for i in p]
    assert [len(p) for p in pages] == [7, 7, 7, 7, 2]
    assert len(seen) == len(set(seen))
    assert set(seen) == set(Rollout.objects.filter(run=seeded).values_list("id", flat=True))
    assert "first page" in resp.content.decode()


def test_it_filters_the_explorer(client_as, seeded):
    c = client_as("viewer")
    url = reverse("rollouts-explorer", args=[seeded.id])
    only_step = _ids(c.get(url, {"step_min": 1, "step_max": 1}))
    assert set(Rollout.objects.filter(id__in=only_step).values_list("step", flat=True)) == {1}
    holdout = _ids(c.get(url, {"split": "holdout"}))
    assert holdout and set(
        Rollout.objects.filter(id__in=holdout).values_list("split", flat=True)
    ) == {"holdout"}
    zero = _ids(c.get(url, {"zero_std": "1"}))
    assert set(Rollout.objects.filter(id__in=zero).values_list("group__zero_std", flat=True)) == {
        True
    }
    penalised = _ids(c.get(url, {"max_penalty": "-0.1"}))
    assert len(penalised) == 3  # one per step
    text = _ids(c.get(url, {"q": "tied 2"}))
    assert text and all("tied 2" in r.completion for r in Rollout.objects.filter(id__in=text))


@pytest.mark.parametrize(
    "param, value",
    [
        ("sort", "nope"),
        ("order", "sideways"),
        ("step_min", "abc"),
        ("min_correct", "x"),
        ("limit", "0"),
        ("cursor", "garbage!!"),
    ],
)
def test_it_answers_400_naming_a_bad_explorer_parameter(client_as, seeded, param, value):
    resp = client_as("viewer").get(reverse("rollouts-explorer", args=[seeded.id]), {param: value})
    assert resp.status_code == 400
    assert f"Bad parameter <code>{param}</code>" in resp.content.decode()


def test_it_returns_only_the_table_to_htmx(client_as, seeded):
    c = client_as("viewer")
    url = reverse("rollouts-explorer", args=[seeded.id])
    frag = c.get(url, {"sort": "correct"}, HTTP_HX_REQUEST="true")
    assert "<html" not in frag.content.decode() and 'id="rollout-table"' in frag.content.decode()
    assert "HX-Request" in frag["Vary"]
    restore = c.get(url, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in restore.content.decode()  # the back button gets a whole page


def test_it_shows_bars_and_the_group_std_of_the_sorted_component(client_as, seeded):
    body = (
        client_as("viewer")
        .get(
            reverse("rollouts-explorer", args=[seeded.id]),
            {"sort": "correct", "order": "asc", "step_max": 0},
        )
        .content.decode()
    )
    assert 'class="bar " title="correct: 0"' in body or 'title="correct: 0"' in body
    assert 'style="width:100.0%"' in body and 'style="width:0.0%"' in body
    assert f"{np.std([1, 0, 1, 0], ddof=1):.3f}" in body  # the mixed group's std of `correct`


def test_it_escapes_and_truncates_the_preview(client_as, run):
    g = make_group(0, "x", [{"correct": 1}, {"correct": 0}])
    g["rollouts"][0]["completion"] = XSS + " padding" * 100
    ingest_groups(run, {"groups": [g]})
    body = client_as("viewer").get(reverse("rollouts-explorer", args=[run.id])).content.decode()
    assert (
        "<script>window.__pwned" not in body
        and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in body
    )
    # A long transcript shows its head and its tail (the stored preview), not the middle.
    assert re.search(r"&lt;/textarea&gt;( padding)+ … (padding )+padding</a>", body)


def test_it_hides_the_label_filter_until_labels_exist(client_as, seeded):
    from webapp.annotations.models import Label

    url = reverse("rollouts-explorer", args=[seeded.id])
    Label.objects.all().delete()
    assert 'name="label"' not in client_as("viewer").get(url).content.decode()
    Label.objects.create(slug="hack", name="Reward <hack>")
    body = client_as("viewer").get(url, {"label": "hack"}).content.decode()
    assert '<option value="hack" selected>Reward &lt;hack&gt;</option>' in body


def test_it_carries_the_explorer_query_into_transcript_links(client_as, seeded):
    body = (
        client_as("viewer")
        .get(
            reverse("rollouts-explorer", args=[seeded.id]),
            {"sort": "format", "order": "asc", "step_min": 1},
        )
        .content.decode()
    )
    assert re.search(r'href="/rollouts/\d+/\?sort=format&amp;order=asc&amp;step_min=1"', body)


# --- group view ------------------------------------------------------------------------------


def test_it_ranks_a_group_and_highlights_the_separating_component(client_as, seeded):
    group = Group.objects.get(run=seeded, step=0, key="mixed")
    resp = client_as("viewer").get(reverse("rollouts-group", args=[group.id]))
    body = resp.content.decode()
    ranked = [c["rollout"] for c in resp.context["cards"]]
    rewards = [r.reward for r in ranked]
    assert rewards == sorted(rewards, reverse=True)
    # best: correct 1, format 1 (1.5); worst: correct 0, format 1, penalty -0.5 (0.4):
    # correct differs most
    assert resp.context["separator"].name == "correct"
    assert "separates best from worst" in body


def test_it_flags_components_with_no_signal_in_the_group(client_as, seeded):
    group = Group.objects.get(run=seeded, step=0, key="tied")
    body = client_as("viewer").get(reverse("rollouts-group", args=[group.id])).content.decode()
    assert body.count("no signal in this group") == 2  # correct and format; penalty never scored
    assert "no advantage: the aggregate reward is constant" in body


def test_it_diffs_best_against_worst_with_escaping(client_as, run):
    g = make_group(0, "d", [{"correct": 1}, {"correct": 0}])
    g["rollouts"][0]["completion"] = "keep this <b>good</b> part"
    g["rollouts"][1]["completion"] = "keep this <script>bad()</script> part"
    ingest_groups(run, {"groups": [g]})
    body = (
        client_as("viewer")
        .get(reverse("rollouts-group", args=[Group.objects.get(run=run).id]))
        .content.decode()
    )
    diff = body[body.index('class="diff-text"') :]
    assert "<del>" in diff and "<ins>" in diff
    assert "&lt;" in diff and "<script>bad" not in body and "<b>good" not in body
    assert "<del>good</del><ins>bad()</ins>" in diff


# --- no-signal -------------------------------------------------------------------------------


def test_it_lists_no_signal_groups_with_reasons_and_tied_values(client_as, seeded):
    resp = client_as("viewer").get(reverse("rollouts-no-signal", args=[seeded.id]))
    body = resp.content.decode()
    keys = [row["group"].key for row in resp.context["rows"]]
    assert sorted(keys) == sorted(["tied", "unscorable"] * 3) and "mixed" not in keys
    reasons = {row["group"].key: row["reason"] for row in resp.context["rows"]}
    assert reasons == {"tied": "all equal", "unscorable": "all unscorable"}
    assert "correct = 1.000" in body and "format = 1.000" in body
    assert "step 0" in body and "step 2" in body


def test_it_includes_groups_whose_trainer_advantages_are_all_zero(client_as, run):
    g = make_group(0, "zeros", [{"correct": 1}, {"correct": 0}])
    for r in g["rollouts"]:
        r["advantage"] = 0.0
    ingest_groups(run, {"groups": [g, make_group(0, "fine", [{"correct": 1}, {"correct": 0}])]})
    resp = client_as("viewer").get(reverse("rollouts-no-signal", args=[run.id]))
    assert [(row["group"].key, row["reason"]) for row in resp.context["rows"]] == [
        ("zeros", "all advantages 0")
    ]


def test_it_pages_and_filters_no_signal_groups(client_as, seeded):
    c = client_as("viewer")
    url = reverse("rollouts-no-signal", args=[seeded.id])
    rows = c.get(url, {"step_min": 1, "step_max": 1}).context["rows"]
    assert {r["group"].step for r in rows} == {1} and len(rows) == 2
    first = Group.objects.filter(run=seeded, key="tied", step=1).get()
    after = c.get(url, {"cursor": encode_cursor(first.step, first.id)}).context["rows"]
    assert all((r["group"].step, r["group"].id) > (first.step, first.id) for r in after)
    bad = c.get(url, {"step_min": "one"})
    assert bad.status_code == 400 and "Bad parameter <code>step_min</code>" in bad.content.decode()


# --- transcript ------------------------------------------------------------------------------


def test_it_renders_a_multi_turn_transcript_with_tool_calls(client_as, run):
    transcript = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":2,"b":3}'},
                }
            ],
        },
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    g = {
        "step": 0,
        "key": "t",
        "prompt": "add",
        "rollouts": [
            {
                "index": 0,
                "transcript": transcript,
                "rewards": {"correct": {"value": 1, "reason": "right answer"}},
                "parse_error": "trailing text ignored",
            },
            {"index": 1, "completion": "4", "rewards": {"correct": 0}},
        ],
    }
    ingest_groups(run, {"groups": [g]})
    r = Rollout.objects.get(run=run, index=0)
    body = client_as("viewer").get(reverse("rollouts-transcript", args=[r.id])).content.decode()
    for role in ("system", "user", "assistant", "tool"):
        assert f'class="msg {role}"' in body
    assert (
        "{\n  &quot;a&quot;: 2,\n  &quot;b&quot;: 3\n}" in body
    )  # arguments pretty-printed, escaped
    assert "right answer" in body and "trailing text ignored" in body
    assert "&#x27;role&#x27;" not in body  # the chat is rendered as bubbles, never dumped as a dict
    assert f"{r.advantage:.4f}" in body


def test_it_escapes_hostile_transcripts(client_as, run):
    hostile = [
        {"role": "user", "content": XSS},
        {
            "role": "assistant",
            "content": '<a href="javascript:window.__pwned=3">x</a>' + XSS,
            "tool_calls": [{"function": {"name": XSS, "arguments": XSS}}],
        },
    ]
    g = {
        "step": 0,
        "key": XSS,
        "prompt": XSS,
        "rollouts": [
            {
                "index": 0,
                "transcript": hostile,
                "rewards": {"correct": {"value": 1, "reason": XSS}},
                "parse_error": XSS,
            }
        ],
    }
    ingest_groups(run, {"groups": [g]})
    r = Rollout.objects.get(run=run)
    c = client_as("viewer")
    for url in (
        reverse("rollouts-transcript", args=[r.id]),
        reverse("rollouts-group", args=[r.group_id]),
        reverse("rollouts-explorer", args=[run.id]),
        reverse("rollouts-no-signal", args=[run.id]),
    ):
        body = c.get(url).content.decode()
        assert "<script>window.__pwned" not in body and 'onerror="window' not in body, url
        assert 'href="javascript:' not in body, url


def _diagram_run(personas):
    from training.demo import generate_groups
    from training.environments import get_environment
    from training.environments.diagram import ScriptedDiagramPolicy
    from webapp.rollouts.services import create_run, environment_from_training

    env = get_environment("diagram")
    db_env = environment_from_training(env)
    run = create_run(
        name="diagram-run", kind="import", environment=db_env, config={}, status="running"
    )
    groups = generate_groups(
        env, ScriptedDiagramPolicy(0, 0.9), steps=2, groups_per_step=2, G=4, seed=1
    )
    ingest_groups(run, {"groups": groups})
    return run


def test_it_rerenders_the_diagram_state_and_never_echoes_the_stored_svg(client_as, personas):
    run = _diagram_run(personas)
    r = Rollout.objects.filter(run=run, reward__gt=1).first()
    Rollout.objects.filter(id=r.id).update(
        state={"svg": '<svg onload="window.__pwned=4"><script>x</script></svg>'}
    )
    body = client_as("viewer").get(reverse("rollouts-transcript", args=[r.id])).content.decode()
    m = re.search(
        r'<img class="state-img" src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', body
    )
    assert m, "the state is an <img> with a data: URI"
    import base64

    svg = base64.b64decode(m.group(1)).decode()
    assert (
        svg.startswith("<svg") and "<rect" in svg and "onload" not in svg and "__pwned" not in svg
    )
    assert "__pwned" not in body


def test_it_links_prev_and_next_in_the_explorer_order(client_as, seeded):
    c = client_as("viewer")
    params = {"sort": "reward", "order": "desc", "step_min": 0, "step_max": 0}
    ids = _ids(c.get(reverse("rollouts-explorer", args=[seeded.id]), params))
    assert len(ids) == 10
    resp = c.get(reverse("rollouts-transcript", args=[ids[3]]), params)
    assert (resp.context["prev_id"], resp.context["next_id"]) == (ids[2], ids[4])
    first = c.get(reverse("rollouts-transcript", args=[ids[0]]), params).context
    last = c.get(reverse("rollouts-transcript", args=[ids[-1]]), params).context
    assert first["prev_id"] is None and last["next_id"] is None
    assert "sort=reward&amp;order=desc&amp;step_min=0&amp;step_max=0" in resp.content.decode()


def test_it_links_neighbours_in_a_component_order_with_nulls(client_as, seeded):
    c = client_as("viewer")
    params = {"sort": "penalty", "order": "asc"}
    ids = _ids(c.get(reverse("rollouts-explorer", args=[seeded.id]), {**params, "limit": 500}))
    for i in (0, len(ids) // 2, len(ids) - 1):
        ctx = c.get(reverse("rollouts-transcript", args=[ids[i]]), params).context
        assert ctx["prev_id"] == (ids[i - 1] if i else None)
        assert ctx["next_id"] == (ids[i + 1] if i + 1 < len(ids) else None)


def test_it_ignores_a_bad_explorer_query_on_the_transcript(client_as, seeded):
    r = Rollout.objects.filter(run=seeded).first()
    resp = client_as("viewer").get(reverse("rollouts-transcript", args=[r.id]), {"sort": "bogus"})
    assert (
        resp.status_code == 200
        and resp.context["prev_id"] is None
        and resp.context["next_id"] is None
    )


def test_it_keeps_the_unscorable_reward_as_a_dash(client_as, seeded):
    r = Rollout.objects.filter(run=seeded, group__all_unscorable=True).first()
    assert r.reward is None or math.isnan(r.reward)
    body = client_as("viewer").get(reverse("rollouts-transcript", args=[r.id])).content.decode()
    assert "<strong>—</strong>" in body


def test_it_serves_vendored_htmx_and_plotly(client_as, db, personas):
    c = client_as("viewer")
    for path in ("/static/vendor/htmx.min.js", "/static/vendor/plotly.min.js", "/static/js/app.js"):
        resp = c.get(path)
        assert resp.status_code == 200, path
        b"".join(resp.streaming_content) if hasattr(resp, "streaming_content") else resp.content


def test_it_lists_an_import_run_with_no_rollouts(client_as, run):
    body = client_as("viewer").get(reverse("runs-list")).content.decode()
    assert "toy-run" in body and Run.objects.count() == 1


# --- issue 19: live runs, cancel, checkpoints, scalars, launch sections and weights, 403 ----------


def test_it_answers_the_live_poll_with_figures_only_when_a_step_was_stored(client_as, seeded):
    url = reverse("runs-live", args=[seeded.id])
    first = client_as("viewer").get(url).json()
    assert first["status"] == "running" and not first["finished"] and first["figures"]["reward"]
    same = client_as("viewer").get(url, {"version": first["version"]}).json()
    assert same["figures"] is None  # nothing new: a few bytes, no chart rebuilt
    ingest_groups(seeded, {"groups": [make_group(3, "mixed", [{"correct": 1}, {"correct": 0}])]})
    StepMetric.objects.bulk_create(
        [StepMetric(run=seeded, step=s, name="kl", value=0.1) for s in (2, 3)]
    )
    grown = client_as("viewer").get(url, {"version": first["version"]}).json()
    assert (
        grown["figures"]["reward"]["data"][2]["x"] == [0, 1, 2, 3]
        and "metric:kl" in grown["figures"]
    )
    page = client_as("viewer").get(reverse("runs-dashboard", args=[seeded.id])).content.decode()
    assert f'data-live="{url}"' in page
    Run.objects.filter(id=seeded.id).update(status="succeeded")
    assert client_as("viewer").get(url).json()["finished"] is True
    assert (
        "data-live="
        not in client_as("viewer").get(reverse("runs-dashboard", args=[seeded.id])).content.decode()
    )


def test_it_lists_the_step_and_percentage_of_running_and_trainer_only_runs(
    client_as, env3, personas
):
    from webapp.rollouts.services import create_run

    live = create_run(name="live", kind="grpo", environment=env3, config={}, status="running")
    live.set_progress(30, 120)
    sft = create_run(name="sft-done", kind="sft", environment=env3, config={}, status="succeeded")
    sft.set_progress(100, 100)
    body = client_as("viewer").get(reverse("runs-list")).content.decode()
    assert "step 30/120 · 25%" in body
    row = re.search(r"sft-done.*?</tr>", body, re.S).group(0)
    assert (
        re.findall(r'<td class="num">(\d+)</td>', row)[0] == "100"
    )  # no "Steps 0" for a 100-step SFT


def _job(env3, **fields):
    from webapp.rollouts.services import create_run

    run = create_run(
        name=fields.pop("name", "job"),
        kind=fields.pop("kind", "sft"),
        environment=env3,
        config=fields.pop("config", {}),
        status=fields.pop("status", "running"),
    )
    Run.objects.filter(id=run.id).update(**fields)
    run.refresh_from_db()
    return run


def test_it_reads_cancelling_then_cancelled_with_no_cancel_button_or_checkpoint_actions(
    client_as, env3
):
    run = _job(env3, log_tail="step 3 loss 0.4\n")
    detail = reverse("jobs-detail", args=[run.id])
    before = client_as("trainer").get(detail).content.decode()
    assert (
        'id="cancel-form"' in before and 'id="grpo-from"' in before
    )  # pending: starts when it succeeds
    client_as("trainer").post(reverse("jobs-cancel", args=[run.id]))
    cancelling = client_as("trainer").get(detail).content.decode()
    assert "cancelling</span>" in cancelling and 'id="cancel-form"' not in cancelling
    assert 'id="eval-checkpoint"' not in cancelling and 'id="grpo-from"' not in cancelling
    run.mark_cancelled()
    progress = client_as("trainer").get(
        reverse("jobs-progress", args=[run.id]), HTTP_HX_REQUEST="true"
    )
    assert (
        progress.status_code == 286 and progress["HX-Trigger"] == "run-finished"
    )  # htmx stops polling
    done = client_as("trainer").get(detail).content.decode()
    assert (
        "status-cancelled" in done
        and "no checkpoint" in done
        and 'id="eval-checkpoint"' not in done
    )
    assert "step 3 loss 0.4" in done


def test_it_offers_checkpoint_actions_only_to_trainers_of_a_finished_training_run(client_as, env3):
    ok = _job(env3, status="succeeded")
    body = client_as("trainer").get(reverse("jobs-detail", args=[ok.id])).content.decode()
    assert 'id="eval-checkpoint"' in body and 'id="grpo-from"' in body
    assert (
        'id="grpo-from"'
        not in client_as("viewer").get(reverse("jobs-detail", args=[ok.id])).content.decode()
    )
    probe = _job(env3, kind="probe", status="succeeded")
    assert (
        'id="grpo-from"'
        not in client_as("trainer").get(reverse("jobs-detail", args=[probe.id])).content.decode()
    )


def test_it_names_the_queue_and_whether_a_worker_listens(client_as, env3):
    from webapp.runs.models import WorkerHeartbeat

    run = _job(env3, kind="grpo", status="queued")
    WorkerHeartbeat.objects.create(name="cpu-box", device="cpu", queues="default")
    body = client_as("viewer").get(reverse("jobs-detail", args=[run.id])).content.decode()
    assert (
        "Queued on <code>gpu</code>" in body
        and "no live worker listens on it" in body
        and "cpu-box" in body
    )
    WorkerHeartbeat.objects.create(name="gpu-box", device="cuda", queues="gpu,default")
    body = client_as("viewer").get(reverse("jobs-detail", args=[run.id])).content.decode()
    assert "1 live worker listens on it (gpu-box · cuda)" in body


def test_it_tables_end_of_training_scalars_and_pretty_prints_json(client_as, env3):
    run = _job(env3, status="succeeded", summary={"train_loss": 0.3, "verdict": "x"}, kind="sft")
    StepMetric.objects.bulk_create(
        [StepMetric(run=run, step=s, name="loss", value=1 - 0.1 * s) for s in range(3)]
        + [
            StepMetric(run=run, step=3, name="train_runtime", value=12.5),
            StepMetric(run=run, step=3, name="total_flos", value=1.5e12),
        ]
    )
    resp = client_as("viewer").get(reverse("runs-dashboard", args=[run.id]))
    figs, body = _figures(resp), resp.content.decode()
    assert (
        "metric:loss" in figs
        and "metric:train_runtime" not in figs
        and "metric:total_flos" not in figs
    )
    assert re.search(
        r'<td class="mono">total_flos</td><td class="num">3</td><td class="num">1\.5e\+12</td>',
        body,
    )
    assert (
        "&quot;train_loss&quot;: 0.3" in body and "{&#x27;" not in body
    )  # JSON, not a Python repr
    assert "store no rollouts by design" in body and "diag-status" not in body  # no verdict for SFT


def test_it_puts_the_probe_verdict_on_top_in_words(client_as, env3):
    verdict = "do SFT first: pass@8 of correct is 0.000 (< 0.05)"
    run = _job(
        env3,
        kind="probe",
        status="succeeded",
        summary={"verdict": verdict, "pass_at_k": {"pass@8": 0.0}},
    )
    for url in (reverse("runs-dashboard", args=[run.id]), reverse("jobs-detail", args=[run.id])):
        body = client_as("viewer").get(url).content.decode()
        assert (
            f'<p class="verdict" id="verdict"><strong>Verdict:</strong> {escape(verdict)}</p>'
            in body
        )
        assert body.index('id="verdict"') < body.index('class="log-tail"')


def test_it_says_when_overlaid_runs_differ_in_weights(client_as, env3):
    a = _job(
        env3,
        kind="grpo",
        name="base",
        config={"reward_weights": {"correct": 1.0, "format": 0.5, "penalty": 0.2}},
    )
    b = _job(
        env3,
        kind="grpo",
        name="twin",
        config={"reward_weights": {"correct": 1.0, "format": 1.2, "penalty": 0.2}},
    )
    body = (
        client_as("viewer")
        .get(reverse("jobs-compare") + f"?run={a.id}&run={b.id}")
        .content.decode()
    )
    assert "sum their rewards with different weights" in body and "format 1.2" in body
    same = (
        client_as("viewer")
        .get(reverse("jobs-compare") + f"?run={a.id}&run={a.id}")
        .content.decode()
    )
    assert "different weights" not in same


def test_it_lays_the_grpo_form_out_in_sections_and_stores_the_weights_on_the_run(
    client_as, db, monkeypatch
):
    from training.environments import get_environment
    from webapp.runs import launch

    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")
    page = client_as("trainer").get(reverse("jobs-launch", args=["grpo"])).content.decode()
    legends = re.findall(r"<legend>(.*?)</legend>", page)
    assert legends == [
        "Model",
        "Data",
        "Optimisation",
        "Algorithm",
        "Reward weights",
        "LoRA",
        "Recording",
    ]
    assert page.count('<details class="advanced"') >= 4 and 'id="launch-summary"' in page
    comps = get_environment("diagram").components
    data = {
        "name": "weighted",
        "environment": "diagram",
        "base_model": "tiny:diagram",
        "launch_anyway": "on",  # the untrained tiny model, on purpose (base_models)
        "num_gpus": 1,
    }
    form = client_as("trainer").get(reverse("jobs-launch", args=["grpo"])).context["form"]
    for (
        name,
        field,
    ) in form.fields.items():  # every other field at its default, as the browser posts it
        if (
            name.startswith("cfg_")
            and field.initial is not None
            and not isinstance(field.initial, bool)
        ):
            data[name] = (
                field.initial
                if not isinstance(field.initial, (list, dict))
                else json.dumps(field.initial)
            )
        elif name.startswith("cfg_") and field.initial is True:
            data[name] = "on"
    weights = {c.name: round(0.25 * (i + 1), 2) for i, c in enumerate(comps)}
    data.update({f"weight_{n}": w for n, w in weights.items()})
    resp = client_as("trainer").post(reverse("jobs-launch", args=["grpo"]), data)
    assert resp.status_code == 302, resp.context["form"].errors if resp.context else resp
    run = Run.objects.get(name="weighted")
    assert run.reward_settings["weights"] == weights and "reward_weights" not in run.config
    from workers.jobs import job_config

    assert job_config(run).reward_weights == [weights[c.name] for c in comps]


def test_it_shows_a_styled_403_naming_the_role_needed(client_as, db):
    resp = client_as("viewer").get(reverse("jobs-launch", args=["grpo"]))
    body = resp.content.decode()
    assert resp.status_code == 403 and "This action needs the trainer role." in body
    assert 'class="topbar"' in body and "role-viewer" in body  # the site's own page, not a bare 403


def test_it_offers_a_review_queue_of_the_explorer_view_to_trainers(client_as, seeded):
    url = reverse("rollouts-explorer", args=[seeded.id]) + "?sort=correct&order=asc&step_min=1"
    body = client_as("trainer").get(url).content.decode()
    link = re.search(r'id="queue-from-view" href="([^"]+)"', body).group(1).replace("&amp;", "&")
    assert "params=sort%3Dcorrect%26order%3Dasc%26step_min%3D1" in link
    form = client_as("trainer").get(link).content.decode()
    assert (
        'value="sort=correct&amp;order=asc&amp;step_min=1"' in form
        and 'value="explorer" selected' in form
    )
    assert 'id="queue-from-view"' not in client_as("viewer").get(url).content.decode()
    assert '<span class="bar-num">' in body  # component numbers beside the bars


def test_it_shows_the_runs_own_weights_beside_the_environment_default(client_as, env3):
    run = _job(
        env3,
        kind="grpo",
        config={"reward_weights": {"correct": 1.0, "format": 2.0, "penalty": 0.2}},
    )
    body = client_as("viewer").get(reverse("runs-dashboard", args=[run.id])).content.decode()
    provenance = body[body.index('<section class="provenance">') :]
    row = re.search(r"<td>format</td>.*?</tr>", provenance, re.S).group(0)
    assert "2.0" in row and "(default 0.5)" in row, row


def test_it_refreshes_the_diagnostics_summary_when_the_run_ends(client_as, seeded):
    from django.core.cache import cache

    url = reverse("runs-dashboard", args=[seeded.id])
    client_as("viewer").get(url)
    cache.set(f"diag-slot:{seeded.id}", {"error": "stale live verdict"}, 600)
    assert (
        "stale live verdict" in client_as("viewer").get(url).content.decode()
    )  # cached while running
    seeded.mark_succeeded()
    assert "stale live verdict" not in client_as("viewer").get(url).content.decode()


def test_it_offers_the_weights_of_the_environment_asked_for(client_as, db):
    from training.environments import get_environment

    page = client_as("trainer").get(
        reverse("jobs-launch", args=["grpo"]), {"environment": "ask_to_code"}
    )
    names = re.findall(r'name="weight_([^"]+)"', page.content.decode())
    assert names == [c.name for c in get_environment("ask_to_code").components]
    assert 'value="tiny:ask_to_code"' in page.content.decode()


@pytest.mark.parametrize("role", ["viewer", "annotator"])
def test_it_shows_no_link_the_role_cannot_follow(client_as, seeded, personas, role):
    """Crawl from every page a role opens, two links deep: no link leads to a 403."""
    from webapp.annotations.models import Label
    from webapp.annotations.services import create_queue, save_annotation

    sft = _job(seeded.environment, kind="sft", status="succeeded")
    queue = create_queue(
        name="q",
        run=seeded,
        source="explorer",
        params={"sort": "reward"},
        limit=3,
        seed=None,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[personas["annotator"]],
    )
    save_annotation(
        queue.items.first().rollout, personas["annotator"], label=Label.objects.get(slug="good")
    )
    client = client_as(role)
    seen: set[str] = set()
    frontier = [
        reverse("runs-list"),
        reverse("runs-dashboard", args=[seeded.id]),
        reverse("jobs-detail", args=[sft.id]),
        reverse("annotations-queue", args=[queue.id]),
        reverse("annotations-home"),
    ]
    forbidden = []
    for _depth in range(2):
        found = []
        for url in frontier:
            if url in seen:
                continue
            seen.add(url)
            resp = client.get(url)
            if resp.status_code == 403:
                forbidden.append(url)
            elif resp.status_code == 200 and "html" in resp.get("Content-Type", ""):
                found += [
                    h.replace("&amp;", "&")
                    for h in re.findall(r'href="(/[^"#]*)"', resp.content.decode())
                    if not h.startswith(("/static/", "/accounts/logout")) and "download" not in h
                ]
        frontier = found
    assert forbidden == [] and len(seen) > 15


def test_it_refreshes_the_runs_table_only_while_a_job_runs(client_as, env3):
    run = _job(env3, kind="grpo", status="running")
    page = client_as("viewer").get(reverse("runs-list")).content.decode()
    assert 'hx-trigger="every 5s" hx-select="#runs-table"' in page
    run.mark_succeeded()
    assert (
        'hx-select="#runs-table"'
        not in client_as("viewer").get(reverse("runs-list")).content.decode()
    )


def test_it_lists_finished_children_as_started_not_queued_and_hides_deleted_ones(client_as, env3):
    from django.utils import timezone

    parent = _job(env3, status="succeeded")
    waiting = _job(env3, name="waits", kind="eval", status="queued", parent=parent)
    done = _job(env3, name="done-child", kind="grpo", status="succeeded", parent=parent)
    gone = _job(env3, name="gone-child", kind="eval", status="failed", parent=parent)
    Run.objects.filter(id=gone.id).update(deleted_at=timezone.now())
    body = client_as("viewer").get(reverse("jobs-detail", args=[parent.id])).content.decode()
    queued_part = body.split("Queued behind this run", 1)[1].split("</ul>", 1)[0]
    started_part = body.split("Started from this run", 1)[1].split("</ul>", 1)[0]
    assert f"run {waiting.id} waits" in queued_part and "done-child" not in queued_part
    assert f"run {done.id} done-child" in started_part and "waits" not in started_part
    assert "gone-child" not in body

"""The explorer sorts and filters by a rollout's token summaries (sort=tokens.<summary>,
min_/max_tokens.<summary>), through the API, the page and the transcript's neighbours."""

from __future__ import annotations

import pytest

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout

# (mismatch, entropy, masked tokens of 10) per rollout; None: no tokens
SHAPES = [(0.2, 1.0, 0), (0.05, 0.1, 5), None, (0.4, 2.0, 2), (0.1, 0.5, 10), None]


def _body() -> dict:
    groups = []
    for step in (0, 1):
        g = make_group(step, f"p{step}", [{"correct": 1}, {"correct": 0}, {"correct": 1}])
        for j, r in enumerate(g["rollouts"]):
            shape = SHAPES[step * 3 + j]
            if shape is None:
                continue
            d, e, masked = shape
            r["tokens"] = {
                "ids": list(range(10)),
                "sampler_logprobs": [-1.0] * 10,
                "trainer_logprobs": [-1.0 + d] * 10,
                "entropy": [e] * 10,
                "loss_mask": [0] * masked + [1] * (10 - masked),
            }
        groups.append(g)
    return {"groups": groups}


@pytest.fixture
def run_with_tokens(run):
    ingest_groups(run, _body())
    return run


def _ids_of(shapes: list[int]) -> list[int]:
    order = list(Rollout.objects.order_by("step", "index").values_list("id", flat=True))
    return [order[i] for i in shapes]


def test_it_sorts_by_mismatch_over_the_rollouts_with_tokens(run_with_tokens, api, personas):
    c = api(personas["viewer"])
    url = f"/api/v1/runs/{run_with_tokens.id}/rollouts/"
    res = c.get(url, {"sort": "tokens.mismatch", "order": "desc", "limit": 2}).json()
    # Rollout 4 is wholly masked: no token counts, so its mismatch is unknown (NULL, first in desc).
    assert [r["id"] for r in res["rollouts"]] == _ids_of([4, 3])
    rest = c.get(url, {"sort": "tokens.mismatch", "order": "desc", "cursor": res["next"]}).json()
    assert [r["id"] for r in rest["rollouts"]] == _ids_of([0, 1])
    assert [round(r["sort_value"], 3) for r in rest["rollouts"]] == [0.2, 0.05]


def test_it_filters_by_masked_fraction_and_entropy(run_with_tokens, api, personas):
    c = api(personas["viewer"])
    url = f"/api/v1/runs/{run_with_tokens.id}/rollouts/"
    masked = c.get(url, {"sort": "reward", "min_tokens.masked_fraction": "0.3"}).json()
    assert sorted(r["id"] for r in masked["rollouts"]) == _ids_of([1, 4])
    calm = c.get(url, {"sort": "tokens.mean_entropy", "order": "asc", "max_tokens.mean_entropy": 1})
    assert [r["id"] for r in calm.json()["rollouts"]] == _ids_of([1, 0])


def test_it_names_the_token_sorts_when_refusing_a_sort(run_with_tokens, api, personas):
    res = api(personas["viewer"]).get(
        f"/api/v1/runs/{run_with_tokens.id}/rollouts/", {"sort": "tokens.nope"}
    )
    assert res.status_code == 400 and "tokens.mismatch" in res.json()["errors"][0]["error"]


def test_the_page_and_the_transcripts_neighbours_follow_a_token_sort(run_with_tokens, client_as):
    c = client_as("viewer")
    page = c.get(f"/runs/{run_with_tokens.id}/rollouts/?sort=tokens.mismatch&order=desc")
    assert page.status_code == 200
    ids = _ids_of([4, 3, 0, 1])
    res = c.get(f"/rollouts/{ids[1]}/?sort=tokens.mismatch&order=desc")
    assert res.status_code == 200
    assert f"/rollouts/{ids[2]}/" in res.content.decode()
    assert f"/rollouts/{ids[0]}/" in res.content.decode()
    no_tokens = _ids_of([2])[0]
    assert c.get(f"/rollouts/{no_tokens}/?sort=tokens.mismatch").status_code == 200


def test_the_sort_menu_offers_the_token_sorts_and_keeps_the_one_in_use(run_with_tokens, client_as):
    """A finding links to ?sort=tokens.mismatch: the page's Sort menu must show that sort (not
    'reward', which a change of any other filter would then submit), and offer the others."""
    c = client_as("viewer")
    page = c.get(f"/runs/{run_with_tokens.id}/rollouts/?sort=tokens.mismatch&order=desc")
    html = page.content.decode()
    assert '<option value="tokens.mismatch" selected>' in html
    assert '<option value="tokens.mean_entropy">' in html
    assert '<option value="reward" selected>' not in html


def test_the_sort_menu_leaves_the_token_sorts_out_of_a_run_without_tokens(run, client_as):
    ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 1}, {"correct": 0}])]})
    html = client_as("viewer").get(f"/runs/{run.id}/rollouts/").content.decode()
    assert "tokens.mismatch" not in html


def test_a_token_sort_shows_the_summary_sorted_by_in_a_column(run_with_tokens, client_as):
    import re

    c = client_as("viewer")
    html = c.get(f"/runs/{run_with_tokens.id}/rollouts/?sort=tokens.mismatch&order=desc")
    html = html.content.decode()
    assert re.search(r'<th class="num sorted token-sort"[^>]*>mismatch</th>', html)
    cells = re.findall(r'<td class="num sorted token-sort">([^<]*)</td>', html)
    assert cells == ["—", "0.4000", "0.2000", "0.0500"]  # rollout 4: wholly masked, no mismatch
    plain = c.get(f"/runs/{run_with_tokens.id}/rollouts/?sort=reward").content.decode()
    assert "token-sort" not in plain

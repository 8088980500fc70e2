"""Agreement math against hand-computed and published examples, a brute-force definition on random
data, and the queue's agreement page."""

from __future__ import annotations

import doctest
import random

import pytest
from django.urls import reverse

from tests.webapp.test_annotations import annotate, make_queue, rollouts  # noqa: F401 - fixture
from webapp.annotations import agreement, services
from webapp.annotations.agreement import cohen_kappa, krippendorff_alpha_nominal


def test_it_passes_its_doctests():
    assert doctest.testmod(agreement).failed == 0
    assert doctest.testmod(services).failed == 0  # round_robin


def test_it_computes_wikipedias_cohen_kappa_example():
    # 50 proposals: yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> p_o 0.7, p_e 0.5, kappa 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)


def test_it_computes_a_three_category_kappa_by_hand():
    # p_o = 4/6; A: a3 b2 c1, B: a2 b2 c2 -> p_e = (6 + 4 + 2)/36 = 1/3; kappa = (2/3 -
    # 1/3)/(2/3) = 0.5.
    assert cohen_kappa(list("aaabbc"), list("aabbcc")) == pytest.approx(0.5)


def test_it_reproduces_krippendorffs_nominal_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", C: 4 observers, 12
    # units, missing data.
    obs = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    units = [[v for v in col if v is not None] for col in zip(*obs, strict=True)]
    assert krippendorff_alpha_nominal(units) == pytest.approx(0.743, abs=5e-4)


def test_it_returns_none_where_the_statistics_are_undefined():
    assert cohen_kappa([], []) is None
    assert cohen_kappa(["x"] * 3, ["x"] * 3) is None
    assert krippendorff_alpha_nominal([]) is None
    assert krippendorff_alpha_nominal([["x", "x"], ["x", "x", "x"]]) is None
    with pytest.raises(ValueError, match="must match"):
        cohen_kappa(["x"], ["x", "y"])


def _alpha_by_definition(units: list[list[str]]) -> float:
    """alpha = 1 - D_o / D_e straight from the pairwise definition (no coincidence matrix)."""
    units = [u for u in units if len(u) >= 2]
    pooled = [v for u in units for v in u]
    n = len(pooled)
    d_o = (
        sum(
            sum(u[i] != u[j] for i in range(len(u)) for j in range(len(u)) if i != j) / (len(u) - 1)
            for u in units
        )
        / n
    )
    d_e = sum(pooled[i] != pooled[j] for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    return 1 - d_o / d_e


def _kappa_by_definition(a: list[str], b: list[str]) -> float:
    cats = sorted(set(a) | set(b))
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    p_e = sum((a.count(c) / n) * (b.count(c) / n) for c in cats)
    return (p_o - p_e) / (1 - p_e)


@pytest.mark.parametrize("seed", range(5))
def test_it_matches_the_definitions_on_random_data(seed):
    rng = random.Random(seed)
    cats = ["hack", "good", "loop", "format"]
    units = [[rng.choice(cats) for _ in range(rng.randint(1, 4))] for _ in range(40)]
    assert krippendorff_alpha_nominal(units) == pytest.approx(_alpha_by_definition(units))
    a = [rng.choice(cats) for _ in range(60)]
    b = [x if rng.random() < 0.6 else rng.choice(cats) for x in a]
    assert cohen_kappa(a, b) == pytest.approx(_kappa_by_definition(a, b))


def test_it_computes_per_label_binary_agreement_by_hand():
    # hack vs not: (T,T) (F,T) (F,F) (F,F) -> o_TT 2, o_TF = o_FT 1, o_FF 4 -> alpha = 1 - 7*2/30 =
    # 0.5333; kappa: p_o 3/4, A says T 1/4, B 2/4 -> p_e = 1/4*2/4 + 3/4*2/4 = 0.5 -> 0.5.
    r = {
        1: {"a": "hack", "b": "hack"},
        2: {"a": "good", "b": "hack"},
        3: {"a": "good", "b": "good"},
        4: {"a": "loop", "b": "loop"},
    }
    res = agreement.agreement(r, ["hack", "good", "loop"])
    assert res.per_label["hack"]["alpha"] == pytest.approx(1 - 14 / 30)
    assert res.per_label["hack"]["pairs"][0].kappa == pytest.approx(0.5)
    assert res.disagreements == [2] and res.items == 4


def test_it_shows_the_queues_agreement_and_disagreements(
    client_as, run, rollouts, personas, make_user
):  # noqa: F811
    bob = make_user("bob", "annotator")
    q = make_queue(run, personas, limit=5, overlap=2, assignees=[personas["annotator"], bob])
    items = list(q.items.select_related("rollout").order_by("position"))
    pairs = [
        ("reward-hacking", "reward-hacking"),
        ("good", "reward-hacking"),
        ("good", "good"),
        ("good", "good"),
    ]
    for item, (x, y) in zip(items, pairs, strict=False):  # the fifth item is rated by bob only
        annotate(item.rollout, personas["annotator"], x, note=f"ann says {x}")
        annotate(item.rollout, bob, y)
    annotate(items[4].rollout, bob, "loop-repetition")  # one rating only: not pairable
    data = services.queue_agreement(q)
    assert data["result"].alpha == pytest.approx(1 - 14 / 30)
    assert data["result"].pairs[0].kappa == pytest.approx(0.5) and data["result"].pairs[0].n == 4
    assert [d["rollout_id"] for d in data["disagreements"]] == [items[1].rollout_id]
    html = client_as("viewer").get(reverse("annotations-agreement", args=[q.id])).content.decode()
    assert 'id="ann-alpha">0.533<' in html and "ann says good" in html
    assert reverse("annotations-focus", args=[q.id, 1]) in html

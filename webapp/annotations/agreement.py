"""Inter-annotator agreement: Cohen's kappa (pairs) and Krippendorff's alpha (nominal, any number of
coders, missing values allowed). Pure functions, no Django: ratings come in as plain dicts.

`None` means "undefined": no pairable data, or no variation at all (every value the same), where
both statistics divide by zero. The pages show it as "—" rather than inventing 1.0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

Ratings = Mapping[Any, Mapping[Any, Hashable]]  # item -> {coder -> value}


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two coders who rated the same items (a[i] and b[i] rate item i).

    kappa = (p_o - p_e) / (1 - p_e), p_o the observed agreement, p_e the agreement expected from
    each coder's own label frequencies.

    Wikipedia's worked example: 50 proposals, both say yes on 20, A yes / B no on 5, A no / B yes on
    10, both no on 15. p_o = 35/50 = 0.7; A says yes 25/50, B 30/50, so p_e = 0.5*0.6 + 0.5*0.4 =
    0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4.

    >>> a = ["yes"] * 20 + ["yes"] * 5 + ["no"] * 10 + ["no"] * 15
    >>> b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    >>> round(cohen_kappa(a, b), 6)
    0.4

    Four items, A = [x, x, y, y], B = [x, y, y, y]: p_o = 3/4, p_e = 0.5*0.25 + 0.5*0.75 = 0.5,
    kappa = 0.5.

    >>> cohen_kappa(["x", "x", "y", "y"], ["x", "y", "y", "y"])
    0.5
    >>> cohen_kappa(["x", "y"], ["y", "x"])  # systematic disagreement: p_o = 0, p_e = 0.5
    -1.0
    >>> cohen_kappa(["x", "x"], ["x", "x"]) is None  # one category only: p_e = 1, undefined
    True
    """
    if len(a) != len(b):
        raise ValueError(
            f"cohen_kappa: the two coders rated {len(a)} and {len(b)} items; they must match"
        )
    n = len(a)
    if n == 0:
        return None
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[k] * cb[k] for k in ca) / (n * n)
    if p_e >= 1.0:
        return None
    return (p_o - p_e) / (1.0 - p_e)


def krippendorff_alpha_nominal(units: Iterable[Sequence[Hashable]]) -> float | None:
    """Krippendorff's alpha for nominal data. `units`: per unit, the values the coders gave
    it (missing values simply left out). Units with fewer than two values are not pairable
    and drop out.

    alpha = 1 - D_o / D_e, from the coincidence matrix o[c][k] = sum over units of the ordered pairs
    (c, k) of values within the unit, each unit's pairs weighted 1 / (m_u - 1):
    D_o = sum_{c != k} o[c][k] / n and D_e = sum_{c != k} n_c n_k / (n (n - 1)).

    Hand-computed: units (a, a), (a, b), (b, b), (b, b). o_aa = 2, o_ab = o_ba = 1, o_bb = 4; n_a =
    3, n_b = 5, n = 8. alpha = 1 - (n - 1) * 2 / (2 * 3 * 5) = 1 - 14/30 = 0.5333...

    >>> round(krippendorff_alpha_nominal([["a", "a"], ["a", "b"], ["b", "b"], ["b", "b"]]), 4)
    0.5333

    Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", example C: four observers,
    twelve units, missing values; his hand computation gives nominal alpha = 0.743.

    >>> A = [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None]
    >>> B = [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3]
    >>> C = [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None]
    >>> D = [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None]
    >>> units = [[v for v in col if v is not None] for col in zip(A, B, C, D)]
    >>> round(krippendorff_alpha_nominal(units), 3)
    0.743
    >>> krippendorff_alpha_nominal([["a", "a"], ["a", "a"]]) is None  # no variation: undefined
    True
    >>> krippendorff_alpha_nominal([["a"], ["b"]]) is None  # nothing pairable
    True
    """
    coincidences: Counter[tuple[Hashable, Hashable]] = Counter()
    for unit in units:
        values = list(unit)
        m = len(values)
        if m < 2:
            continue
        counts = Counter(values)
        # Ordered pairs of distinct coders within the unit: count(c) * count(k), minus self-pairs
        # when c == k.
        for c, nc in counts.items():
            for k, nk in counts.items():
                pairs = nc * (nk - 1) if c == k else nc * nk
                if pairs:
                    coincidences[(c, k)] += pairs / (m - 1)
    n_c: Counter[Hashable] = Counter()
    for (c, _k), v in coincidences.items():
        n_c[c] += v
    n = sum(n_c.values())
    if n <= 1:
        return None
    observed = sum(v for (c, k), v in coincidences.items() if c != k)
    expected = sum(n_c[c] * n_c[k] for c in n_c for k in n_c if c != k)
    if expected == 0:
        return None
    return 1.0 - (n - 1) * observed / expected


@dataclass
class PairKappa:
    coders: tuple[Any, Any]
    n: int  # items both rated
    kappa: float | None


@dataclass
class Agreement:
    """Agreement over the items rated by two or more coders."""

    items: int  # items with at least two ratings
    alpha: float | None
    pairs: list[PairKappa]
    per_label: dict[Hashable, dict[str, Any]] = field(
        default_factory=dict
    )  # label -> {"alpha", "pairs"}
    disagreements: list[Any] = field(
        default_factory=list
    )  # item keys whose coders gave different values


def _pairs(ratings: Ratings, value: Any) -> list[PairKappa]:
    coders = sorted({c for r in ratings.values() for c in r}, key=str)
    out = []
    for x, y in combinations(coders, 2):
        common = [r for r in ratings.values() if x in r and y in r]
        if common:
            out.append(
                PairKappa(
                    (x, y),
                    len(common),
                    cohen_kappa([value(r[x]) for r in common], [value(r[y]) for r in common]),
                )
            )
    return out


def agreement(ratings: Ratings, labels: Iterable[Hashable] | None = None) -> Agreement:
    """Overall (every label a category) and per label (binary: this label vs any other) agreement.

    >>> r = {1: {"ann": "hack", "bob": "hack"}, 2: {"ann": "good", "bob": "hack"},
    ...      3: {"ann": "good", "bob": "good"}, 4: {"ann": "good", "bob": "good"},
    ...      5: {"ann": "loop"}}
    >>> res = agreement(r, labels=["hack", "good", "loop"])
    >>> res.items, res.disagreements, round(res.alpha, 4), res.pairs[0].n, res.pairs[0].kappa
    (4, [2], 0.5333, 4, 0.5)
    >>> # loop: never paired
    >>> round(res.per_label["hack"]["alpha"], 4), res.per_label["loop"]["alpha"] is None
    (0.5333, True)
    """
    multi = {item: r for item, r in ratings.items() if len(r) >= 2}
    label_set = (
        list(labels)
        if labels is not None
        else sorted({v for r in multi.values() for v in r.values()}, key=str)
    )
    result = Agreement(
        items=len(multi),
        alpha=krippendorff_alpha_nominal([list(r.values()) for r in multi.values()]),
        pairs=_pairs(multi, lambda v: v),
        disagreements=[item for item, r in multi.items() if len(set(r.values())) > 1],
    )
    for label in label_set:
        result.per_label[label] = {
            "alpha": krippendorff_alpha_nominal(
                [[v == label for v in r.values()] for r in multi.values()]
            ),
            "pairs": _pairs(multi, lambda v, label=label: v == label),
        }
    return result

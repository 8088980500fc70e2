"""Component health and failure-mode detectors. Pure numpy, no Django (ablations:
training/ablation.py).

GRPO learns only from differences inside a group: a component that is constant across the G
completions of one prompt produces no advantage, whatever its weight. Everything here is measured
*within groups* for that reason: within-group std, the within-group covariance of the components
(which decides each one's share of the advantage), and within-group correlations.

Inputs are arrays over rollouts (`RunArrays`): an (N, K) matrix of component values (NaN where a
component did not score), group ids, steps and lengths. The webapp reads them from the database
(webapp/diagnostics/services.py); the trainer or a notebook can build them directly. Advantages are
always recomputed with `training.stats.compute_advantages`, the same function ingestion uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from . import stats

SEMANTIC_KINDS = ("outcome", "process")  # what the task is about: depends on the prompt
SYNTAX_KINDS = ("behavioural",)  # form and validity: satisfiable without reading the prompt
DENSE_KINDS = ("behavioural", "process")  # scored on every completion, easy to saturate
UNSTABLE_KEYS = (
    "kl",
    "clip_ratio",
    "grad_norm",
)  # TRL's logged keys (prefix match after an optional "train/")
# Below these a value is never a spike, however flat the rest of the series (clip ratios sit at
# exactly 0 for whole runs when num_iterations == 1, so a robust spread of 0 would call any
# 0.001 a spike).
SPIKE_FLOOR = {"kl": 0.05, "clip_ratio": 0.05, "grad_norm": 1.0}


@dataclass(frozen=True)
class ComponentInfo:
    name: str
    weight: float
    kind: str = "outcome"  # outcome / process / behavioural / penalty
    min_value: float | None = None  # declared range; None: the observed one is used
    max_value: float | None = None


@dataclass
class RunArrays:
    """One row per rollout. `group_ids` may be any integers (database ids)."""

    components: list[ComponentInfo]
    matrix: np.ndarray  # (N, K) float64, NaN = not scored
    group_ids: np.ndarray  # (N,) int64
    steps: np.ndarray  # (N,) int64
    lengths: np.ndarray | None = None  # (N,) float64, NaN = unknown
    rollout_ids: np.ndarray | None = None  # (N,) int64

    def __post_init__(self) -> None:
        n = self.matrix.shape[0]
        if self.matrix.ndim != 2 or self.matrix.shape[1] != len(self.components):
            raise ValueError(
                f"matrix: expected shape (N, {len(self.components)}), got {self.matrix.shape}"
            )
        for name in ("group_ids", "steps", "lengths", "rollout_ids"):
            a = getattr(self, name)
            if a is not None and a.shape != (n,):
                raise ValueError(f"{name}: expected shape ({n},), got {a.shape}")

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def weights(self) -> np.ndarray:
        return np.array([c.weight for c in self.components], dtype=np.float64)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def select(self, mask: np.ndarray) -> RunArrays:
        pick = lambda a: None if a is None else a[mask]  # noqa: E731
        return replace(
            self,
            matrix=self.matrix[mask],
            group_ids=self.group_ids[mask],
            steps=self.steps[mask],
            lengths=pick(self.lengths),
            rollout_ids=pick(self.rollout_ids),
        )

    def last_steps(self, n_steps: int | None) -> RunArrays:
        """The rollouts of the last `n_steps` distinct steps (all of them when None)."""
        if n_steps is None or self.n == 0:
            return self
        uniq = np.unique(self.steps)
        if uniq.size <= n_steps:
            return self
        return self.select(self.steps >= uniq[-n_steps])

    def rewards(self, weights: np.ndarray | None = None) -> np.ndarray:
        """The aggregate reward under sum-then-normalise (TRL's r = nansum_k w_k r_k;
        NaN if unscorable)."""
        w = self.weights if weights is None else weights
        r = np.nansum(self.matrix * w[None, :], axis=1)
        r[np.isnan(self.matrix).all(axis=1)] = np.nan
        return r


def dense_ids(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Relabel arbitrary integer ids to 0..M-1 (for bincount); returns (ids, M)."""
    if ids.size == 0:
        return ids.astype(np.int64), 0
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 8 * ids.size + 1024:
        # Database ids of one run are nearly contiguous: a lookup table beats np.unique's sort.
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[ids - lo] = True
        table = np.cumsum(present) - 1
        return table[ids - lo].astype(np.int64), int(present.sum())
    uniq, inv = np.unique(ids, return_inverse=True)
    return inv.astype(np.int64), int(uniq.size)


def regular_blocks(gidx: np.ndarray, m: int) -> tuple[np.ndarray, int] | None:
    """(row permutation that lines rows up group after group, G) when every group has the same
    size G: then per-group work is a row-wise operation on an (M, G) array, with no sort over
    all N rows."""
    n = gidx.size
    if m == 0 or n % m:
        return None
    size = n // m
    if (np.bincount(gidx, minlength=m) != size).any():
        return None
    return np.argsort(gidx, kind="stable"), size


# --------------------------------------------------------------------------------------------
# Component health
# --------------------------------------------------------------------------------------------


@dataclass
class ComponentHealth:
    name: str
    kind: str
    weight: float
    mean: float  # over rollouts
    within_std: float  # mean over groups of the within-group std
    zero_std_frac: float  # fraction of groups (where it scored) in which it is constant
    # Share of the within-group variance of the weighted reward (sums to 1 over components)
    share: float
    at_max: float  # fraction of scored rollouts at the top of its range
    at_min: float  # ... at the bottom
    lo: float
    hi: float
    range_declared: bool
    level: float  # mean mapped to [0, 1] over (lo, hi); NaN when lo == hi
    corr_length: float  # within-group correlation with completion length
    scored_frac: float  # fraction of rollouts it scored

    def as_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in asdict(self).items()}


@dataclass
class HealthReport:
    components: list[ComponentHealth]
    corr_labels: list[str]  # component names, then "length" and "reward"
    corr: np.ndarray  # within-group correlation matrix over corr_labels
    n_rollouts: int
    n_groups: int
    step_min: int | None
    step_max: int | None
    reward_zero_std_frac: float  # groups whose aggregate reward is constant (no advantage at all)

    def by_name(self) -> dict[str, ComponentHealth]:
        return {c.name: c for c in self.components}

    def as_dict(self) -> dict[str, Any]:
        return {
            "components": [c.as_dict() for c in self.components],
            "corr_labels": self.corr_labels,
            "corr": [[_json_float(x) for x in row] for row in self.corr.tolist()],
            "n_rollouts": self.n_rollouts,
            "n_groups": self.n_groups,
            "step_min": self.step_min,
            "step_max": self.step_max,
            "reward_zero_std_frac": _json_float(self.reward_zero_std_frac),
        }


def _json_float(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def within_group_cov(
    values: np.ndarray, gidx: np.ndarray, m: int
) -> tuple[np.ndarray, stats.GroupStats]:
    """Pooled within-group covariance of the columns of `values` (N, P), NaN-aware.

    A missing value contributes a zero deviation (it neither adds nor removes variance). Returns
    (cov (P, P), the per-group statistics of every column). Each group's deviations are taken from
    its own mean, so between-prompt differences, which GRPO discards, never enter.
    """
    st = stats.group_stats(values, gidx, m)
    dev = np.where(np.isnan(values), 0.0, values - st.mean[gidx])
    dev = np.nan_to_num(dev, nan=0.0)
    dof = max(int(np.sum(np.maximum(np.bincount(gidx, minlength=m) - 1, 0))), 1)
    return dev.T @ dev / dof, st


def advantage_shares(weights: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """share_k = sum_j w_k w_j cov_kj / var(sum_k w_k r_k): each component's part of the
    within-group variance of the weighted reward, i.e. of what the advantage is made of. Sums to 1;
    NaN when the weighted reward never varies inside a group.

    >>> advantage_shares(np.array([1.0, 5.0]), np.array([[0.25, 0.0], [0.0, 0.0]])).tolist()
    [1.0, 0.0]
    """
    cw = cov @ weights
    total = float(weights @ cw)
    if not total > 1e-12:
        return np.full(weights.shape, np.nan)
    return weights * cw / total


def _corr_from_cov(cov: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        c = cov / np.outer(d, d)
    c[np.outer(d, d) <= 1e-12] = np.nan
    return np.clip(c, -1.0, 1.0)


def _range(col: np.ndarray, info: ComponentInfo) -> tuple[float, float, bool]:
    finite = col[~np.isnan(col)]
    obs_lo = float(finite.min()) if finite.size else math.nan
    obs_hi = float(finite.max()) if finite.size else math.nan
    lo = info.min_value if info.min_value is not None else obs_lo
    hi = info.max_value if info.max_value is not None else obs_hi
    return float(lo), float(hi), info.min_value is not None and info.max_value is not None


def _at_bounds(col: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    finite = col[~np.isnan(col)]
    if finite.size == 0 or math.isnan(lo) or math.isnan(hi):
        return math.nan, math.nan
    if hi - lo <= 1e-12:
        # A constant undeclared range: a value at or below zero reads as stuck at the floor, above
        # as at the ceiling (a 0/1 verifier that never fires vs. one that always does).
        v = float(finite.mean())
        return (1.0, 0.0) if v > 0 else (0.0, 1.0)
    tol = 1e-6 * (hi - lo)
    return float(np.mean(finite >= hi - tol)), float(np.mean(finite <= lo + tol))


def component_health(data: RunArrays) -> HealthReport:
    """Per-component health over all rollouts in `data` (pass `data.last_steps(n)` for a window)."""
    k = len(data.components)
    gidx, m = dense_ids(data.group_ids)
    lengths = data.lengths if data.lengths is not None else np.full(data.n, np.nan)
    rewards = data.rewards()
    cols = (
        np.column_stack([data.matrix, lengths.astype(np.float64), rewards])
        if data.n
        else np.zeros((0, k + 2))
    )
    cov, cs = within_group_cov(cols, gidx, m) if data.n else (np.zeros((k + 2, k + 2)), None)
    corr = _corr_from_cov(cov)
    shares = advantage_shares(data.weights, cov[:k, :k])
    out = []
    for j, info in enumerate(data.components):
        col = data.matrix[:, j]
        scored = ~np.isnan(col)
        has = cs.count[:, j] > 0 if cs is not None else np.zeros(0, dtype=bool)
        zero = cs.zero_std[:, j][has] if cs is not None else np.zeros(0, dtype=bool)
        lo, hi, declared = _range(col, info)
        at_max, at_min = _at_bounds(col, lo, hi)
        mean = float(np.nanmean(col)) if scored.any() else math.nan
        std_g = cs.std[:, j][has] if cs is not None else np.zeros(0)
        out.append(
            ComponentHealth(
                name=info.name,
                kind=info.kind,
                weight=info.weight,
                mean=mean,
                within_std=float(np.nanmean(std_g)) if np.isfinite(std_g).any() else math.nan,
                zero_std_frac=float(zero.mean()) if zero.size else math.nan,
                share=float(shares[j]),
                at_max=at_max,
                at_min=at_min,
                lo=lo,
                hi=hi,
                range_declared=declared,
                level=(mean - lo) / (hi - lo) if hi - lo > 1e-12 else math.nan,
                corr_length=float(corr[j, k]),
                scored_frac=float(scored.mean()) if data.n else math.nan,
            )
        )
    # The last column of `cols` is the aggregate reward: its zero-std groups are the ones
    # that teach nothing.
    rz = (
        cs.zero_std[:, k + 1][cs.count[:, k + 1] > 0] if cs is not None else np.zeros(0, dtype=bool)
    )
    steps = data.steps
    return HealthReport(
        components=out,
        corr_labels=[*data.names, "length", "reward"],
        corr=corr,
        n_rollouts=data.n,
        n_groups=m,
        step_min=int(steps.min()) if steps.size else None,
        step_max=int(steps.max()) if steps.size else None,
        reward_zero_std_frac=float(rz.mean()) if rz.size else math.nan,
    )


# --------------------------------------------------------------------------------------------
# Detectors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    dead_zero_std: float = 0.95  # zero within-group std in this fraction of groups = dead
    unreachable_at_min: float = 0.95
    saturated_at_max: float = 0.90
    saturated_zero_std: float = 0.90
    flat_zero_std: float = 0.80  # semantic component "flat": constant in this fraction of groups
    high_level: float = 0.80  # "high" / "low" on the component's range mapped to [0, 1]
    low_level: float = 0.20
    length_corr: float = 0.50
    length_rise: float = 0.15  # relative rise in mean length, first vs last third of the steps
    collapse_frac: float = 0.10  # fraction of groups where aggregation erases a distinction
    spike_mads: float = 8.0
    spike_ratio: float = 3.0
    min_metric_points: int = 8
    quality_bad_share: float = 0.25
    quality_min_annotated: int = 10
    min_groups: int = 5  # below this, say nothing
    # Over time: a state must hold over the last max(min_hold_steps, min_hold_frac x steps) steps at
    # least to be reported from an onset (short suffixes are noise); at most max_onset_candidates
    # start steps tried.
    min_hold_steps: int = 3
    min_hold_frac: float = 0.2
    max_onset_candidates: int = 200
    collapse_most: float = (
        0.5  # signal collapse: at least this fraction of groups teach nothing since the onset
    )
    collapse_rise: float = 0.25  # ... up by this much from before the onset
    collapse_critical: float = 0.8
    validity_level: float = (
        0.7  # kind-free: a component this high on its range reads as validity-like
    )


@dataclass
class Finding:
    code: str
    severity: str  # critical / warning / info
    title: str  # plain words
    detail: str  # the numbers behind it
    fix: str  # what to try
    component: str | None = None
    sort: str | None = (
        None  # explorer sort key for example transcripts (a component, "length", "reward")
    )
    order: str = "desc"
    evidence: dict[str, Any] = field(default_factory=dict)
    onset_step: int | None = None  # the first step from which it holds (to the end of the window)
    # False when the onset is the first step that was read and earlier steps were not: it held
    # since that step *or earlier* (a flagged gap, not a window's edge passed off as an onset).
    onset_known: bool = True

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"] = {k: _json_float(v) for k, v in self.evidence.items()}
        return d


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def detect_dead(h: HealthReport, t: Thresholds, skip: set[str]) -> list[Finding]:
    out = []
    total_w = sum(abs(c.weight) for c in h.components) or 1.0
    for c in h.components:
        if c.name in skip or not (c.zero_std_frac >= t.dead_zero_std) or h.n_groups < t.min_groups:
            continue
        heavy = abs(c.weight) / total_w >= 0.3
        if _never_left_floor(c):
            out.append(_never_varies(c, h, heavy))
            continue
        if c.at_max >= 0.9:
            fix = (
                "It is already satisfied everywhere: drop it, or keep it as a filter/gate "
                "rather than a reward."
            )
        elif c.at_min >= 0.9:
            fix = (
                "Nothing reaches it: add partial credit so that better attempts score higher, "
                "or drop it."
            )
        else:
            fix = (
                "Make it graded (partial credit) so that completions of one prompt differ, or "
                "drop it."
            )
        out.append(
            Finding(
                code="dead_component",
                severity="critical" if heavy else "warning",
                component=c.name,
                sort=c.name,
                title=f"'{c.name}' is constant inside {_pct(c.zero_std_frac)} of groups from step "
                f"{h.step_min}: it produces no advantage whatever its weight ({c.weight:g}).",
                detail=f"zero within-group std in {_pct(c.zero_std_frac)} of {h.n_groups} groups "
                f"over steps {h.step_min}-{h.step_max}; share of the advantage {_pct(c.share)}; "
                f"mean {c.mean:.3g}.",
                fix=fix,
                evidence={"zero_std_frac": c.zero_std_frac, "share": c.share, "weight": c.weight},
            )
        )
    return out


def _never_left_floor(c: ComponentHealth) -> bool:
    """At its minimum in every rollout (so constant in every group): not one success
    to learn from."""
    return c.zero_std_frac >= 1.0 and c.at_min >= 1.0


def _never_varies(c: ComponentHealth, h: HealthReport, heavy: bool) -> Finding:
    # A scorer stuck on one value has as often never run (a harness that returns before
    # executing the submission) as it has faced an impossible task: the values cannot tell these
    # apart, the reasons can.
    return Finding(
        code="dead_component",
        severity="critical" if heavy else "warning",
        component=c.name,
        sort=c.name,
        title=f"'{c.name}' scored {c.mean:g} in every rollout from step {h.step_min}: it never "
        f"varies, so it produces no advantage whatever its weight ({c.weight:g}).",
        detail=f"{h.n_rollouts} rollouts in {h.n_groups} groups over steps "
        f"{h.step_min}-{h.step_max}, all at its minimum {c.lo:g}; share of the advantage "
        f"{_pct(c.share)}.",
        fix="Check that its verifier actually runs: a scorer that never varies has often never "
        "executed the submission (read this component's reason in a few transcripts). If it does "
        "run, the task is out of reach: SFT on teacher traces first, or add partial credit. "
        "Dropping it in an ablation should change nothing; compare with a run where it works.",
        evidence={
            "zero_std_frac": c.zero_std_frac,
            "at_min": c.at_min,
            "share": c.share,
            "weight": c.weight,
            "value": c.mean,
        },
    )


def detect_unreachable(h: HealthReport, t: Thresholds) -> list[Finding]:
    out = []
    for c in h.components:
        if (
            c.kind != "outcome"
            or not (c.at_min >= t.unreachable_at_min)
            or h.n_groups < t.min_groups
        ):
            continue
        if _never_left_floor(
            c
        ):  # not one success: detect_dead says so, with the verifier as a suspect
            continue
        out.append(
            Finding(
                code="unreachable_reward",
                severity="critical",
                component=c.name,
                sort=c.name,
                order="desc",
                title=f"The outcome reward '{c.name}' is at its minimum for {_pct(c.at_min)} of "
                f"rollouts from step {h.step_min}: the policy almost never succeeds, so there is "
                "almost nothing to learn from.",
                detail=f"minimum {c.lo:g} ({'declared' if c.range_declared else 'observed'}); mean "
                f"{c.mean:.3g}; constant inside {_pct(c.zero_std_frac)} of groups.",
                fix="Do SFT on teacher trajectories first (SFT buys you syntax), simplify the "
                "action space, or add partial credit for intermediate progress. The rare successes "
                "are listed first below.",
                evidence={"at_min": c.at_min, "zero_std_frac": c.zero_std_frac},
            )
        )
    return out


def detect_saturation(h: HealthReport, t: Thresholds) -> list[Finding]:
    outcomes = [c for c in h.components if c.kind == "outcome"]
    if not outcomes or h.n_groups < t.min_groups:
        return []
    out = []
    for c in h.components:
        saturated = c.at_max >= t.saturated_at_max and c.zero_std_frac >= t.saturated_zero_std
        if c.kind not in DENSE_KINDS or not saturated:
            continue
        o = min(outcomes, key=lambda x: x.zero_std_frac if not math.isnan(x.zero_std_frac) else 1.0)
        flat = o.zero_std_frac >= t.flat_zero_std
        state = (
            f"stays flat (constant in {_pct(o.zero_std_frac)} of groups)"
            if flat
            else f"still varies (constant in only {_pct(o.zero_std_frac)} of groups)"
        )
        out.append(
            Finding(
                code="saturation",
                severity="warning",
                component=c.name,
                sort=o.name,
                order="asc",
                title=f"'{c.name}' is saturated from step {h.step_min}: at its maximum in "
                f"{_pct(c.at_max)} of rollouts and constant in {_pct(c.zero_std_frac)} of groups "
                f"since, while the outcome '{o.name}' {state}.",
                detail=f"'{c.name}' weight {c.weight:g}, share of the advantage {_pct(c.share)}; "
                f"'{o.name}' weight {o.weight:g}, share {_pct(o.share)}.",
                fix=f"Lower the weight of '{c.name}' (it no longer separates completions) or raise "
                f"the weight of '{o.name}'; consider turning '{c.name}' into a gate.",
                evidence={
                    "at_max": c.at_max,
                    "zero_std_frac": c.zero_std_frac,
                    "outcome_zero_std": o.zero_std_frac,
                },
            )
        )
    return out


def _semantic_syntax(h: HealthReport) -> tuple[list[ComponentHealth], list[ComponentHealth]]:
    sem = [c for c in h.components if c.kind in SEMANTIC_KINDS]
    syn = [c for c in h.components if c.kind in SYNTAX_KINDS]
    return sem, syn


def detect_trivial_outputs(h: HealthReport, t: Thresholds) -> list[Finding]:
    sem, syn = _semantic_syntax(h)
    if not sem or not syn or h.n_groups < t.min_groups:
        return []
    valid_saturated = all(c.at_max >= t.saturated_at_max for c in syn)
    task_flat = all(c.zero_std_frac >= t.flat_zero_std and not (c.level >= 0.5) for c in sem)
    if not (valid_saturated and task_flat):
        return []
    names = lambda cs: ", ".join(f"'{c.name}'" for c in cs)  # noqa: E731
    return [
        Finding(
            code="trivial_outputs",
            severity="critical",
            component=sem[0].name,
            sort=sem[0].name,
            order="asc",
            title=f"Valid but trivial outputs: validity ({names(syn)}) is saturated while the task "
            f"({names(sem)}) is flat. The policy learned to pass the checks and stopped there.",
            detail="; ".join(f"'{c.name}' at max {_pct(c.at_max)}" for c in syn)
            + "; "
            + "; ".join(
                f"'{c.name}' constant in {_pct(c.zero_std_frac)} of groups, mean {c.mean:.3g}"
                for c in sem
            ),
            fix="Make validity a precondition of the task reward (a gate) instead of an additive "
            "bonus, lower its weight, and add partial credit to the task reward. Read the "
            "transcripts: they are likely empty or minimal outputs that happen to parse.",
            evidence={
                "syntax_at_max": min(c.at_max for c in syn),
                "semantic_zero_std": min(c.zero_std_frac for c in sem),
            },
        )
    ]


def detect_ignores_prompt(h: HealthReport, t: Thresholds) -> list[Finding]:
    sem, syn = _semantic_syntax(h)
    if not sem or not syn or h.n_groups < t.min_groups:
        return []
    if not (all(c.level >= t.high_level for c in syn) and all(c.level <= t.low_level for c in sem)):
        return []
    names = lambda cs: ", ".join(f"'{c.name}' {c.level:.2f}" for c in cs)  # noqa: E731
    return [
        Finding(
            code="ignores_prompt",
            severity="warning",
            component=sem[0].name,
            sort=syn[0].name,
            order="desc",
            title="Valid but ignores the prompt: the syntax components are high while the "
            "prompt-dependent components stay low.",
            detail=f"levels on each component's range: syntax {names(syn)}; task {names(sem)}.",
            fix="Read the top-validity transcripts against their prompts. Add prompt-conditioned "
            "partial credit (reward the entities and constraints the prompt asks for), and SFT on "
            "teacher traces that do follow the prompt before GRPO.",
            evidence={
                "syntax_level": min(c.level for c in syn),
                "semantic_level": max(c.level for c in sem),
            },
        )
    ]


def _thirds_rise(steps: np.ndarray, values: np.ndarray) -> float:
    """Relative change of the mean of `values` between the first and last third of
    the distinct steps."""
    ok = ~np.isnan(values)
    steps, values = steps[ok], values[ok]
    uniq = np.unique(steps)
    if uniq.size < 3:
        return math.nan
    a, b = uniq[uniq.size // 3], uniq[-(uniq.size // 3) - 1]
    first, last = values[steps < a], values[steps > b]
    if not first.size or not last.size:
        return math.nan
    base = float(np.mean(first))
    return (float(np.mean(last)) - base) / max(abs(base), 1e-9)


def detect_length_hacking(data: RunArrays, h: HealthReport, t: Thresholds) -> list[Finding]:
    if data.lengths is None or h.n_groups < t.min_groups:
        return []
    k = len(data.components)
    corr = float(h.corr[k + 1, k])  # reward vs length, within groups
    rise = _thirds_rise(data.steps, data.lengths.astype(np.float64))
    if not (corr >= t.length_corr and rise >= t.length_rise):
        return []
    top = max(h.components, key=lambda c: c.corr_length if not math.isnan(c.corr_length) else -2)
    return [
        Finding(
            code="length_hacking",
            severity="warning",
            component=top.name,
            sort="length",
            order="desc",
            title="Length hacking: inside groups, longer completions get more reward (correlation "
            f"{corr:.2f}) and the mean length rose {_pct(rise)} over steps "
            f"{h.step_min}-{h.step_max}.",
            detail=f"the component most tied to length is '{top.name}' (within-group correlation "
            f"{top.corr_length:.2f}).",
            fix=f"Check '{top.name}' for rewarding verbosity: cap or normalise it by length, add a "
            "length penalty, or score only the final answer. Read the longest transcripts.",
            evidence={"corr": corr, "rise": rise},
        )
    ]


def aggregation_collapse(data: RunArrays) -> dict[str, float]:
    """Under sum-then-normalise, distinct component vectors inside one group can sum to the same
    reward (e.g. [1, 0] and [0, 1] with equal weights) and so receive the same advantage. Counts
    groups where that happens and how many of them normalise-then-sum (GDPO) would tell apart."""
    k = len(data.components)
    if data.n == 0 or k < 2:
        return {
            "groups": 0,
            "collapsed": 0,
            "frac": math.nan,
            "rollouts_frac": math.nan,
            "resolved_frac": math.nan,
        }
    gidx, m = dense_ids(data.group_ids)
    blocks = regular_blocks(gidx, m)
    g_hash = _hash_columns(gidx.astype(np.float64)[:, None]) if blocks is None else None
    vec = _hash_columns(data.matrix)
    rew = _hash_columns(data.rewards()[:, None])
    alt = stats.compute_advantages(
        data.matrix, data.weights, gidx, aggregation="normalize_then_sum", batch_ids=data.steps
    )
    n_vec = _distinct_per_group(vec, gidx, m, blocks)
    n_rew = _distinct_per_group(rew, gidx, m, blocks)
    n_alt = _distinct_per_group(
        _hash_columns(np.round(alt.advantages, 6)[:, None]), gidx, m, blocks
    )
    multi = n_vec > 1
    collapsed = multi & (n_rew < n_vec)
    # Rollouts whose (group, reward) is shared with a different component vector.
    if blocks is not None:
        perm, size = blocks
        rb, vb = rew[perm].reshape(m, size), vec[perm].reshape(m, size)
        clash = (rb[:, :, None] == rb[:, None, :]) & (
            vb[:, :, None] != vb[:, None, :]
        )  # (M, G, G), G small
        rollout_collapsed = clash.any(axis=2)
    else:
        with np.errstate(over="ignore"):
            _, rew_key = np.unique(_mix(g_hash, rew), return_inverse=True)
            _, first = np.unique(_mix(_mix(g_hash, rew), vec), return_index=True)
        vectors_per_reward = np.bincount(rew_key.reshape(-1)[first])
        rollout_collapsed = vectors_per_reward[rew_key.reshape(-1)] > 1
    n_multi = int(multi.sum())
    return {
        "groups": n_multi,
        "collapsed": int(collapsed.sum()),
        "frac": float(collapsed.sum() / n_multi) if n_multi else math.nan,
        "rollouts_frac": float(rollout_collapsed.mean()),
        "resolved_frac": float(np.mean(n_alt[collapsed] >= n_vec[collapsed]))
        if collapsed.any()
        else math.nan,
    }


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64 constants


def _mix(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Fold 64-bit words into a running hash (splitmix64 finaliser; uint64 arithmetic wraps)."""
    z = (h * np.uint64(31)) ^ v
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _hash_columns(x: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of values rounded to 1e-9 (NaN is a value of its own). Distinct rows
    collide with probability ~N^2 / 2^64: a hash replaces np.unique(axis=0), which sorts rows of
    void bytes and takes seconds at a million rows."""
    r = np.round(np.asarray(x, dtype=np.float64), 9) + 0.0  # + 0.0 folds -0.0 into 0.0
    bits = np.where(np.isnan(r), np.inf, r).view(np.uint64) ^ np.isnan(r).astype(np.uint64)
    h = np.zeros(r.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(r.shape[1]):
            h = _mix(h, bits[:, j])
    return h


def _distinct_per_group(
    h: np.ndarray, gidx: np.ndarray, m: int, blocks: tuple[np.ndarray, int] | None
) -> np.ndarray:
    """Number of distinct hashes in each group."""
    if blocks is not None:
        perm, size = blocks
        srt = np.sort(h[perm].reshape(m, size), axis=1)
        return 1 + (srt[:, 1:] != srt[:, :-1]).sum(axis=1)
    with np.errstate(over="ignore"):
        _, first = np.unique(
            _mix(_hash_columns(gidx.astype(np.float64)[:, None]), h), return_index=True
        )
    return np.bincount(gidx[first], minlength=m)


def detect_aggregation_collapse(c: dict[str, float], t: Thresholds) -> list[Finding]:
    """`c` is aggregation_collapse()'s result (empty when the run does not sum then normalise)."""
    if not c or not c["groups"] >= t.min_groups or not c["frac"] >= t.collapse_frac:
        return []
    resolved = c["resolved_frac"]
    return [
        Finding(
            code="aggregation_collapse",
            severity="warning",
            sort="reward",
            order="desc",
            title=f"Aggregation collapse: in {_pct(c['frac'])} of groups, completions with "
            f"different component scores sum to the same reward and so get the same advantage.",
            detail=f"{c['collapsed']} of {c['groups']} groups with distinct component vectors; "
            f"{_pct(c['rollouts_frac'])} of rollouts affected. Normalise-then-sum would tell apart "
            f"the completions in {_pct(resolved)} of those groups.",
            fix="Set multi_objective_aggregation='normalize_then_sum' (each component normalised "
            "inside its group before the weighted sum), or change the weights so that different "
            "trade-offs do not cancel exactly. Try it first as an ablation.",
            evidence=c,
        )
    ]


def detect_unstable(
    metrics: dict[str, tuple[np.ndarray, np.ndarray]] | None, t: Thresholds
) -> list[Finding]:
    """Spikes in KL, clip ratio or grad norm as TRL logs them
    (`kl`, `clip_ratio/region_mean`, `grad_norm`).

    A spike is a value above median + spike_mads robust deviations and above spike_ratio x the
    median; a logged non-finite value (stored as NULL) means the run diverged.
    """
    out = []
    for name, (steps, values) in sorted((metrics or {}).items()):
        base = name.split("/", 1)[1] if name.startswith("train/") else name
        key = next((k for k in UNSTABLE_KEYS if base == k or base.startswith(k + "/")), None)
        if key is None:
            continue
        v = np.asarray(values, dtype=np.float64)
        s = np.asarray(steps)
        bad = np.isnan(v)
        finite = v[~bad]
        if finite.size < t.min_metric_points and not bad.any():
            continue
        med = float(np.median(finite)) if finite.size else 0.0
        mad = float(np.median(np.abs(finite - med))) * 1.4826 if finite.size else 0.0
        limit = max(med + t.spike_mads * mad, t.spike_ratio * abs(med), SPIKE_FLOOR[key])
        spikes = (~bad) & (v > limit) if finite.size >= t.min_metric_points else np.zeros_like(bad)
        if not (spikes.any() or bad.any()):
            continue
        where = s[spikes | bad][:8].tolist()
        out.append(
            Finding(
                code="unstable",
                severity="critical" if bad.any() else "warning",
                sort="reward",
                order="desc",
                title=f"Unstable run: '{name}' "
                + ("went non-finite" if bad.any() else "spikes")
                + f" at step{'s' if len(where) > 1 else ''} {', '.join(map(str, where))}.",
                detail=f"median {med:.3g}, robust spread {mad:.3g}; {int(spikes.sum())} spikes "
                f"above {limit:.3g}, {int(bad.sum())} non-finite values.",
                fix="Lower the learning rate, raise beta (the KL coefficient), clip gradients "
                "(max_grad_norm), and read the rollouts of the steps just before the spike for "
                "reward outliers.",
                evidence={
                    "metric": name,
                    "first_step": where[0] if where else None,
                    "spikes": int(spikes.sum()),
                    "non_finite": int(bad.sum()),
                },
            )
        )
    return out


def quality_gap(
    rollout_ids: np.ndarray,
    rewards: np.ndarray,
    steps: np.ndarray,
    bad_case_ids: Callable[[], Iterable[int]],
    annotated_ids: Callable[[], Iterable[int]] | None = None,
    t: Thresholds = Thresholds(),
    top_quantile: float = 0.8,
) -> list[Finding]:
    """Reward rises but annotated quality does not: the share of annotated bad cases among
    high-reward rollouts. `bad_case_ids()` returns the ids of rollouts annotated as bad;
    `annotated_ids()`, when given, every annotated rollout (the denominator); otherwise every
    high-reward rollout counts."""
    ok = ~np.isnan(rewards)
    if ok.sum() < t.min_groups:
        return []
    cut = float(np.quantile(rewards[ok], top_quantile))
    high = ok & (rewards >= cut)
    bad = np.isin(rollout_ids, np.fromiter(bad_case_ids(), dtype=np.int64))
    denom_mask = (
        high & np.isin(rollout_ids, np.fromiter(annotated_ids(), dtype=np.int64))
        if annotated_ids
        else high
    )
    n_annot = int(denom_mask.sum())
    if n_annot < t.quality_min_annotated:
        return []
    share = float((bad & denom_mask).sum() / n_annot)
    rise = _thirds_rise(steps, rewards)
    if not (share >= t.quality_bad_share):
        return []
    rising = rise > 0.05
    return [
        Finding(
            code="reward_vs_quality",
            severity="critical" if rising else "warning",
            sort="reward",
            order="desc",
            title=f"{_pct(share)} of the annotated high-reward rollouts are bad cases"
            + (
                f", while the reward rose {_pct(rise)}: the reward is being gamed."
                if rising
                else "."
            ),
            detail=f"{int((bad & denom_mask).sum())} bad of {n_annot} annotated rollouts with "
            f"reward >= {cut:.3g} (top {_pct(1 - top_quantile)}).",
            fix="Read the high-reward bad cases, find what they share, and close the loophole in "
            "the reward (a stricter verifier, a penalty, or a gate); then add them as negative "
            "examples.",
            evidence={"share": share, "annotated": n_annot, "reward_rise": rise, "cut": cut},
        )
    ]


# --------------------------------------------------------------------------------------------
# Over time: per-step health, onsets, signal collapse, kinds inferred from the values
# --------------------------------------------------------------------------------------------


@dataclass
class StepTable:
    """Per-step counts and sums (prefix sums over the distinct steps), from which the health of any
    range of steps follows by one subtraction: trying every start step for an onset costs O(steps x
    K^2) after one pass over the rollouts. Ranges (lo, hi) are the whole table's, so "at max" means
    the same in every range."""

    components: list[ComponentInfo]
    steps: np.ndarray  # (S,) distinct steps, ascending
    lo: np.ndarray  # (K,)
    hi: np.ndarray
    declared: np.ndarray  # (K,) bool
    cum: dict[str, np.ndarray]  # name -> (S + 1, ...) prefix sums over steps

    def total(self, name: str, i0: int, i1: int) -> np.ndarray:
        return self.cum[name][i1] - self.cum[name][i0]

    def health(self, i0: int, i1: int, kinds: dict[str, str] | None = None) -> HealthReport:
        """The component health pooled over steps[i0:i1] (what component_health would say of them,
        less the correlations with length and reward)."""
        t = lambda name: self.total(name, i0, i1)  # noqa: E731
        groups, zero, scored, amax, amin, vsum = (
            t("groups"),
            t("zero"),
            t("scored"),
            t("at_max"),
            t("at_min"),
            t("sum"),
        )
        std_sum, std_n, rows = t("std_sum"), t("std_n"), float(t("rows"))
        k = len(self.components)
        cov = t("cov") / max(float(t("dof")), 1.0)
        shares = advantage_shares(
            np.array([c.weight for c in self.components], dtype=np.float64), cov
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            mean, zfrac, at_max, at_min = vsum / scored, zero / groups, amax / scored, amin / scored
            within = std_sum / std_n
        out = []
        for j, c in enumerate(self.components):
            lo, hi = float(self.lo[j]), float(self.hi[j])
            out.append(
                ComponentHealth(
                    name=c.name,
                    kind=(kinds or {}).get(c.name, c.kind),
                    weight=c.weight,
                    mean=float(mean[j]),
                    within_std=float(within[j]),
                    zero_std_frac=float(zfrac[j]),
                    share=float(shares[j]),
                    at_max=float(at_max[j]),
                    at_min=float(at_min[j]),
                    lo=lo,
                    hi=hi,
                    range_declared=bool(self.declared[j]),
                    level=(float(mean[j]) - lo) / (hi - lo) if hi - lo > 1e-12 else math.nan,
                    corr_length=math.nan,
                    scored_frac=float(scored[j] / rows) if rows else math.nan,
                )
            )
        corr = np.full((k + 2, k + 2), np.nan)
        corr[:k, :k] = _corr_from_cov(cov)
        rg = float(t("r_groups"))
        return HealthReport(
            components=out,
            corr_labels=[*(c.name for c in self.components), "length", "reward"],
            corr=corr,
            n_rollouts=int(rows),
            n_groups=int(t("n_groups")),
            step_min=int(self.steps[i0]) if i1 > i0 else None,
            step_max=int(self.steps[i1 - 1]) if i1 > i0 else None,
            reward_zero_std_frac=float(t("r_zero")) / rg if rg else math.nan,
        )

    def series(self, max_points: int = 2000) -> dict[str, Any]:
        """Per-step health of every component (zero-std fraction, shares at max / min and of the
        advantage) and the aggregate zero-std fraction, as JSON; long runs thinned to about
        `max_points` steps."""
        s = self.steps.size
        idx = (
            np.arange(s)
            if s <= max_points
            else np.unique(np.linspace(0, s - 1, max_points).round().astype(int))
        )
        one = {name: (c[1:] - c[:-1])[idx] for name, c in self.cum.items()}  # each step's own sums
        w = np.array([c.weight for c in self.components], dtype=np.float64)
        cw = one["cov"] @ w  # (steps, K): the advantage_shares formula, every step at once
        total = cw @ w
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where((total > 1e-12)[:, None], w[None, :] * cw / total[:, None], np.nan)
            cols = {
                "zero_std_frac": one["zero"] / one["groups"],
                "at_max": one["at_max"] / one["scored"],
                "at_min": one["at_min"] / one["scored"],
                "share": share,
            }
            reward_zero = one["r_zero"] / one["r_groups"]
        f = lambda a: [_json_float(x) for x in a.tolist()]  # noqa: E731
        comp = {
            c.name: {key: f(v[:, j]) for key, v in cols.items()}
            for j, c in enumerate(self.components)
        }
        return {
            "steps": self.steps[idx].tolist(),
            "components": comp,
            "reward_zero_std_frac": f(reward_zero),
        }


def _by_step(sidx: np.ndarray, values: np.ndarray, s: int) -> np.ndarray:
    """Sum of the rows of `values` (n,) or (n, K) per step index: (s,) or (s, K)."""
    if values.ndim == 1:
        return np.bincount(sidx, weights=values.astype(np.float64), minlength=s)
    return (
        np.column_stack(
            [
                np.bincount(sidx, weights=values[:, j].astype(np.float64), minlength=s)
                for j in range(values.shape[1])
            ]
        )
        if values.shape[1]
        else np.zeros((s, 0))
    )


def _cum(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1, *x.shape[1:])), np.cumsum(x, axis=0)])


def step_table(data: RunArrays) -> StepTable:
    k = len(data.components)
    gidx, m = dense_ids(data.group_ids)
    uniq, sidx = np.unique(data.steps, return_inverse=True)
    s = int(uniq.size)
    cols = np.column_stack([data.matrix, data.rewards()]) if data.n else np.zeros((0, k + 1))
    st = stats.group_stats(cols, gidx, m)
    g_step = np.zeros(m, dtype=np.int64)
    g_step[gidx] = sidx.reshape(-1)  # every row of a group shares its step
    has = st.count > 0
    zero = st.zero_std & has
    finite_std = np.isfinite(st.std[:, :k])
    ranges = [_range(data.matrix[:, j], c) for j, c in enumerate(data.components)]
    lo, hi = np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges])
    vals = data.matrix
    scored = ~np.isnan(vals)
    with np.errstate(invalid="ignore"):
        const = (hi - lo) <= 1e-12
        tol = np.where(const, 0.0, 1e-6 * (hi - lo))
        # A constant undeclared range: above zero reads as at the ceiling, else the
        # floor (as _at_bounds).
        at_max = scored & np.where(const[None, :], vals > 0, vals >= (hi - tol)[None, :])
        at_min = scored & np.where(const[None, :], vals <= 0, vals <= (lo + tol)[None, :])
    dev = np.nan_to_num(np.where(scored, vals - st.mean[gidx, :k], 0.0), nan=0.0)
    cov = np.zeros((s, k, k))
    for a in range(k):
        for b in range(a, k):
            cov[:, a, b] = cov[:, b, a] = np.bincount(
                sidx, weights=dev[:, a] * dev[:, b], minlength=s
            )
    sizes = np.bincount(gidx, minlength=m)
    per_step = {
        "groups": _by_step(g_step, has[:, :k], s),
        "zero": _by_step(g_step, zero[:, :k], s),
        "std_sum": _by_step(g_step, np.where(finite_std, st.std[:, :k], 0.0), s),
        "std_n": _by_step(g_step, finite_std, s),
        "n_groups": np.bincount(g_step, minlength=s).astype(np.float64),
        "dof": _by_step(g_step, np.maximum(sizes - 1, 0), s),
        "rows": np.bincount(sidx, minlength=s).astype(np.float64),
        "scored": _by_step(sidx, scored, s),
        "sum": _by_step(sidx, np.where(scored, vals, 0.0), s),
        "at_max": _by_step(sidx, at_max, s),
        "at_min": _by_step(sidx, at_min, s),
        "cov": cov,
        "r_groups": _by_step(g_step, has[:, k], s),
        "r_zero": _by_step(g_step, zero[:, k], s),
    }
    return StepTable(
        components=list(data.components),
        steps=uniq,
        lo=lo,
        hi=hi,
        declared=np.array([r[2] for r in ranges], dtype=bool),
        cum={name: _cum(v) for name, v in per_step.items()},
    )


def _state_findings(
    h: HealthReport, t: Thresholds, stuck: frozenset[str] = frozenset()
) -> list[Finding]:
    """The detectors of a state (what the components are like over a range of steps), worst-specific
    first. `stuck`: components at their floor in every rollout of the whole window. When the task
    components are all stuck from the start, the policy never had a task signal to give up on: that
    is a scorer that never varies (detect_dead says so, verifier first), not valid-but-trivial or
    prompt-ignoring outputs."""
    sem_names = {c.name for c in h.components if c.kind in SEMANTIC_KINDS}
    task_stuck = bool(sem_names) and sem_names <= stuck
    trivial = detect_trivial_outputs(h, t) if not task_stuck else []
    findings = detect_unreachable(h, t) + detect_saturation(h, t) + trivial
    # A component already explained by a more specific finding is not repeated as "dead".
    explained = {f.component for f in findings if f.component}
    if trivial:
        explained |= {c.name for c in h.components if c.kind in SEMANTIC_KINDS}
    findings += detect_dead(h, t, skip=explained)
    if not trivial and not task_stuck:
        findings += detect_ignores_prompt(h, t)
    return findings


def _key(f: Finding) -> tuple[str, str | None]:
    return (f.code, f.component)


def _hold(table: StepTable, t: Thresholds) -> int:
    return max(
        1,
        min(table.steps.size, max(t.min_hold_steps, math.ceil(t.min_hold_frac * table.steps.size))),
    )


def _candidates(last: int, t: Thresholds) -> list[int]:
    """Start indices 0..last, every one when few, else an even grid (the refinement
    walks between them)."""
    if last + 1 <= t.max_onset_candidates:
        return list(range(last + 1))
    return np.unique(np.linspace(0, last, t.max_onset_candidates).round().astype(int)).tolist()


def _local_end(table: StepTable, i: int, t: Thresholds) -> int:
    """The end of the shortest span from step index i holding at least min_groups groups
    (or the end)."""
    n = table.cum["n_groups"]
    j = int(np.searchsorted(n, n[i] + t.min_groups, side="left"))
    return min(max(j, i + 1), table.steps.size)


def _refine(
    table: StepTable,
    t: Thresholds,
    holds: Callable[[int, int], bool],
    i: int,
    last: int,
    local: Callable[[int, int], bool] | None = None,
) -> int:
    """A pooled suffix can hold from a few steps before the change (the later steps outweigh them):
    move the onset forward while its own first steps are not in the state (`local`, default `holds`)
    and the suffix after them still is."""
    s, local = table.steps.size, local or holds
    for _ in range(
        1000
    ):  # bounded: a grid of candidates leaves at most a few hundred steps between two
        if i >= last or local(i, _local_end(table, i, t)) or not holds(i + 1, s):
            break
        i += 1
    return i


def state_onsets(
    table: StepTable, t: Thresholds, kinds: dict[str, str] | None = None
) -> list[Finding]:
    """Every state finding that holds from some step to the end of the window, each from its onset
    (the earliest start step from which it holds, pooled, over at least the hold length)."""
    s = table.steps.size
    if s == 0:
        return []
    last = s - _hold(table, t)
    stuck = frozenset(c.name for c in table.health(0, s, kinds).components if _never_left_floor(c))
    seen: dict[tuple[str, str | None], int] = {}
    for i in _candidates(last, t):
        for f in _state_findings(table.health(i, s, kinds), t, stuck):
            seen.setdefault(_key(f), i)
    out = []
    for key, first in seen.items():
        # Over a few steps, an almost-unreachable outcome is often not reached at all: then it reads
        # as "never varies" (dead), and those steps are in the state all the same.
        same = frozenset(
            {key, ("dead_component", key[1])} if key[0] == "unreachable_reward" else {key}
        )

        def holds(
            a: int, b: int, keys: frozenset[tuple[str, str | None]] = frozenset({key})
        ) -> bool:
            return any(
                _key(f) in keys for f in _state_findings(table.health(a, b, kinds), t, stuck)
            )

        i = _refine(table, t, holds, first, last, local=lambda a, b, keys=same: holds(a, b, keys))
        f = next(f for f in _state_findings(table.health(i, s, kinds), t, stuck) if _key(f) == key)
        f.onset_step = int(table.steps[i])
        out.append(f)
    return _exclusive(out, kinds or {c.name: c.kind for c in table.components})


def carry_onsets(
    findings: list[Finding],
    window: StepTable,
    longer: StepTable,
    t: Thresholds,
    kinds: dict[str, str] | None = None,
    history_complete: bool = True,
) -> list[Finding]:
    """A finding that holds from the window's first step may have begun before it: the window's edge
    is not an onset. Its onset is searched again over `longer` (the window and the steps before it)
    and the finding is taken from there, its numbers then describing steps onset..end (its title and
    detail say so). `history_complete`: `longer` starts at the run's first step; when it does not,
    an onset on its first step is flagged as "or earlier" (onset_known False)."""
    first = int(window.steps[0]) if window.steps.size else None
    clipped = {_key(f) for f in findings if f.onset_step is not None and f.onset_step == first}
    if not clipped:
        return findings
    earlier: dict[tuple[str, str | None], Finding] = {}
    if longer.steps.size > window.steps.size:
        earlier = {_key(f): f for f in state_onsets(longer, t, kinds) if _key(f) in clipped}
    read_from = int(longer.steps[0]) if longer.steps.size else first
    out = []
    for f in findings:
        g = earlier.get(_key(f)) if _key(f) in clipped else None
        if g is not None and g.onset_step is not None and g.onset_step <= (first or 0):
            f = g
        if f.onset_step == read_from and not history_complete:
            f.onset_known = False
        out.append(f)
    return out


def _exclusive(findings: list[Finding], kinds: dict[str, str]) -> list[Finding]:
    """Onsets are found per finding, so rules that exclude each other at one range are re-applied
    across ranges: trivial outputs explain the flat task components and the validity-vs-task
    warning; a component that is saturated or unreachable is not also reported as dead."""
    codes = {f.code for f in findings}
    specific = {f.component for f in findings if f.code in ("saturation", "unreachable_reward")}
    out = []
    for f in findings:
        if "trivial_outputs" in codes and (
            f.code == "ignores_prompt"
            or (f.code == "dead_component" and kinds.get(f.component or "") in SEMANTIC_KINDS)
        ):
            continue
        if f.code == "dead_component" and f.component in specific:
            continue
        out.append(f)
    return out


def detect_signal_collapse(table: StepTable, t: Thresholds) -> list[Finding]:
    """The fraction of groups whose aggregate reward is constant (no advantage at all) rises
    until most groups teach nothing. Needs a 'before': a window that starts collapsed is left to
    the component rules."""
    z, g, s = table.cum["r_zero"], table.cum["r_groups"], table.steps.size
    last = s - _hold(table, t)

    def state(
        a: int, b: int
    ) -> tuple[float, float]:  # (fraction of zero-std groups in steps a..b-1, groups)
        n = float(g[b] - g[a])
        return (float(z[b] - z[a]) / n if n else math.nan), n

    def holds(a: int, b: int = s) -> bool:
        after, n_after = state(a, b)
        before, n_before = state(0, a)
        return (
            n_after >= t.min_groups
            and n_before >= t.min_groups
            and after >= t.collapse_most
            and after - before >= t.collapse_rise
        )

    first = (
        next((i for i in _candidates(max(last, 0), t) if i >= 1 and holds(i)), None)
        if s > 1
        else None
    )
    if first is None:
        return []
    i = _refine(
        table,
        t,
        lambda a, b: state(a, b)[0] >= t.collapse_most and (b < s or holds(a)),
        first,
        last,
    )
    after, n_after = state(i, s)
    before, _ = state(0, i)
    step = int(table.steps[i])
    return [
        Finding(
            code="signal_collapse",
            severity="critical" if after >= t.collapse_critical else "warning",
            sort="reward",
            order="desc",
            onset_step=step,
            title=f"Signal collapse from step {step}: {_pct(after)} of groups have a constant "
            f"reward since (was {_pct(before)} before), so most of each batch teaches nothing.",
            detail=f"{int(round(after * n_after))} of {int(n_after)} groups over steps "
            f"{step}-{int(table.steps[-1])} have zero within-group std of the aggregate reward: "
            "every completion of their prompt scored the same.",
            fix="Add harder prompts (or a curriculum); filter out prompts whose groups are "
            "all-correct or all-wrong before the update, as dynamic sampling (DAPO) does; use a "
            "larger group (num_generations) so rare successes and failures appear; add partial "
            "credit so completions of one prompt differ.",
            evidence={"zero_std_after": after, "zero_std_before": before, "groups_after": n_after},
        )
    ]


def kinds_declared(components: list[ComponentInfo]) -> bool:
    """Kinds count as declared when any component says something other than
    the default ("outcome")."""
    return any(c.kind and c.kind != "outcome" for c in components)


def infer_kinds(
    data: RunArrays, h: HealthReport, t: Thresholds
) -> tuple[dict[str, str], dict[str, str]]:
    """Kinds read from the values when none were declared: (name -> kind, name ->
    what was inferred).

    Binary vs graded: at most two distinct values. Dense vs sparse: off its floor in at least half
    of the rollouts or not. Negative weight (or never positive): a penalty. High on its range (level
    >= validity_level): validity-like (behavioural); else task-like (outcome). At least one
    non-penalty component stays task-like: the heaviest, when every one of them is high."""
    kinds, notes = {}, {}
    for j, c in enumerate(h.components):
        col = data.matrix[:, j]
        finite = col[~np.isnan(col)]
        binary = bool(finite.size) and np.unique(finite).size <= 2
        dense = not (c.at_min > 0.5)
        never_positive = finite.size > 0 and float(finite.max()) <= 0 < -float(finite.min())
        if c.weight < 0 or never_positive:
            kind = "penalty"
        elif c.level >= t.validity_level:
            kind = "behavioural"
        else:
            kind = "outcome"
        kinds[c.name] = kind
        notes[c.name] = (
            f"{'binary' if binary else 'graded'}, {'dense' if dense else 'sparse'}"
            f"{', level ' + format(c.level, '.2f') if math.isfinite(c.level) else ''}"
        )
    rest = [c for c in h.components if kinds[c.name] != "penalty"]
    if rest and not any(kinds[c.name] == "outcome" for c in rest):
        heaviest = max(
            rest, key=lambda c: (abs(c.weight), -c.level if math.isfinite(c.level) else 0)
        )
        kinds[heaviest.name] = "outcome"
    role = {"penalty": "penalty", "behavioural": "validity-like", "outcome": "task-like"}
    return kinds, {n: f"{notes[n]} -> {role[kinds[n]]}" for n in kinds}


def _label_spans(findings: list[Finding], h: HealthReport) -> None:
    """Every number says which steps it describes: a finding's own (onset to the window's end),
    and beside it, for its component, the share of the advantage over the whole window (the
    health table's figure), so the two never read as a contradiction."""
    by_name = h.by_name()
    for f in findings:
        if f.onset_step is None or h.step_max is None:
            continue
        span = f"steps {f.onset_step}-{h.step_max}"
        if span not in f.detail:
            f.detail = f"Over {span}: {f.detail}"
        c = by_name.get(f.component or "")
        if c is not None and f.onset_step != h.step_min and math.isfinite(c.share):
            f.detail += (
                f" Over the whole window (steps {h.step_min}-{h.step_max}, as in the health "
                f"table) '{c.name}' has {100 * c.share:.1f}% of the advantage."
            )


def _note_inferred(findings: list[Finding], notes: dict[str, str]) -> None:
    text = "; ".join(f"'{n}' {v}" for n, v in notes.items())
    for f in findings:
        f.detail += f" No kinds were declared: inferred from the values ({text})."
        f.evidence["inferred_kinds"] = dict(notes)


def judge_note(table: StepTable, t: Thresholds) -> str | None:
    """Why the run cannot be judged yet, or None."""
    g = int(table.cum["r_groups"][-1]) if table.steps.size else 0
    if g < t.min_groups:
        return (
            f"not enough groups to judge: {g} group{'s' if g != 1 else ''} with a scored reward in "
            f"this window (at least {t.min_groups} needed)"
        )
    return None


@dataclass
class Diagnosis:
    health: HealthReport
    findings: list[Finding]
    collapse: dict[str, float]
    over_time: dict[str, Any] = field(
        default_factory=dict
    )  # StepTable.series(): per-step component health
    note: str | None = (
        None  # set when the window cannot be judged ("not enough groups to judge: ...")
    )
    inferred_kinds: dict[str, str] = field(
        default_factory=dict
    )  # name -> what was inferred, when undeclared

    @property
    def status(self) -> str:
        if self.note:
            return "not_enough_data"
        severities = {f.severity for f in self.findings}
        return (
            "critical"
            if "critical" in severities
            else "warning"
            if "warning" in severities
            else "healthy"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "note": self.note,
            "health": self.health.as_dict(),
            "findings": [f.as_dict() for f in self.findings],
            "over_time": self.over_time,
            "inferred_kinds": self.inferred_kinds,
            "collapse": {k: _json_float(v) for k, v in self.collapse.items()},
        }


def diagnose(
    data: RunArrays,
    *,
    window_from: int | None = None,
    history_complete: bool = True,
    aggregation: str = "sum_then_normalize",
    metrics: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    bad_case_ids: Callable[[], Iterable[int]] | None = None,
    annotated_ids: Callable[[], Iterable[int]] | None = None,
    thresholds: Thresholds = Thresholds(),
) -> Diagnosis:
    """Health of every component over the window (the steps of `data` from `window_from` on; all
    of them when None), per step and pooled, and the findings of every detector, worst first, each
    from the step where it starts to hold. Steps of `data` before the window are read only to date
    a finding that already holds at the window's first step (carry_onsets); `history_complete`
    says whether `data` starts at the run's first step."""
    t = thresholds
    longer = data
    if window_from is not None:
        data = data.select(data.steps >= window_from)
    h = component_health(data)
    table = step_table(data)
    kinds, notes = (None, {}) if kinds_declared(data.components) else infer_kinds(data, h, t)
    if kinds:
        h.components = [replace(c, kind=kinds[c.name]) for c in h.components]
    note = judge_note(table, t)
    findings: list[Finding] = []
    if note is None:
        findings = state_onsets(table, t, kinds)
        if table.steps.size and (longer.n > data.n or not history_complete):
            wider = step_table(longer) if longer.n > data.n else table
            findings = carry_onsets(findings, table, wider, t, kinds, history_complete)
        _label_spans(findings, h)
        if kinds:
            _note_inferred(findings, notes)
        findings += detect_signal_collapse(table, t)
        findings += detect_length_hacking(data, h, t)
    collapse = (
        aggregation_collapse(data) if aggregation == "sum_then_normalize" and note is None else {}
    )
    findings += detect_aggregation_collapse(collapse, t)
    findings += detect_unstable(metrics, t)
    if bad_case_ids is not None and data.rollout_ids is not None and note is None:
        findings += quality_gap(
            data.rollout_ids, data.rewards(), data.steps, bad_case_ids, annotated_ids, t
        )
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
    return Diagnosis(
        health=h,
        findings=findings,
        collapse=collapse,
        over_time=table.series(),
        note=note,
        inferred_kinds=notes,
    )

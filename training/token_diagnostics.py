"""Token-level findings over a run: sampler/trainer mismatch rising, entropy collapse, tool output
tokens in the loss. Pure numpy, no Django.

Inputs are per-step token statistics (`TokenSteps`) and per-rollout counts of tool-result tokens
(`ToolTokens`); the webapp reads both from stored statistics, a notebook builds them with
`step_stats` and `tool_tokens_in_loss`. Each rule and threshold: docs/tokens.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .diagnostics import (
    Finding,
    StepTable,
    Thresholds,
    _candidates,
    _hold,
    _local_end,
    _pct,
    _refine,
)

NEAR_ZERO_ENTROPY = 0.01  # nats: the policy all but certain of the token
RATIO_LOW, RATIO_HIGH = (
    0.5,
    2.0,
)  # importance ratios outside this band are what TRL/verl clip or mask
TOOL_ROLES = ("tool", "ipython", "function", "environment")  # messages the policy did not write


@dataclass(frozen=True)
class TokenThresholds:
    mismatch_level: float = 0.05  # mean |delta| (nats) from which a mismatch is worth a finding
    mismatch_rise: float = 2.0  # ... and at least this many times the mean |delta| before the onset
    mismatch_critical_outside: float = 0.05  # critical when this fraction of ratios is outside
    entropy_drop: float = 0.5  # entropy collapse: mean entropy since the onset <= this x before
    entropy_near_zero_rise: float = 0.25  # ... and the near-zero fraction up by at least this
    entropy_critical: float = 0.2  # critical when the mean entropy is <= this x before
    tool_leak_frac: float = 0.5  # rollouts with tool output that train on it, since the onset


DEFAULTS, TOKEN_DEFAULTS = Thresholds(), TokenThresholds()


@dataclass
class TokenSteps:
    """Per-step token statistics, steps ascending. `rollouts` counts the rollouts with tokens,
    `*_tokens` the tokens each mean is over (the weights when steps are pooled). NaN where a step
    has no such tokens."""

    steps: np.ndarray
    rollouts: np.ndarray
    mismatch_tokens: np.ndarray
    mean_abs_delta: np.ndarray
    k3: np.ndarray
    ratio_out_fraction: np.ndarray
    max_abs_delta: np.ndarray
    entropy_tokens: np.ndarray
    mean_entropy: np.ndarray
    low_entropy_fraction: np.ndarray
    tokens: np.ndarray
    mask_tokens: np.ndarray
    masked_fraction: np.ndarray

    FIELDS = (
        "rollouts",
        "mismatch_tokens",
        "mean_abs_delta",
        "k3",
        "ratio_out_fraction",
        "max_abs_delta",
        "entropy_tokens",
        "mean_entropy",
        "low_entropy_fraction",
        "tokens",
        "mask_tokens",
        "masked_fraction",
    )

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> TokenSteps:
        """From dicts keyed "step" and FIELDS (a missing or None value reads as NaN, a missing
        count as 0); the rows are sorted by step."""
        rows = sorted(rows, key=lambda r: r["step"])
        counts = {"rollouts", "mismatch_tokens", "entropy_tokens", "tokens", "mask_tokens"}

        def col(name: str) -> np.ndarray:
            default = 0.0 if name in counts else math.nan
            values = [r.get(name) for r in rows]
            return np.array([default if v is None else v for v in values], dtype=np.float64)

        return cls(
            steps=np.array([r["step"] for r in rows], dtype=np.int64),
            **{name: col(name) for name in cls.FIELDS},
        )

    @property
    def size(self) -> int:
        return int(self.steps.size)

    def pooled(self, name: str, weights: str, a: int, b: int) -> tuple[float, float]:
        """(the weighted mean of `name` over steps[a:b], the total weight)."""
        v, w = getattr(self, name)[a:b], getattr(self, weights)[a:b]
        ok = np.isfinite(v) & (w > 0)
        total = float(w[ok].sum())
        return (float((v[ok] * w[ok]).sum()) / total if total else math.nan), total

    def table(self) -> StepTable:
        """The shape the onset helpers of training/diagnostics.py walk: steps and the prefix sums
        of the rollouts counted (their `min_groups` span is a span of rollouts here)."""
        cum = np.concatenate([[0.0], np.cumsum(self.rollouts)])
        empty = np.zeros(0)
        return StepTable([], self.steps, empty, empty, empty.astype(bool), {"n_groups": cum})

    def series(self) -> dict[str, list[float | None]]:
        """JSON lists (None for NaN), steps first."""
        out: dict[str, list[Any]] = {"steps": self.steps.tolist()}
        for name in self.FIELDS:
            out[name] = [None if not math.isfinite(x) else x for x in getattr(self, name).tolist()]
        return out


# ------------------------------------------------------------------------------ statistics


def rollout_sums(
    sampler: np.ndarray | None,
    trainer: np.ndarray | None,
    entropy: np.ndarray | None,
    loss_mask: np.ndarray | None,
    n: int,
) -> dict[str, float]:
    """Sufficient sums of one rollout's n tokens (absent arrays: None). Steps pool these sums."""
    mask = np.ones(n, dtype=bool) if loss_mask is None else np.asarray(loss_mask) > 0
    out = {"tokens": float(n), "rollouts": 1.0}
    if loss_mask is not None:
        out |= {"mask_tokens": float(n), "masked": float(n - int(mask.sum()))}
    if sampler is not None and trainer is not None:
        d = np.asarray(trainer, dtype=np.float64) - np.asarray(sampler, dtype=np.float64)
        d = d[mask & np.isfinite(d)]
        out |= {
            "mismatch_tokens": float(d.size),
            "sum_abs_delta": float(np.abs(d).sum()),
            "sum_k3": float((np.expm1(d) - d).sum()),
            "outside": float(((d < math.log(RATIO_LOW)) | (d > math.log(RATIO_HIGH))).sum()),
            "max_abs_delta": float(np.abs(d).max()) if d.size else math.nan,
        }
    if entropy is not None:
        e = np.asarray(entropy, dtype=np.float64)
        e = e[mask & np.isfinite(e)]
        out |= {
            "entropy_tokens": float(e.size),
            "sum_entropy": float(e.sum()),
            "near_zero": float((e < NEAR_ZERO_ENTROPY).sum()),
        }
    return out


def step_stats(sums_by_step: Mapping[int, Sequence[Mapping[str, float]]]) -> TokenSteps:
    """Per-step statistics from each rollout's `rollout_sums`."""
    rows = []
    for step, sums in sums_by_step.items():

        def total(key: str, sums: Sequence[Mapping[str, float]] = sums) -> float:
            return float(sum(s.get(key, 0.0) for s in sums))

        nm, ne, nk = total("mismatch_tokens"), total("entropy_tokens"), total("mask_tokens")
        maxes = [
            s["max_abs_delta"] for s in sums if math.isfinite(s.get("max_abs_delta", math.nan))
        ]
        rows.append(
            {
                "step": step,
                "rollouts": total("rollouts"),
                "mismatch_tokens": nm,
                "mean_abs_delta": total("sum_abs_delta") / nm if nm else None,
                "k3": total("sum_k3") / nm if nm else None,
                "ratio_out_fraction": total("outside") / nm if nm else None,
                "max_abs_delta": max(maxes) if maxes else None,
                "entropy_tokens": ne,
                "mean_entropy": total("sum_entropy") / ne if ne else None,
                "low_entropy_fraction": total("near_zero") / ne if ne else None,
                "tokens": total("tokens"),
                "mask_tokens": nk,
                "masked_fraction": total("masked") / nk if nk else None,
            }
        )
    return TokenSteps.from_rows(rows)


def tool_tokens_in_loss(
    turns: np.ndarray | None,
    loss_mask: np.ndarray | None,
    roles: Sequence[str],
    offsets: np.ndarray | None = None,
    spans: Sequence[tuple[int, int]] | None = None,
) -> tuple[int, int]:
    """(tool-result tokens, of which in the loss) of one rollout. A token belongs to message
    `turns[i]` (an index into `roles`), or, without turns, to the message whose character span
    (`spans`, one per role) holds its offset. A token of a tool message with loss_mask 1 is tool
    output the policy is trained to predict. Without a mask every token is in the loss."""
    index = _message_index(turns, offsets, spans)
    if index is None:
        return 0, 0
    is_tool = np.array([r in TOOL_ROLES for r in roles] + [False], dtype=bool)
    tool = is_tool[np.where((index >= 0) & (index < len(roles)), index, len(roles))]
    mask = np.ones(index.size, dtype=bool) if loss_mask is None else np.asarray(loss_mask) > 0
    return int(tool.sum()), int((tool & mask).sum())


def _message_index(
    turns: np.ndarray | None,
    offsets: np.ndarray | None,
    spans: Sequence[tuple[int, int]] | None,
) -> np.ndarray | None:
    if turns is not None:
        return np.asarray(turns, dtype=np.int64)
    if offsets is None or not spans:
        return None
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    off = np.asarray(offsets, dtype=np.int64)
    idx = np.searchsorted(starts, off, side="right") - 1
    inside = (idx >= 0) & (off < ends[np.clip(idx, 0, len(ends) - 1)])
    return np.where(inside, idx, -1)


@dataclass
class ToolTokens:
    """Per rollout with tool-result tokens: its id, step, and how many of those tokens are in the
    loss (rollouts without tool output are left out)."""

    rollout_ids: np.ndarray
    steps: np.ndarray
    tool_tokens: np.ndarray | None  # None when only the count in the loss is known
    in_loss: np.ndarray
    examples: list[int] = field(default_factory=list)  # filled by detect_tool_tokens_in_loss


def _share(x: float) -> str:
    """A fraction as a percentage; under 1% with two decimals (a 0.4% of ratios out of band is not
    "0%")."""
    if math.isfinite(x) and 0 < x < 0.01:
        return f"{100 * x:.2f}%"
    return _pct(x)


# ------------------------------------------------------------------------------ onsets


def _rise_onset(
    ts: TokenSteps,
    t: Thresholds,
    holds: Callable[[int], bool],
    local: Callable[[int, int], bool],
) -> int | None:
    """The onset index of a change that needs a 'before' (as detect_signal_collapse): the first
    candidate start i >= 1 from which `holds(i)`, refined forward with `local`."""
    table, s = ts.table(), ts.size
    if s < 2:
        return None
    last = s - _hold(table, t)
    first = next((i for i in _candidates(max(last, 0), t) if i >= 1 and holds(i)), None)
    if first is None:
        return None
    i = _refine(table, t, lambda a, b: local(a, b) and (b < s or holds(a)), first, last)
    # The refinement stops at the last start the hold length allows; a change newer than that is
    # pooled with unchanged steps and may hold only on the strength of its size: not reported yet.
    return i if local(i, _local_end(table, i, t)) else None


def _enough(ts: TokenSteps, t: Thresholds, a: int, b: int) -> bool:
    return float(ts.rollouts[a:b].sum()) >= t.min_groups


def detect_mismatch(
    ts: TokenSteps, t: Thresholds = DEFAULTS, tt: TokenThresholds = TOKEN_DEFAULTS
) -> list[Finding]:
    """Sampler/trainer mismatch rising: since the onset the mean |delta| is at least
    `mismatch_level` and `mismatch_rise` times what it was before."""
    s = ts.size
    mad = lambda a, b: ts.pooled("mean_abs_delta", "mismatch_tokens", a, b)[0]  # noqa: E731

    def holds(a: int, b: int | None = None) -> bool:
        b = s if b is None else b
        after, before = mad(a, b), mad(0, a)
        return (
            _enough(ts, t, a, b)
            and _enough(ts, t, 0, a)
            and after >= tt.mismatch_level
            and after >= tt.mismatch_rise * before
        )

    i = _rise_onset(ts, t, holds, lambda a, b: mad(a, b) >= tt.mismatch_level)
    if i is None:
        return []
    after, before = mad(i, s), mad(0, i)
    k3_after, _ = ts.pooled("k3", "mismatch_tokens", i, s)
    k3_before, _ = ts.pooled("k3", "mismatch_tokens", 0, i)
    out_after, n_tokens = ts.pooled("ratio_out_fraction", "mismatch_tokens", i, s)
    out_before, _ = ts.pooled("ratio_out_fraction", "mismatch_tokens", 0, i)
    worst = (
        float(np.nanmax(ts.max_abs_delta[i:]))
        if np.isfinite(ts.max_abs_delta[i:]).any()
        else math.nan
    )
    step = int(ts.steps[i])
    critical = out_after >= tt.mismatch_critical_outside
    return [
        Finding(
            code="token_mismatch",
            severity="critical" if critical else "warning",
            sort="tokens.mismatch",  # the explorer sorts rollouts by their token summaries
            order="desc",
            onset_step=step,
            title=f"Sampler/trainer mismatch rising since step {step}: the trainer's log-probs of "
            f"the sampled tokens differ from the sampler's by {after:.3g} nats on average (was "
            f"{before:.3g} before), so the update is off-policy.",
            detail=f"over steps {step}-{int(ts.steps[-1])}, {int(n_tokens)} tokens: mean |delta| "
            f"{after:.3g} (before {before:.3g}), k3 KL {k3_after:.3g} (before {k3_before:.3g}), "
            f"importance ratio outside [0.5, 2] for {_share(out_after)} of tokens (before "
            f"{_share(out_before)}), max |delta| {worst:.3g}.",
            fix="Check what changed at that step in the sampler: its weights sync (a vLLM server "
            "that stopped receiving updates), dtype (bf16 vs fp32 logits), sampling settings the "
            "trainer does not apply (temperature, top-p/top-k), or a tokenizer/chat-template "
            "difference. Correct the update with truncated importance sampling (TRL's "
            "vllm_importance_sampling_correction) or mask tokens whose ratio is out of band.",
            evidence={
                "mean_abs_delta_after": after,
                "mean_abs_delta_before": before,
                "k3_after": k3_after,
                "ratio_out_fraction_after": out_after,
                "max_abs_delta": worst,
            },
        )
    ]


def detect_entropy_collapse(
    ts: TokenSteps, t: Thresholds = DEFAULTS, tt: TokenThresholds = TOKEN_DEFAULTS
) -> list[Finding]:
    """Entropy collapse: since the onset the mean per-token entropy is at most `entropy_drop`
    times what it was before, and (where the near-zero fraction is known) that fraction rose by
    `entropy_near_zero_rise`."""
    s = ts.size
    ent = lambda a, b: ts.pooled("mean_entropy", "entropy_tokens", a, b)[0]  # noqa: E731
    nz = lambda a, b: ts.pooled("low_entropy_fraction", "entropy_tokens", a, b)[0]  # noqa: E731

    def collapsed(after: float, before: float, nz_after: float, nz_before: float) -> bool:
        rose = not (math.isfinite(nz_after) and math.isfinite(nz_before)) or (
            nz_after - nz_before >= tt.entropy_near_zero_rise
        )
        return before > 0 and after <= tt.entropy_drop * before and rose

    def holds(a: int, b: int | None = None) -> bool:
        b = s if b is None else b
        return (
            _enough(ts, t, a, b)
            and _enough(ts, t, 0, a)
            and collapsed(ent(a, b), ent(0, a), nz(a, b), nz(0, a))
        )

    def local(a: int, b: int) -> bool:
        return ent(a, b) <= tt.entropy_drop * ent(0, a)

    i = _rise_onset(ts, t, holds, local)
    if i is None:
        return []
    after, before, nz_after, nz_before = ent(i, s), ent(0, i), nz(i, s), nz(0, i)
    step = int(ts.steps[i])
    near = (
        f"; tokens with entropy under {NEAR_ZERO_ENTROPY:g} nats: {_pct(nz_after)} (before "
        f"{_pct(nz_before)})"
        if math.isfinite(nz_after)
        else ""
    )
    return [
        Finding(
            code="entropy_collapse",
            severity="critical" if after <= tt.entropy_critical * before else "warning",
            sort="tokens.mean_entropy",
            order="asc",
            onset_step=step,
            title=f"Entropy collapse since step {step}: the policy's mean per-token entropy fell "
            f"to {after:.3g} nats (was {before:.3g} before); it stops exploring, and groups of "
            "near-identical completions teach nothing.",
            detail=f"over steps {step}-{int(ts.steps[-1])}: mean entropy {after:.3g} vs "
            f"{before:.3g} over steps {int(ts.steps[0])}-{int(ts.steps[i - 1])}{near}.",
            fix="Raise the sampling temperature, lower the learning rate, add an entropy bonus or "
            "clip-higher (DAPO's asymmetric clip), and check the reward for a shortcut every "
            "completion converged on (read the lowest-entropy transcripts).",
            evidence={
                "entropy_after": after,
                "entropy_before": before,
                "near_zero_after": nz_after,
                "near_zero_before": nz_before,
            },
        )
    ]


def detect_tool_tokens_in_loss(
    tools: ToolTokens, t: Thresholds = DEFAULTS, tt: TokenThresholds = TOKEN_DEFAULTS
) -> list[Finding]:
    """Tool output tokens in the loss: rollouts whose tool-result tokens have loss_mask 1, from the
    first step since which at least `tool_leak_frac` of the rollouts with tool output leak (a state:
    no 'before' needed, as state_onsets)."""
    if tools.steps.size == 0:
        return []
    uniq, sidx = np.unique(tools.steps, return_inverse=True)
    leak = tools.in_loss > 0
    ts = TokenSteps.from_rows(
        {"step": int(step), "rollouts": float((sidx == k).sum())} for k, step in enumerate(uniq)
    )
    per_step = np.bincount(sidx, weights=leak.astype(float), minlength=uniq.size)
    cum_leak, cum_n = (
        np.concatenate([[0], np.cumsum(per_step)]),
        np.concatenate([[0], np.cumsum(ts.rollouts)]),
    )

    def frac(a: int, b: int) -> float:
        n = cum_n[b] - cum_n[a]
        return float(cum_leak[b] - cum_leak[a]) / n if n else math.nan

    s = ts.size
    table = ts.table()
    last = max(s - _hold(table, t), 0)
    if not leak.any():
        return []
    first = next((i for i in _candidates(last, t) if frac(i, s) >= tt.tool_leak_frac), None)
    if first is None:
        return []
    i = _refine(table, t, lambda a, b: frac(a, b) >= tt.tool_leak_frac, first, last)
    step = int(uniq[i])
    since = tools.steps >= step
    n_leak, n_tool = int(leak[since].sum()), int(since.sum())
    tokens_in = int(tools.in_loss[since].sum())
    tokens_all = None if tools.tool_tokens is None else int(tools.tool_tokens[since].sum())
    of = f" of {tokens_all}" if tokens_all is not None else ""
    tools.examples = tools.rollout_ids[since & leak][:8].tolist()
    return [
        Finding(
            code="tool_tokens_in_loss",
            severity="critical",
            sort="tokens.tool_unmasked",
            order="desc",
            onset_step=step,
            title=f"Tool output tokens in the loss since step {step}: {n_leak} of {n_tool} "
            f"rollouts with tool results train on them ({tokens_in}{of} tool-result tokens have "
            "loss_mask 1), so the policy learns to predict the environment's text.",
            detail=f"rollouts {', '.join(map(str, tools.examples))} among them; "
            f"{_pct(n_leak / n_tool if n_tool else math.nan)} of rollouts with tool output leak.",
            fix="Mask every token the policy did not generate (tool results, environment and user "
            "turns) out of the loss: check the collator or the trainer's completion mask for "
            "multi-turn rollouts (TRL's tool_mask, verifiers' completion_mask), then re-record.",
            evidence={
                "rollouts_leaking": n_leak,
                "rollouts_with_tools": n_tool,
                "tokens_in_loss": tokens_in,
                "tool_tokens": tokens_all,
                "example_rollouts": list(tools.examples),
            },
        )
    ]


def diagnose_tokens(
    ts: TokenSteps,
    tools: ToolTokens | None = None,
    thresholds: Thresholds = DEFAULTS,
    token_thresholds: TokenThresholds = TOKEN_DEFAULTS,
) -> list[Finding]:
    """Every token finding over the window, each from its onset step."""
    out = detect_mismatch(ts, thresholds, token_thresholds)
    out += detect_entropy_collapse(ts, thresholds, token_thresholds)
    if tools is not None:
        out += detect_tool_tokens_in_loss(tools, thresholds, token_thresholds)
    return out

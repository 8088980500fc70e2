"""The statistics stored with a batch of groups: rewards, advantages, per-group and per-step sums.

One typed result (`BatchStats`) computed once per batch from arrays, whoever supplies them: the
ingestion service from a validated batch, `recompute_run_stats` from a run's stored scores. The math
itself lives in training/stats.py (TRL's formulas, numpy-vectorised); this module only applies the
run's settings and what the trainer sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from training import stats
from webapp.rollouts.models import RewardComponent
from webapp.rollouts.validation import GroupIn
from webapp.runs.models import Run

# Per-batch sums past this could overflow float8 when Postgres adds them up in StepStat.
HUGE = 1e150


@dataclass(frozen=True)
class BatchStats:
    """Rows are the batch's rollouts in order (N), groups the batch's groups in order (M), columns
    the run's components in order (K). NaN means unknown (not scored, unscorable, or overflowed)."""

    matrix: np.ndarray  # (N, K) component values
    reward: np.ndarray  # (N,) aggregate reward: the trainer's when sent, else TRL's weighted sum
    advantage: np.ndarray  # (N,) the trainer's when sent, else TRL's
    group_of: np.ndarray  # (N,) index of each rollout's group, 0..M-1
    group_steps: np.ndarray  # (M,) each group's step
    agg: stats.GroupStats  # (M,) of the aggregate reward
    comp: stats.GroupStats  # (M, K) of each component

    @property
    def group_zero_std(self) -> np.ndarray:
        """(M,) Group.zero_std: the aggregate reward is constant within the group,
        or never scored."""
        return (self.agg.count == 0) | stored_zero_std(self.agg.std)


def stored_zero_std(std: np.ndarray) -> np.ndarray:
    """The stored zero_std flags (Group, GroupComponentStat): no finite std above the tolerance. An
    infinite std (values near the float limit) is stored as NULL, so it counts as zero here."""
    return ~(np.isfinite(std) & (std > stats.ZERO_STD_ATOL))


class StepStatRow(NamedTuple):
    """One batch's contribution to one StepStat row (the columns are its model fields)."""

    step: int
    component_id: int  # 0: the aggregate reward
    n_groups: int
    n_zero_std: int
    n_group_std: int
    sum_group_std: float | None  # None: overflowed, so the step shows as missing
    n_rollouts: int
    n_values: int
    sum_values: float | None
    sum_squares: float | None


STEP_STAT_COLUMNS = StepStatRow._fields[2:]


def run_weights(run: Run, components: list[RewardComponent]) -> np.ndarray:
    """The run's weights in `components` order (Run.reward_weights: its reward settings - the
    trainer's, or what it was launched with - then the environment's defaults)."""
    weights = run.reward_weights(components)
    return np.array([weights[c.name] for c in components], dtype=np.float64)


def compute(
    run: Run,
    comps: list[RewardComponent],
    matrix: np.ndarray,
    group_of: np.ndarray,
    group_steps: np.ndarray,
    sent_reward: np.ndarray,
    sent_advantage: np.ndarray,
    reward_missing: np.ndarray | None = None,
) -> BatchStats:
    """Rewards and advantages with the run's settings (TRL's formula; "batch" means one step), where
    the trainer did not send them (`sent_*`: NaN), and the group statistics. `reward_missing` (N,)
    marks rewards the trainer sent as null: they stay unknown, and advantages computed here treat
    them as TRL treats an unscorable completion."""
    settings = run.advantage_settings()
    kwargs = {
        "scale_rewards": settings["scale_rewards"],
        "batch_ids": group_steps[group_of],
        "eps": settings["advantage_epsilon"],
    }
    result = stats.compute_advantages(
        matrix, run_weights(run, comps), group_of, aggregation=settings["aggregation"], **kwargs
    )
    reward = np.where(np.isnan(sent_reward), result.rewards, sent_reward)
    computed_advantage = result.advantages
    if reward_missing is not None and reward_missing.any():
        reward = np.where(reward_missing, np.nan, reward)
        if settings["aggregation"] == "sum_then_normalize":  # the advantage of the reward kept
            computed_advantage = stats.compute_advantages(
                reward[:, None], [1.0], group_of, **kwargs
            ).advantages
    advantage = np.where(np.isnan(sent_advantage), computed_advantage, sent_advantage)
    # Sums of huge finite values can overflow float64: store "unknown" (NULL), never an infinity
    # that no JSON response can carry.
    reward = np.where(np.isfinite(reward), reward, np.nan)
    advantage = np.where(np.isfinite(advantage), advantage, np.nan)
    m = len(group_steps)
    return BatchStats(
        matrix=matrix,
        reward=reward,
        advantage=advantage,
        group_of=group_of,
        group_steps=group_steps,
        agg=stats.group_stats(reward, group_of, m),
        comp=stats.group_stats(matrix, group_of, m),
    )


def of_batch(run: Run, groups: list[GroupIn], comps: list[RewardComponent]) -> BatchStats:
    """The statistics of a validated batch, components in `comps` order."""
    rollouts = [r for g in groups for r in g.rollouts]
    col = {c.name: j for j, c in enumerate(comps)}
    matrix = np.full((len(rollouts), len(comps)), np.nan)
    for i, r in enumerate(rollouts):
        for name, (value, _) in r.rewards.items():
            matrix[i, col[name]] = value
    sizes = [len(g.rollouts) for g in groups]
    nan = np.nan
    return compute(
        run,
        comps,
        matrix,
        group_of=np.repeat(np.arange(len(groups)), sizes),
        group_steps=np.array([g.step for g in groups], dtype=np.int64),
        sent_reward=np.array([nan if r.reward is None else r.reward for r in rollouts]),
        sent_advantage=np.array([nan if r.advantage is None else r.advantage for r in rollouts]),
        reward_missing=np.array([r.reward_missing for r in rollouts], dtype=bool),
    )


def _column_sums(
    gmask: np.ndarray,
    rmask: np.ndarray,
    values: np.ndarray,
    count: np.ndarray,
    std: np.ndarray,
    zero: np.ndarray,
    all_groups: bool,
) -> tuple:
    """STEP_STAT_COLUMNS of one column at one step (`gmask` its groups, `rmask` its rollouts)."""
    has = np.ones(int(gmask.sum()), dtype=bool) if all_groups else count[gmask] > 0
    stdv = std[gmask]
    defined = ~np.isnan(stdv)
    vals = values[rmask]
    vals = vals[~np.isnan(vals)]
    with np.errstate(over="ignore", invalid="ignore"):
        total, squares = float(vals.sum()), float((vals * vals).sum())
        std_sum = float(stdv[defined].sum())
    # Postgres raises on a float8 sum that overflows. NULL instead: NULL + x stays NULL in SQL (both
    # databases; SQLite would turn a NaN into NULL anyway), and the dashboard shows the step as
    # missing. Statistics of values this large are meaningless.
    std_sum: float | None = std_sum if abs(std_sum) < HUGE else None
    if not (abs(total) < HUGE and squares < HUGE):
        total = squares = None
    return (
        int(has.sum()),
        int((zero[gmask] & has).sum()),
        int(defined.sum()),
        std_sum,
        int(rmask.sum()),
        int(vals.size),
        total,
        squares,
    )


def step_stat_rows(s: BatchStats, comps: list[RewardComponent]) -> list[StepStatRow]:
    """One row per step of the batch and column (the aggregate reward, then each component): a loop
    over steps x columns, never over rollouts."""
    rollout_steps = s.group_steps[s.group_of]
    # The aggregate's zero-std groups as StepStat has always counted them: no signal, or nothing
    # scored (an infinite std counts as signal here; Group.zero_std counts it as zero).
    reward_zero = s.agg.zero_std | (s.agg.count == 0)
    comp_zero = s.comp.zero_std
    rows = []
    for step in np.unique(s.group_steps).tolist():
        gmask, rmask = s.group_steps == step, rollout_steps == step
        agg = _column_sums(gmask, rmask, s.reward, s.agg.count, s.agg.std, reward_zero, True)
        rows.append(StepStatRow(step, 0, *agg))
        for j, comp in enumerate(comps):
            count, std = s.comp.count[:, j], s.comp.std[:, j]
            col = _column_sums(gmask, rmask, s.matrix[:, j], count, std, comp_zero[:, j], False)
            rows.append(StepStatRow(step, comp.id, *col))
    return rows

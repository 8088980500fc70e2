"""Detection and false-alarm rates of the diagnostics (training/diagnostics.py), on generated runs.

    python -m bench.diagnostics                  # 240 healthy runs, 30 of each planted failure
    python -m bench.diagnostics --runs 60 --seed 3

Healthy runs of varied shapes, and runs with a failure planted from a chosen onset, each with
declared kinds and without. Prints per failure the detection rate and onset error, and the
healthy runs with a critical or any finding. Pure numpy. The shapes: docs/diagnostics.md,
"Module notes".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/diagnostics.py` too
from bench.harness import with_load  # noqa: E402
from training import diagnostics as dg  # noqa: E402

C = dg.ComponentInfo
MAX_ROLLOUTS = 40_000  # per generated run: keeps the whole bench to about a minute on two cores
# Healthy start levels per kind (penalties: how often they fire): groups keep varying at these.
LEVELS = {
    "outcome": (0.25, 0.5),
    "process": (0.3, 0.6),
    "behavioural": (0.45, 0.7),
    "penalty": (0.05, 0.3),
}
SLIP = 0.005  # saturation and trivial outputs are planted with 1 rollout in 200 escaping them
RANGES = {
    "outcome": (0.0, 1.0),
    "process": (0.0, 1.0),
    "behavioural": (0.0, 1.0),
    "penalty": (-1.0, 0.0),
}


@dataclass
class Spec:
    """One component's generator: level(step) moves linearly from `start` to `end` over the run."""

    info: dg.ComponentInfo
    binary: bool
    start: float
    end: float
    # after the onset (step >= onset): "const" (value `after`), "level" (level becomes
    # `after`), or None
    mode: str | None = None
    after: float = 0.0
    slip: float = (
        0.0  # with "const": the share of rollouts that still get their ordinary draw (noise)
    )


@dataclass
class Shape:
    steps: int
    groups: int  # per step
    G: int


@dataclass
class Planted:
    name: str  # failure kind ("healthy" for none)
    data: dg.RunArrays
    expect: set[str]  # finding codes that count as detecting it
    component: str | None  # the finding must name it (None: any)
    onset: int | None  # the step it starts at (None: the whole run)


def random_shape(rng: np.random.Generator, min_steps: int = 10) -> Shape:
    steps = int(
        rng.choice([rng.integers(min_steps, 40), rng.integers(40, 150), rng.integers(150, 501)])
    )
    G = int(rng.choice([4, 6, 8, 12, 16]))
    groups = int(np.clip(rng.integers(2, 17), 1, max(1, MAX_ROLLOUTS // (steps * G))))
    return Shape(steps, groups, G)


def healthy_specs(rng: np.random.Generator, k: int, declared: bool) -> list[Spec]:
    """Component 0 is the outcome; the rest behavioural, process or penalty. Levels stay where
    groups keep varying: that is what healthy means here."""
    improving = rng.random() < 0.5
    # Distinct, unround weights: equal weights make distinct score vectors tie on purpose
    # (the plant below).
    weights = rng.permutation([0.13, 0.21, 0.34, 0.55, 0.77])
    out = []
    for j in range(k):
        kind = "outcome" if j == 0 else str(rng.choice(["behavioural", "process", "penalty"]))
        lo, hi = LEVELS[kind]
        start = float(rng.uniform(lo, hi))
        end = (
            min(start + float(rng.uniform(0.05, 0.25)), hi + 0.1)
            if improving and kind != "penalty"
            else start
        )
        weight = float(weights[j - 1]) if j else 1.0
        rng_range = RANGES[kind] if rng.random() < 0.6 else (None, None)
        info = C(f"c{j}_{kind}", weight, kind if declared else "", *rng_range)
        out.append(Spec(info, binary=bool(rng.random() < 0.5), start=start, end=end))
    return out


def generate(
    specs: list[Spec],
    shape: Shape,
    onset: int | None,
    rng: np.random.Generator,
    solved_after: float = 0.0,
    length_hack: bool = False,
) -> dg.RunArrays:
    """Rollouts step by step. Each prompt has a difficulty offset; a binary component succeeds with
    probability level + offset, a graded one scores level + offset + noise, on a grid of eighths
    (like a fraction of 8 tests). Penalties fire with probability `level` (-1, or a graded -U). From
    `onset` on, a spec's `mode` applies, and a `solved_after` fraction of groups score every
    component at its best."""
    s, m, g, k = shape.steps, shape.groups, shape.G, len(specs)
    mats, lens = [], []
    for step in range(s):
        frac = step / max(s - 1, 1)
        after = onset is not None and step >= onset
        vals = np.empty((m, g, k))
        offset = rng.uniform(-0.15, 0.15, (m, 1))
        for j, sp in enumerate(specs):
            level = sp.start + (sp.end - sp.start) * frac
            if after and sp.mode == "level":
                level = sp.after
            p = np.clip(level + offset, 0.0, 1.0)
            if sp.info.kind == "penalty" or sp.info.name.endswith("_penalty"):
                fire = rng.random((m, g)) < np.clip(level + offset / 3, 0.0, 1.0)
                size = 1.0 if sp.binary else np.round(rng.uniform(0.1, 1.0, (m, g)) * 8) / 8
                v = -fire.astype(float) * size
            elif sp.binary:
                v = (rng.random((m, g)) < p).astype(float)
            else:
                v = np.clip(np.round((p + rng.normal(0, 0.2, (m, g))) * 8) / 8, 0.0, 1.0)
            if after and sp.mode == "const":
                v = np.where(rng.random((m, g)) < sp.slip, v, sp.after)
            vals[:, :, j] = v
        if after and solved_after:
            solved = rng.random(m) < solved_after
            best = np.array([0.0 if sp.info.name.endswith("_penalty") else 1.0 for sp in specs])
            vals[solved] = best
        length = rng.integers(40, 400, (m, g)).astype(float)
        if (
            length_hack
        ):  # longer completions score higher inside each group, and get longer over the run
            r = vals @ np.array([sp.info.weight for sp in specs])
            length = (60 + 300 * frac) * (
                1.0 + (r - r.min()) / max(float(np.ptp(r)), 1e-9) + 0.1 * rng.random((m, g))
            )
        mats.append(vals.reshape(m * g, k))
        lens.append(length.reshape(-1))
    n = s * m * g
    steps = np.repeat(np.arange(s), m * g)
    group_ids = np.repeat(np.arange(s * m), g) + 1000
    return dg.RunArrays(
        components=[sp.info for sp in specs],
        matrix=np.vstack(mats),
        group_ids=group_ids,
        steps=steps,
        lengths=np.concatenate(lens),
        rollout_ids=np.arange(1, n + 1),
    )


def _behavioural(rng: np.random.Generator, declared: bool) -> Spec:
    return Spec(
        C("format", 0.6, "behavioural" if declared else "", 0.0, 1.0),
        bool(rng.random() < 0.5),
        float(rng.uniform(0.45, 0.65)),
        float(rng.uniform(0.5, 0.7)),
    )


def plant(kind: str, rng: np.random.Generator, declared: bool) -> Planted:
    """A healthy run with one failure from a random onset (10-60% into the run)."""
    shape = random_shape(rng, min_steps=20)
    specs = healthy_specs(rng, int(rng.integers(2, 6)), declared)
    onset = int(rng.uniform(0.1, 0.6) * shape.steps)
    out = specs[0].info.name
    if (
        kind == "dead"
    ):  # a verifier stops running: a process-kind check returns a fixed 0.5 from the onset
        specs.append(
            Spec(
                C("verifier", 0.8, "process" if declared else "", 0.0, 1.0),
                False,
                0.4,
                0.6,
                "const",
                0.5,
            )
        )
        return Planted(
            kind, generate(specs, shape, onset, rng), {"dead_component"}, "verifier", onset
        )
    if kind == "saturation":
        specs.insert(1, replace(_behavioural(rng, declared), mode="const", after=1.0, slip=SLIP))
        return Planted(kind, generate(specs, shape, onset, rng), {"saturation"}, "format", onset)
    if (
        kind == "unreachable"
    ):  # the outcome drops to (almost) never succeeding: only the easiest prompts, rarely
        specs[0] = replace(
            specs[0], binary=True, mode="level", after=-0.1
        )  # p = offset - 0.1: 0.6% succeed
        # Not one success after the onset (small runs) reads as "never varies", with "out of reach"
        # in its fix.
        return Planted(
            kind,
            generate(specs, shape, onset, rng),
            {"unreachable_reward", "dead_component"},
            out,
            onset,
        )
    if kind == "signal_collapse":
        return Planted(
            kind,
            generate(specs, shape, onset, rng, solved_after=0.9),
            {"signal_collapse"},
            None,
            onset,
        )
    if kind == "trivial_outputs":  # validity saturates, the task goes flat at zero
        specs = [
            replace(specs[0], mode="const", after=0.0, slip=SLIP),
            replace(_behavioural(rng, declared), mode="const", after=1.0, slip=SLIP),
        ]
        return Planted(kind, generate(specs, shape, onset, rng), {"trivial_outputs"}, None, onset)
    if kind == "length_hacking":
        return Planted(
            kind,
            generate(specs, shape, None, rng, length_hack=True),
            {"length_hacking"},
            None,
            None,
        )
    if (
        kind == "aggregation_collapse"
    ):  # two binary components with equal weights: [1, 0] and [0, 1] tie
        a = C(specs[0].info.name, 1.0, specs[0].info.kind, 0.0, 1.0)
        b = C("other", 1.0, "process" if declared else "", 0.0, 1.0)
        specs = [Spec(a, True, 0.5, 0.5), Spec(b, True, 0.5, 0.5)]
        return Planted(
            kind, generate(specs, shape, None, rng), {"aggregation_collapse"}, None, None
        )
    raise ValueError(f"unknown failure kind {kind!r}")


FAILURES = (
    "dead",
    "saturation",
    "unreachable",
    "signal_collapse",
    "trivial_outputs",
    "length_hacking",
    "aggregation_collapse",
)


def healthy(rng: np.random.Generator) -> Planted:
    shape = random_shape(rng)
    specs = healthy_specs(rng, int(rng.integers(1, 7)), declared=bool(rng.random() < 0.5))
    return Planted("healthy", generate(specs, shape, None, rng), set(), None, None)


def detected(p: Planted, d: dg.Diagnosis) -> dg.Finding | None:
    return next(
        (
            f
            for f in d.findings
            if f.code in p.expect and (p.component is None or f.component == p.component)
        ),
        None,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs", type=int, default=30, help="planted runs per failure kind and kind mode"
    )
    ap.add_argument("--healthy", type=int, default=240, help="healthy runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    whole_window = dg.Thresholds(
        max_onset_candidates=1
    )  # the rules before onsets: one range, the window
    print(
        f"{'failure':<22}{'kinds':<10}{'found':>8}{'onset error (steps) median / p90 / max':>42}"
        f"{'whole-window rules alone':>28}"
    )
    missed_any = False
    for kind in FAILURES:
        for declared in (True, False):
            found, errors, before = 0, [], 0
            for _ in range(args.runs):
                p = plant(kind, rng, declared)
                before += detected(p, dg.diagnose(p.data, thresholds=whole_window)) is not None
                f = detected(p, dg.diagnose(p.data))
                if f is not None:
                    found += 1
                    if p.onset is not None and f.onset_step is not None:
                        errors.append(abs(f.onset_step - p.onset))
            missed_any |= found < args.runs
            err = (
                f"{np.median(errors):.0f} / {np.percentile(errors, 90):.0f} / {max(errors)}"
                if errors
                else "n/a"
            )
            declared_s = "declared" if declared else "none"
            print(
                f"{kind:<22}{declared_s:<10}{found:>4}/{args.runs:<3}{err:>42}"
                f"{before:>24}/{args.runs}"
            )
    critical = warned = 0
    codes: dict[str, int] = {}
    for _ in range(args.healthy):
        d = dg.diagnose(healthy(rng).data)
        critical += any(f.severity == "critical" for f in d.findings)
        warned += bool(d.findings)
        for f in d.findings:
            codes[f.code] = codes.get(f.code, 0) + 1
    print(
        f"healthy runs: {critical}/{args.healthy} with a critical finding (false alarms), "
        f"{warned}/{args.healthy} with any finding {dict(sorted(codes.items()))}"
    )
    print(with_load(f"{time.perf_counter() - t0:.1f} s on {os.cpu_count()} CPUs"))
    return 1 if critical or missed_any else 0


if __name__ == "__main__":
    sys.exit(main())

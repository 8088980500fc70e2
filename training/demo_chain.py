"""The tiny-model demo chain: teacher -> SFT -> GRPO, with held-out evals before SFT, after SFT and
after GRPO, sized for two CPU cores in about three minutes.

The teacher has one planted habit (half its answers forget every connection); SFT learns it,
GRPO on semantic_coverage unlearns it, so each stage shows on the held-out reward. Why the sizes
and the habit were chosen: docs/using.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_NODES = 5  # small diagrams: 3-5 nodes (pipelines, state machines, org charts, architectures)
SEED = 0


@dataclass(frozen=True)
class Stage:
    """One job of the chain. `model_from` names the stage whose output is this job's model
    ("tiny": the environment's offline tiny model); `data_from` the stage whose summary["dataset"]
    is SFT's data."""

    name: str
    kind: str
    config: dict[str, Any]
    model_from: str | None = None
    data_from: str | None = None


def _eval_config(env: str, step: int) -> dict[str, Any]:
    return {
        "env": env,
        "seed": SEED,
        "max_nodes": MAX_NODES,
        # 40 held-out requests x 4 samples: the mean's noise ~0.015 (12 prompts: ~0.03)
        "num_prompts": 40,
        "num_generations": 4,
        "temperature": 0.5,  # the policy's typical answer, and what the GRPO stage samples at
        "max_completion_length": 144,  # the longest reference answer is ~120 tokens
        "batch_size": 12,
        "step": step,
    }


def demo_chain_stages(env: str = "diagram") -> list[Stage]:
    teacher = {
        "env": env,
        "seed": SEED,
        "max_nodes": MAX_NODES,
        "teacher": "scripted",
        "scripted_skill": 1.0,
        "scripted_faults": {"omit_edges": 0.5},  # a habit for GRPO to undo (module docstring)
        # A format filter, as teams often use for SFT data: keep every answer that parses and that
        # the canvas accepts, whatever its coverage.
        "min_reward": 0.0,
        "min_scores": {"json_valid": 1.0, "schema_valid": 1.0},
        # The scripted teacher is instant; many distinct requests teach copying, not recall
        "num_prompts": 1024,
    }
    sft = {
        "env": env,
        "seed": SEED,
        # The from-scratch tiny model learns only with every weight trainable
        "full_finetune": True,
        # measured with a perfect teacher, held-out coverage at 0.5: 0.198 after 200 steps,
        # 0.38-0.44 after 350, 0.73 after 700 (the 2-layer model learns to copy the requested names
        # late; before that it writes names it memorised). With the habit: 0.545 after 700 steps,
        # 0.70 on answers with connections.
        "max_steps": 700,
        "per_device_batch_size": 8,
        "learning_rate": 3e-3,
        "max_length": 256,  # prompt ~100 + answer <= ~120 tokens
        "num_train_epochs": 100.0,  # max_steps stops first
        "logging_steps": 10,
    }
    grpo = {
        "env": env,
        "seed": SEED,
        "max_nodes": MAX_NODES,
        "use_lora": False,
        # Measured from this SFT model (held-out coverage 0.545, 58% of answers without any
        # connection): 20 steps at lr 5e-5 -> 0.65 (two seeds), at 1e-4 -> 0.678, 30 steps at 1e-4
        # -> 0.680 (9% without connections), at 2e-4 -> 0.659 (schema_valid fell 0.92 -> 0.84: more
        # edges, more dangling ids).
        "max_steps": 30,
        "learning_rate": 1e-4,
        "num_prompts": 64,
        "num_generations": 8,
        "per_device_batch_size": 16,  # 2 prompts x 8 completions per step
        "max_completion_length": 144,
        # Measured: at 0.7-1.0 few samples earned coverage and held-out coverage fell
        "temperature": 0.5,
        "beta": 0.0,
        "logging_steps": 1,
    }
    return [
        Stage("teacher", "teacher", teacher),
        Stage("eval_before_sft", "eval", _eval_config(env, step=0), model_from="tiny"),
        Stage("sft", "sft", sft, model_from="tiny", data_from="teacher"),
        Stage("eval_after_sft", "eval", _eval_config(env, step=0), model_from="sft"),
        Stage("grpo", "grpo", grpo, model_from="sft"),
        Stage(
            "eval_after_grpo", "eval", _eval_config(env, step=grpo["max_steps"]), model_from="grpo"
        ),
    ]


def demo_chain_configs(env: str = "diagram") -> list[tuple[str, dict[str, Any]]]:
    """(kind, config) per job, in queue order: teacher, eval (before SFT, on the untrained tiny
    model), sft, eval (after SFT), grpo, eval (after GRPO). Stage names and model sources:
    `demo_chain_stages`."""
    return [(s.kind, dict(s.config)) for s in demo_chain_stages(env)]


# --------------------------------------------------------------------------------------------------
# In-process run


def _job(kind: str):
    from . import eval as eval_job
    from . import grpo, sft, teacher

    module = {"teacher": teacher, "sft": sft, "grpo": grpo, "eval": eval_job}[kind]
    config_cls = {
        "teacher": teacher.TeacherJobConfig,
        "sft": sft.SFTJobConfig,
        "grpo": grpo.GRPOJobConfig,
        "eval": eval_job.EvalJobConfig,
    }[kind]
    return config_cls, module.main


def run_chain(
    out: str | Path,
    env: str = "diagram",
    *,
    overrides: dict[str, dict[str, Any]] | None = None,
    log=print,
) -> list[dict[str, Any]]:
    """Run every stage in-process under `out`; returns one row per stage
    (name, seconds, summary)."""
    from .tiny import ensure_tiny_model

    out = Path(out)
    t0 = time.perf_counter()
    tiny = str(ensure_tiny_model(env, out / "tiny-cache"))
    rows: list[dict[str, Any]] = [
        {
            "name": "tiny_model",
            "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time(),
            "summary": {},
        }
    ]
    stages = demo_chain_stages(env)
    summaries: dict[str, dict[str, Any]] = {}
    for stage in stages:
        config = {
            **stage.config,
            **(overrides or {}).get(stage.name, {}),
            **(overrides or {}).get(stage.kind, {}),
            "output_dir": str(out / stage.name),
        }
        if stage.model_from == "tiny":
            config["base_model"] = tiny
        elif stage.model_from:
            config["base_model"] = summaries[stage.model_from][
                "output_dir"
            ]  # resolve_model_dir finds model/
        if stage.data_from:
            config["data"] = summaries[stage.data_from]["dataset"]
        config_cls, main = _job(stage.kind)
        log(f"== {stage.name} ({stage.kind})")
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = main(config_cls.from_dict(config))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        summaries[stage.name] = summary
        rows.append(
            {"name": stage.name, "seconds": seconds, "cpu_seconds": cpu, "summary": summary}
        )
        log(f"   {seconds:.0f}s wall, {cpu:.0f}s cpu  {_brief(summary)}")
    return rows


def _brief(summary: dict[str, Any]) -> str:
    keys = (
        "kept",
        "rejected",
        "reward_mean",
        "train_loss",
        "first_loss",
        "last_loss",
        "reward",
        "global_step",
    )
    return json.dumps({k: summary[k] for k in keys if k in summary}, default=str)


def format_table(rows: list[dict[str, Any]]) -> str:
    evals = [r for r in rows if r["summary"].get("kind") == "eval"]
    names = list(evals[0]["summary"]["component_means"]) if evals else []
    head = (
        f"| {'held-out (diagram, <=' + str(MAX_NODES) + ' nodes)':34s} | reward | "
        + " | ".join(names)
        + " |"
    )
    lines = [head, "|" + "---|" * (len(names) + 2)]
    label = {
        "eval_before_sft": "before SFT (random tiny model)",
        "eval_after_sft": "after SFT",
        "eval_after_grpo": "after GRPO",
    }
    for r in evals:
        means = r["summary"]["component_means"]
        cells = " | ".join("-" if means[n] is None else f"{means[n]:.3f}" for n in names)
        lines.append(
            f"| {label.get(r['name'], r['name']):34s} | {r['summary']['reward_mean']:.3f} | "
            f"{cells} |"
        )
    # CPU seconds (all threads) next to wall seconds: on a busy machine wall time mostly measures
    # the neighbours, CPU time / 2 is roughly the wall time on an idle 2-core machine.
    lines += ["", "| stage | wall s | cpu s |", "|---|---|---|"]
    chain = chain_cpu = 0.0
    for r in rows:
        queued = r["name"] != "tiny_model"
        if queued:
            chain, chain_cpu = chain + r["seconds"], chain_cpu + r["cpu_seconds"]
        name = r["name"] + ("" if queued else " (not queued by the app)")
        lines.append(f"| {name} | {r['seconds']:.0f} | {r['cpu_seconds']:.0f} |")
    lines.append(f"| **chain as queued** | **{chain:.0f}** | **{chain_cpu:.0f}** |")
    return "\n".join(lines)


def _parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """`stage_or_kind.field=json_value`, e.g. sft.max_steps=200 or eval.temperature=0.7."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, _, value = item.partition("=")
        target, _, field = key.partition(".")
        if not field or not value:
            raise SystemExit(f"--set {item!r}: expected STAGE.FIELD=VALUE")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(target, {})[field] = parsed
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", required=True, help="folder for every stage's output (and the tiny model cache)"
    )
    parser.add_argument(
        "--env", default="diagram", help="environment (the chain is tuned for diagram)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.FIELD=VALUE",
        help="override a config field for one stage name or kind (experiments)",
    )
    args = parser.parse_args(argv)
    rows = run_chain(args.out, args.env, overrides=_parse_overrides(args.set))
    table = format_table(rows)
    print(table)
    Path(args.out, "demo_chain.md").write_text(table + "\n")
    return rows


if __name__ == "__main__":
    main()

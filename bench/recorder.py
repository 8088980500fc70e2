"""Overhead of the RolloutRecorder on a GRPO step (target: ratio <= 1.05).

    HF_HUB_OFFLINE=1 python -m bench.recorder [--rounds 8 --steps 6]

GRPO on the tiny offline model, same seed and config, with and without the recorder, alternating
so load drift hits both sides. Prints wall and CPU time per step and the time spent inside the
recorder itself. How a step is timed and why: docs/performance.md, "Module notes".
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import load_line, ratio, report  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


RECORDER_SECONDS = [0.0]  # time spent inside the recorder's own code, summed over a run


def instrument_recorder() -> None:
    """Time the recorder's entry points (bench only): the part of the overhead that sits on
    the training thread."""
    from training.recorder import RolloutRecorder

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                RECORDER_SECONDS[0] += time.perf_counter() - t0

        return wrapper

    for name in ("on_step_end", "on_log", "_log_row_facts"):
        setattr(RolloutRecorder, name, timed(getattr(RolloutRecorder, name)))


def run_once(
    model_dir: str, steps: int, record: bool, workdir: str, completion_length: int
) -> dict[str, list[float]]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from training.common import chat_prompt, get_env, load_model, load_tokenizer
    from training.recorder import RolloutRecorder
    from training.rewards import environment_reward_funcs

    env = get_env("diagram")
    prompts = env.prompts("train", 64, seed=0)
    funcs, weights = environment_reward_funcs(env, prompts)
    dataset = Dataset.from_list([{"prompt": chat_prompt(p.text), "key": p.key} for p in prompts])
    marks: list[
        tuple[float, float, float]
    ] = []  # (wall, process CPU, recorder seconds) at each step start

    def mark() -> None:
        marks.append((time.perf_counter(), time.process_time(), RECORDER_SECONDS[0]))

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            mark()

        def on_train_end(self, args, state, control, **kwargs):
            mark()

    args = GRPOConfig(
        output_dir=os.path.join(workdir, "out"),
        max_steps=steps,
        num_generations=8,
        per_device_train_batch_size=16,
        max_completion_length=completion_length,
        learning_rate=1e-5,
        reward_weights=weights,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=load_model(model_dir),
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(model_dir),
        callbacks=[StepClock()],
    )
    trainer.remove_callback(PrinterCallback)  # printing every log dict is noise for both sides
    recorder = (
        RolloutRecorder.attach(
            trainer, jsonl=os.path.join(workdir, f"rollouts-{time.time_ns()}.jsonl")
        )
        if record
        else None
    )
    trainer.train()
    if recorder is not None:
        recorder.close()
    pairs = list(itertools.pairwise(marks[1:]))  # drop the warm-up step
    return {
        "wall": [b[0] - a[0] for a, b in pairs],
        "cpu": [b[1] - a[1] for a, b in pairs],
        "recorder": [b[2] - a[2] for a, b in pairs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # 3 pairs (15 steps a side) measured anywhere from 0.98 to 1.13 on a quiet machine, and a
    # control whose only difference was a thread came in at 1.13: step-to-step noise is ~10%. 8
    # pairs settle it.
    parser.add_argument("--rounds", type=int, default=8, help="off/on pairs")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per run")
    parser.add_argument("--completion-length", type=int, default=48, help="max_completion_length")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is steadier on a shared box)"
    )
    args = parser.parse_args()

    import torch

    from training.tiny import ensure_tiny_model

    torch.set_num_threads(args.threads)
    instrument_recorder()
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = str(ensure_tiny_model("diagram", os.path.join(workdir, "tiny")))
        runs: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
        for r in range(args.rounds):
            for record in (False, True) if r % 2 == 0 else (True, False):
                result = run_once(model_dir, args.steps, record, workdir, args.completion_length)
                for k, v in result.items():
                    runs[record].setdefault(k, []).extend(v)
                print(
                    f"round {r} recorder={'on ' if record else 'off'} "
                    f"wall {sum(result['wall']):.2f}s cpu {sum(result['cpu']):.2f}s",
                    flush=True,
                )
    off, on = runs[False], runs[True]
    print(f"steps per side: {len(off['wall'])}")
    for k in ("wall", "cpu"):
        report(
            f"{k:4s} per step: off {statistics.fmean(off[k]):.4f}s  on "
            f"{statistics.fmean(on[k]):.4f}s  ratio {ratio(sum(on[k]), sum(off[k]), 3)}  (median "
            f"ratio {ratio(statistics.median(on[k]), statistics.median(off[k]), 3)})"
        )
    inside = sum(on["recorder"]) / len(on["recorder"])
    print(
        f"inside the recorder: {inside * 1e3:.2f} ms per step = "
        f"{inside / statistics.fmean(on['wall']):.4%} of the step -> ratio bound "
        f"{1 + inside / statistics.fmean(off['wall']):.4f}"
    )
    print(load_line())


if __name__ == "__main__":
    main()

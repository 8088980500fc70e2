"""The job runners (sft, grpo, dpo, eval, probe, teacher) on the tiny offline model.

Arguments are shrunk for 2 CPU cores; each shrink says why. The tiny model is random, so these tests
check mechanics (loss logged, weights move, records well-formed), not that anything learns.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from training.sinks import MemorySink

COMPONENTS = {"json_valid", "schema_valid", "semantic_coverage", "layout_quality"}


def _weights(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


@pytest.fixture(scope="module")
def teacher_data(tmp_path_factory) -> Path:
    """A small SFT dataset from the scripted teacher (also the teacher job's happy path)."""
    from training.teacher import TeacherJobConfig, main

    out = tmp_path_factory.mktemp("teacher")
    summary = main(TeacherJobConfig(output_dir=str(out), num_prompts=8))
    assert summary["kept"] == 8 and summary["rejected"] == 0  # the reference solver is perfect
    return Path(summary["dataset"])


# --------------------------------------------------------------------------------------------------
# Configs


def test_it_rejects_bad_configs_naming_the_field(tmp_path):
    from training.config import JobConfig
    from training.grpo import GRPOJobConfig
    from training.sft import SFTJobConfig

    base = {"base_model": "m", "output_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="^max_steps:"):
        SFTJobConfig(**base, data="d.jsonl", max_steps=0)
    with pytest.raises(ValueError, match="^data:"):
        SFTJobConfig(**base)
    with pytest.raises(ValueError, match="^per_device_batch_size:"):
        GRPOJobConfig(**base, num_generations=4, per_device_batch_size=6)
    with pytest.raises(ValueError, match="^scale_rewards:"):
        GRPOJobConfig(**base, scale_rewards="global")
    with pytest.raises(ValueError, match="^base_model:"):
        GRPOJobConfig(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="^learning_rte:"):
        GRPOJobConfig.from_dict({**base, "learning_rte": 1e-5})
    assert all(GRPOJobConfig.field_help().values()), "every field has a help string"
    assert set(JobConfig.field_help()) <= set(GRPOJobConfig.field_help())


def test_it_round_trips_the_resolved_config(tmp_path):
    from training.sft import SFTJobConfig

    config = SFTJobConfig(
        base_model="m", output_dir=str(tmp_path), data="d.jsonl", full_finetune=True
    )
    assert config.use_lora is False  # full_finetune overrides use_lora
    path = config.save(tmp_path, kind="sft")
    saved = json.loads(path.read_text())
    assert path.name == "config.json" and saved["kind"] == "sft"
    saved.pop("kind")
    assert SFTJobConfig.from_dict(saved) == config


# --------------------------------------------------------------------------------------------------
# Training jobs


@pytest.mark.slow
def test_it_runs_sft_full_finetune_logging_loss_and_changing_weights(
    tiny_model, teacher_data, tmp_path
):
    from training.sft import SFTJobConfig, main

    sink = MemorySink()
    progress: list[tuple[int, int]] = []
    config = SFTJobConfig(
        base_model=tiny_model,
        output_dir=str(tmp_path / "sft"),
        data=str(teacher_data),
        full_finetune=True,  # the random tiny model can only learn with all weights trainable
        max_steps=4,  # a few steps: enough to log a loss and move the weights
        per_device_batch_size=4,  # half the 8 teacher examples per step
        learning_rate=1e-3,  # large, so 4 steps visibly change the weights
        max_length=384,  # the reference solutions are ~250 tokens; longer only costs time
    )
    summary = main(config, sink=sink, progress=lambda s, t: progress.append((s, t)))

    assert summary["global_step"] == 4 and summary["last_loss"] < summary["first_loss"]
    assert [m["step"] for m in sink.metrics if "loss" in m["values"]] == [1, 2, 3, 4]
    assert progress[-1] == (4, 4) and sink.progress_events[-1] == (4, 4)
    before, after = _weights(tiny_model), _weights(summary["model_dir"])
    changed = [k for k in before if not before[k].equal(after[k])]
    assert len(changed) > len(before) // 2
    assert json.loads((tmp_path / "sft" / "config.json").read_text())["kind"] == "sft"


@pytest.mark.slow
def test_it_chains_lora_sft_on_messages_into_grpo_with_every_component_recorded(
    tiny_model, teacher_data, tmp_path
):
    from training.common import read_jsonl, write_jsonl
    from training.grpo import GRPOJobConfig
    from training.grpo import main as grpo
    from training.sft import SFTJobConfig
    from training.sft import main as sft

    messages = tmp_path / "messages.jsonl"
    write_jsonl(
        messages, [{"messages": r["prompt"] + r["completion"]} for r in read_jsonl(teacher_data)]
    )
    sft_summary = sft(
        SFTJobConfig(
            base_model=tiny_model,
            output_dir=str(tmp_path / "sft"),
            data=str(messages),
            max_steps=2,  # LoRA path only needs to run and save an adapter
            per_device_batch_size=4,
            max_length=384,
        )
    )
    assert (Path(sft_summary["model_dir"]) / "adapter_config.json").exists()

    sink = MemorySink()
    summary = grpo(
        GRPOJobConfig(
            base_model=tiny_model,
            init_from=sft_summary[
                "output_dir"
            ],  # the SFT run dir: its adapter is merged, then a fresh LoRA
            output_dir=str(tmp_path / "grpo"),
            max_steps=2,  # two steps: two recorded generations
            num_prompts=8,  # a handful of prompts: each step samples 2 of them
            num_generations=4,  # smallest group with within-group variance
            per_device_batch_size=8,  # 2 prompts x 4 completions
            max_completion_length=32,  # short rollouts: generation dominates CPU time
            beta=0.04,  # exercise the reference (adapter-disabled) path and its KL metric
            record_state=True,
        ),
        sink=sink,
    )

    assert summary["global_step"] == 2 and summary["groups_recorded"] == 4
    assert [g["step"] for g in sink.groups] == [1, 1, 2, 2]
    for g in sink.groups:
        assert g["split"] == "train" and g["key"].startswith("diagram-") and len(g["rollouts"]) == 4
        assert isinstance(g["prompt"], list) and g["prompt"][0]["role"] == "user"
        for r in g["rollouts"]:
            assert set(r["rewards"]) == COMPONENTS
            assert all(isinstance(v["reason"], str) and v["reason"] for v in r["rewards"].values())
            assert r["transcript"][0]["role"] == "assistant" and 0 < r["length"] <= 32
            assert r["state"]["svg"].startswith("<svg") and isinstance(r["advantage"], float)
    logged = {k for m in sink.metrics for k in m["values"]}
    assert {"loss", "kl", "reward", *(f"rewards/{c}/mean" for c in COMPONENTS)} <= logged
    assert (tmp_path / "grpo" / "model" / "adapter_config.json").exists()
    assert (
        json.loads((tmp_path / "grpo" / "config.json").read_text())["init_from"]
        == sft_summary["output_dir"]
    )


@pytest.mark.slow
def test_it_runs_dpo_for_two_steps(tiny_model, tmp_path):
    from training.dpo import DPOJobConfig, main
    from training.environments.diagram import DiagramEnvironment, ScriptedDiagramPolicy

    env, policy = DiagramEnvironment(), ScriptedDiagramPolicy(seed=0, skill=0.0)
    pairs = [
        {"prompt": p.text, "chosen": env.solve(p), "rejected": policy.sample(p)}
        for p in env.prompts("train", 4)
    ]
    summary = main(
        DPOJobConfig(
            base_model=tiny_model,
            output_dir=str(tmp_path / "dpo"),
            data=pairs,
            use_lora=False,  # full FT exercises the explicit reference-model copy
            max_steps=2,
            per_device_batch_size=2,  # 2 steps x 2 pairs: the mechanics, nothing more
            max_length=384,
        )
    )
    assert summary["global_step"] == 2 and summary["last_loss"] is not None
    assert (Path(summary["model_dir"]) / "model.safetensors").exists()


# --------------------------------------------------------------------------------------------------
# Sampling jobs


def test_it_evaluates_holdout_prompts_into_groups_with_advantages(tiny_model, tmp_path):
    from training.eval import EvalJobConfig, main

    sink = MemorySink()
    summary = main(
        EvalJobConfig(
            base_model=tiny_model,
            output_dir=str(tmp_path),
            num_prompts=3,
            num_generations=4,  # 3 groups of 4: enough to check the layout
            max_completion_length=16,  # short samples: generation is the cost
        ),
        sink=sink,
    )
    assert len(sink.groups) == 3 and {g["split"] for g in sink.groups} == {"holdout"}
    for g in sink.groups:
        assert [r["index"] for r in g["rollouts"]] == [0, 1, 2, 3]
        for r in g["rollouts"]:
            assert set(r["rewards"]) == COMPONENTS and isinstance(r["advantage"], float)
            assert isinstance(r["completion"], str) and r["length"] <= 16
    assert set(summary["component_means"]) == COMPONENTS and summary["num_completions"] == 12
    assert "eval/reward" in sink.metrics[0]["values"]


def test_it_probes_and_recommends_sft_for_a_random_policy(tiny_model, tmp_path):
    from training.probe import ProbeJobConfig, main

    summary = main(
        ProbeJobConfig(
            base_model=tiny_model,
            output_dir=str(tmp_path),
            num_prompts=2,
            num_generations=4,
            max_completion_length=16,  # smallest probe that shows the report
        )
    )
    assert set(summary["components"]) == COMPONENTS
    for health in summary["components"].values():
        assert set(health) == {"mean", "within_group_std", "frac_zero_std_groups"}
    assert summary["outcome_component"] == "semantic_coverage"
    assert summary["pass_at_k"] == {"pass@1": 0.0, "pass@4": 0.0}
    assert summary["verdict"].startswith("do SFT first")


def test_it_keeps_only_valid_teacher_traces_and_records_rejections(tmp_path):
    from training.common import read_jsonl
    from training.teacher import TeacherJobConfig, main

    sink = MemorySink()
    summary = main(
        TeacherJobConfig(
            output_dir=str(tmp_path),
            num_prompts=12,
            scripted_skill=0.0,
            min_scores={"schema_valid": 1.0},
        ),
        sink=sink,
    )
    assert summary["kept"] > 0 and summary["rejected"] > 0
    kept, rejected = read_jsonl(summary["dataset"]), read_jsonl(tmp_path / "rejected.jsonl")
    assert len(kept) == summary["kept"] and all(r["scores"]["schema_valid"] == 1.0 for r in kept)
    assert all(r["reason"] for r in rejected)
    assert (
        kept[0]["completion"][0]["role"] == "assistant" and kept[0]["prompt"][0]["role"] == "user"
    )
    states = [r["state"] for g in sink.groups for r in g["rollouts"]]
    assert sum(not s["kept"] for s in states) == summary["rejected"]
    assert len([line for line in sink.logs if line.startswith("rejected")]) == summary["rejected"]


def test_it_keeps_a_format_valid_teacher_habit_when_asked_to(tmp_path):
    """A scripted teacher that forgets the connections half the time, filtered on format only: the
    dataset SFT gets carries the habit (the demo chain's setup for GRPO to undo)."""
    from training.common import read_jsonl
    from training.teacher import TeacherJobConfig, main

    config = TeacherJobConfig(
        output_dir=str(tmp_path),
        num_prompts=40,
        scripted_faults={"omit_edges": 0.5},
        min_reward=0.0,
        min_scores={"json_valid": 1.0, "schema_valid": 1.0},
    )
    summary = main(config)
    kept = read_jsonl(summary["dataset"])
    assert summary["rejected"] == 0 and len(kept) == 40
    lazy = [r for r in kept if '"connect"' not in r["completion"][0]["content"]]
    assert 10 <= len(lazy) <= 30 and all(r["scores"]["semantic_coverage"] < 1.0 for r in lazy)
    # The default filter (weighted score >= 0.9) rejects exactly those answers.
    strict = main(
        TeacherJobConfig(
            output_dir=str(tmp_path / "strict"), num_prompts=40, scripted_faults={"omit_edges": 0.5}
        )
    )
    assert strict["rejected"] == len(lazy) and strict["kept"] == 40 - len(lazy)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scripted_faults": {"omit_edge": 0.5}}, "scripted_faults: unknown fault 'omit_edge'"),
        (
            {"scripted_faults": {"omit_edges": -0.1}},
            "scripted_faults: omit_edges must be a probability",
        ),
        (
            {"scripted_faults": {"omit_edges": 0.5}, "teacher": "http://localhost:1/v1"},
            "scripted_faults: only for teacher 'scripted'",
        ),
    ],
)
def test_it_rejects_bad_scripted_faults(tmp_path, fields, message):
    from training.teacher import TeacherJobConfig

    with pytest.raises(ValueError, match="^" + re.escape(message)):
        TeacherJobConfig(output_dir=str(tmp_path), **fields)


def test_it_uses_an_openai_compatible_endpoint_teacher(tmp_path, monkeypatch):
    """No remote API is reachable here, so a local http.server stub plays the endpoint: it answers
    /v1/chat/completions in the OpenAI wire format with the reference solution."""
    from training.environments.diagram import DiagramEnvironment
    from training.teacher import TeacherJobConfig, main

    env = DiagramEnvironment()
    by_text = {p.text: env.solve(p) for p in env.prompts("train", 4)}
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
            answer = by_text[body["messages"][-1]["content"]]
            payload = {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"completion_tokens": 50},
            }
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TEACHER_KEY", "sk-test")
    try:
        summary = main(
            TeacherJobConfig(
                output_dir=str(tmp_path),
                num_prompts=4,
                api_key_env="TEACHER_KEY",
                teacher=f"http://127.0.0.1:{server.server_port}/v1",
                teacher_model="big",
            )
        )
    finally:
        server.shutdown()
        server.server_close()
    assert summary["kept"] == 4
    assert {s["path"] for s in seen} == {"/v1/chat/completions"}
    assert {s["auth"] for s in seen} == {"Bearer sk-test"} and {s["model"] for s in seen} == {"big"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert "sk-test" not in json.dumps(config)  # the key is read from the environment, never stored


def test_it_runs_a_job_from_the_cli_with_a_jsonl_sink(tmp_path, capsys):
    from training.config import cli
    from training.sinks import read_jsonl_sink
    from training.teacher import TeacherJobConfig, main

    config = tmp_path / "teacher.json"
    config.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "num_prompts": 2}))
    cli(
        TeacherJobConfig,
        main,
        ["--config", str(config), "--jsonl-sink", str(tmp_path / "sink.jsonl")],
    )
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{") :])["kept"] == 2
    assert len(read_jsonl_sink(tmp_path / "sink.jsonl")["groups"]) == 2

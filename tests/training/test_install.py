"""The training side installs with pip and works outside the checkout, without Django.

A wheel is built from pyproject.toml (from a copy of the sources, so no build/ folder lands in the
checkout), installed into a fresh virtualenv with --no-deps, and that venv sees the project venv's
site-packages through a .pth file: its dependencies are "already installed", nothing is downloaded.
A script run from a user's project outside the checkout, which has a `training/` package of its own
(as most RL repositories do), imports the installed `reward_debugger` client, sinks, importers and
OpenRLHF wrapper (Django must not be imported) beside the user's `training`, reads each
environment's prompts (task data shipped as package data), talks to a stand-in API, and records
a real TRL GRPO step on the tiny model through the recorder's JSONL sink.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import training  # the user's own package, found first (the script runs in their project)
assert training.USERS_OWN, training.__file__
import reward_debugger, reward_debugger.client, reward_debugger.sinks, reward_debugger.importers
import reward_debugger.openrlhf_reward
assert "django" not in sys.modules, "the training side imported Django"
from reward_debugger.client import Client
found = Client(sys.argv[1], "KEY", retries=0).find_run("wanted")
from reward_debugger.environments import available_environments, get_environment
envs = {name: len(get_environment(name).prompts("train", 3)) for name in available_environments()}

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from reward_debugger.recorder import RolloutRecorder
from reward_debugger.sinks import read_jsonl_sink

def distinct(prompts, completions, **kw):
    return [len(set(c)) / 20.0 for c in completions]

args = GRPOConfig(output_dir="out", num_generations=4, per_device_train_batch_size=4,
                  max_completion_length=8, max_steps=1, use_cpu=True, bf16=False,
                  activation_checkpointing=False, report_to="none", save_strategy="no",
                  disable_tqdm=True, logging_steps=1, seed=0)
trainer = GRPOTrainer(model=sys.argv[2], reward_funcs=[distinct], args=args,
                      train_dataset=Dataset.from_list([{"prompt": "Draw:"}] * 4),
                      callbacks=[RolloutRecorder(jsonl="rollouts.jsonl")])
trainer.train()
data = read_jsonl_sink("rollouts.jsonl")
print(json.dumps({"installed": reward_debugger.__file__, "training": training.__file__,
                  "found": found, "groups": len(data["groups"]), "envs": envs,
                  "settings": data["settings"][0]["weights"]}))
"""


class _Runs(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps(
            {"runs": [{"id": 7, "name": "wanted"}] if "name=wanted" in self.path else []}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.slow  # builds a wheel, makes a venv and trains a step in it
def test_it_installs_as_a_wheel_and_records_a_trl_run_outside_the_checkout(tmp_path, tiny_model):
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "training", src / "training", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("reward_debugger-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "reward_debugger/recorder.py" in names and not any(
        n.startswith("training/") for n in names
    )
    assert "reward_debugger/environments/ask_to_code/tasks.json" in names  # package-data
    assert "reward_debugger/environments/diagram/requests.json" in names
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "project-deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )  # numpy, pyarrow, trl...

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Runs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = tmp_path / "elsewhere"
    (work / "training").mkdir(parents=True)  # the user's project has its own training package
    (work / "training" / "__init__.py").write_text("USERS_OWN = True\n")
    (work / "training" / "client.py").write_text("raise ImportError('the user module')\n")
    try:
        done = subprocess.run(
            [str(python), "-c", SCRIPT, f"http://127.0.0.1:{server.server_port}", tiny_model],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp_path),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["installed"].startswith(str(site))  # the installed copy, not the checkout
    assert out["training"] == str(work / "training" / "__init__.py")  # the user's stays theirs
    assert out["found"] == {"id": 7, "name": "wanted"}
    assert out["envs"] == {"ask_to_code": 3, "diagram": 3}  # task data read from the wheel
    assert out["groups"] == 1 and out["settings"] == {"distinct": 1.0}


def test_nothing_inside_training_imports_training_by_its_checkout_name():
    """Installed, the package is reward_debugger: an absolute `training` import inside it would
    reach the user's own training package (or nothing)."""
    import ast

    absolute = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            absolute += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for n in names
                if n == "training" or n.startswith("training.")
            ]
    assert absolute == []

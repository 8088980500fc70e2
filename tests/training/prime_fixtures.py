"""A PRIME-RL run on disk, written the way PRIME-RL's orchestrator writes it (no Django).

Built field by field from prime-rl 559b44772 (2026-08) and verifiers a60a606ec:
- records: verifiers `Episode.to_record()` (episode.py; `exclude_none=True`), traces
  (trace.py: rewards {score, weight}, metrics, ok, stop_condition, errors), message nodes
  (graph.py: parent, message, sampled, token_ids, mask, logprobs, advantages);
- dispatcher.emit_episode: `group.id` a uuid per dispatched group, `run.work` = {type, step: the
  step at dispatch, policy: {start, end}}; a failed task becomes a trace-less episode
  (`ok: false`, `errors`, `traces: []`);
- orchestrator.main_loop: each train episode is appended to `step_<progress.step>/train/all` the
  moment it arrives (before scoring: no advantages);
- train_sink: a group is scored when its last episode arrives (algo/grpo.py: reward minus the mean
  of the clean trainable traces, float32, assigned to every sampled token by
  routing.assign_advantages); its traces join one queue; a batch takes the first `batch_size`
  traces, drops those whose advantages are all zero (`filter_zero_advantages`, default True) and
  is logged to `step_<progress.step>/train/effective` as episode copies holding only the shipped
  traces; then `progress.step` advances.

`PrimeRun.truth` is what PRIME-RL trained on, kept independently of the files.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def node(parent: int | None, message: dict[str, Any], *, sampled: bool, n: int) -> dict:
    return {
        **({"parent": parent} if parent is not None else {}),
        "message": message,
        "sampled": sampled,
        "timestamp": 1754000000.0,
        "token_ids": list(range(100 + 7 * n, 100 + 8 * n)),
        # a sampled message: its role header is template scaffold (mask False), the rest sampled
        "mask": [False] + [True] * (n - 1) if sampled else [False] * n,
        "is_content": [],
        "logprobs": [-0.03125 * (k + 1) for k in range(n - 1)] if sampled else [],
    }


def trace_record(
    task: dict[str, Any], tid: str, j: int, scores: dict[str, float | None], *, ok: bool = True
) -> dict[str, Any]:
    """A multi-turn tool-using trace: system, user, assistant (tool call), tool, assistant."""
    q = task["data"]["question"]
    nodes = [
        node(None, {"role": "system", "content": "Use the calculator."}, sampled=False, n=4),
        node(0, {"role": "user", "content": [{"type": "text", "text": q}]}, sampled=False, n=6),
        node(
            1,
            {
                "role": "assistant",
                "content": f"Let me compute ({j}).",
                "tool_calls": [{"id": f"call-{tid}", "name": "calc", "arguments": '{"x": 2}'}],
            },
            sampled=True,
            n=8,
        ),
        node(
            2,
            {"role": "tool", "tool_call_id": f"call-{tid}", "content": "4", "name": "calc"},
            sampled=False,
            n=3,
        ),
        node(3, {"role": "assistant", "content": f"The answer is {j}."}, sampled=True, n=5),
    ]
    return {
        "version": 1,
        "id": tid,
        "verifiers": {"version": "0.2.0"},
        "task": task,
        "agent": {"config": {"id": "react"}, "name": "agent", "trainable": True},
        "tools": [{"name": "calc", "description": "adds", "parameters": {"type": "object"}}],
        "nodes": nodes,
        "calls": [],
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": {
            k: (None if v is None else {"score": v, "weight": WEIGHTS[k]})
            for k, v in scores.items()
        },
        "metrics": {"num_tool_calls": 1.0},
        "info": {},
        "extra_usage": [],
        "is_completed": True,
        "ok": ok,
        "stop_condition": "completed" if ok else "error",
        "errors": [] if ok else [{"type": "SandboxError", "message": "box died"}],
        "timing": {"start": 1.0, "boot": {"start": 0.0, "end": 0.0}},
    }


WEIGHTS = {"correct": 1.0, "format": 0.5}


@dataclass
class Sampled:
    """One dispatched episode: its component scores, or None for a failed task (no trace)."""

    scores: dict[str, float | None] | None
    ok: bool = True


@dataclass
class PrimeRun:
    root: Path
    batch_size: int = 8
    filter_zero_advantages: bool = True
    env: str = "calc-env"
    step: int = 1  # progress.step: the batch being collected
    truth: dict[str, dict[str, Any]] = field(default_factory=dict)  # group id -> facts
    _pending: list[tuple[str, dict, dict, float]] = field(default_factory=list)
    _arrived: dict[str, list[dict]] = field(default_factory=dict)
    _size: dict[str, int] = field(default_factory=dict)

    def dispatch(self, name: str, rollouts: list[Sampled], *, step: int | None = None) -> str:
        gid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{self.root}/{name}"))
        task = {
            "type": "CalcTask",
            "data": {"question": f"What is {name}?", "answer": "4", "idx": len(self.truth)},
            "key": f"task-{name}",
            "hash": f"h-{name}",
        }
        eps = []
        for j, s in enumerate(rollouts):
            ep: dict[str, Any] = {
                "id": f"ep-{name}-{j}",
                "env": {"id": self.env, "name": self.env},
                "task": task,
                "ok": s.scores is not None and s.ok,
                "errors": [],
                "traces": [],
            }
            if s.scores is None:
                ep["errors"] = [{"type": "TimeoutError", "message": "env server timed out"}]
            else:
                ep["traces"] = [trace_record(task, f"tr-{name}-{j}", j, s.scores, ok=s.ok)]
            ep["group"] = {"id": gid}
            d = self.step if step is None else step
            ep["run"] = {
                "type": "train",
                "id": "run-x",
                "work": {"type": "train", "step": d, "policy": {"start": d - 1, "end": d - 1}},
            }
            eps.append(ep)
        self.truth[gid] = {"name": name, "episodes": eps, "dispatch_step": eps[0]["run"]["work"]}
        self._size[gid] = len(rollouts)
        return gid

    def arrive(self, gid: str, j: int) -> None:
        """orchestrator.main_loop + TrainSink.add for one completed episode."""
        ep = self.truth[gid]["episodes"][j]
        self._write("train", "all", [ep])
        self._arrived.setdefault(gid, []).append(ep)
        if len(self._arrived[gid]) == self._size[gid]:
            self._score(gid)
        while len(self._pending) >= self.batch_size:
            self._ship()

    def arrive_all(self, gid: str) -> None:
        for j in range(self._size[gid]):
            self.arrive(gid, j)

    def _score(self, gid: str) -> None:
        eps = self._arrived[gid]
        clean = [
            (ep, t)
            for ep in eps
            for t in ep["traces"]
            if t["ok"] and any(any(n["mask"]) for n in t["nodes"])
        ]
        rewards = np.array(
            [sum(r["score"] * r["weight"] for r in t["rewards"].values() if r) for _, t in clean],
            dtype=np.float32,
        )
        adv = (rewards - rewards.mean()).tolist() if len(rewards) else []
        facts = self.truth[gid]
        facts["rewards"] = [None] * len(eps)
        facts["advantages"] = [0.0] * len(eps)
        facts["trained_step"] = [None] * len(eps)
        for (ep, t), r, a in zip(clean, rewards.tolist(), adv, strict=True):
            j = eps.index(ep)
            facts["rewards"][j], facts["advantages"][j] = r, a
            self._pending.append((gid, ep, t, a))
        facts["finished_in"] = self.step

    def _ship(self) -> None:
        batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
        if self.filter_zero_advantages:
            batch = [b for b in batch if b[3] != 0.0]
        copies = []
        for gid, ep, t, a in batch:
            shipped = json.loads(json.dumps(t))
            for n in shipped["nodes"]:
                if any(n["mask"]):
                    n["advantages"] = [a] * sum(n["mask"])  # one per sampled token
            copies.append({**ep, "traces": [shipped]})
            j = self.truth[gid]["episodes"].index(ep)
            self.truth[gid]["trained_step"][j] = self.step
        self._write("train", "effective", copies)
        self.step += 1

    def eval_group(self, name: str, scores: list[float], step: int) -> None:
        task = {"type": "CalcTask", "data": {"question": f"Eval {name}?"}, "key": f"ev-{name}"}
        gid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{self.root}/eval/{name}"))
        eps = [
            {
                "id": f"ev-{name}-{j}",
                "env": {"id": self.env, "name": self.env},
                "task": task,
                "group": {"id": gid},
                "run": {
                    "type": "train",
                    "id": "run-x",
                    "work": {"type": "eval", "step": step, "policy": {"start": step, "end": step}},
                },
                "ok": True,
                "errors": [],
                "traces": [trace_record(task, f"etr-{name}-{j}", j, {"correct": s, "format": 1.0})],
            }
            for j, s in enumerate(scores)
        ]
        for ep in eps:
            self._write("eval", "all", [ep], step=step)
        self._write("eval", "effective", eps, step=step)

    def write_config(self, group_size: int = 4) -> None:
        """configs/orchestrator.json as write_subconfigs dumps the resolved OrchestratorConfig
        (the fields this project reads, with their resolved values)."""
        cfg = {
            "algo": {"type": "grpo", "length_penalty": None},
            "train": {
                "filter_zero_advantages": self.filter_zero_advantages,
                "source": [
                    {
                        "env": {"id": "", "taskset": {"id": self.env}},
                        "name": None,
                        "group_size": group_size,
                        "algo": {"type": "grpo", "length_penalty": None},
                    }
                ],
            },
            "eval": None,
            "batch_size": self.batch_size,
            "group_size": group_size,
            "max_off_policy_steps": 8,
        }
        (self.root / "configs").mkdir(parents=True, exist_ok=True)
        (self.root / "configs" / "orchestrator.json").write_text(json.dumps(cfg, indent=2))

    def _write(self, kind: str, subset: str, eps: list[dict], *, step: int | None = None) -> None:
        path = (
            self.root
            / "rollouts"
            / f"step_{self.step if step is None else step}"
            / kind
            / subset
            / "traces.jsonl"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            for ep in eps:
                f.write(json.dumps(ep) + "\n")


def _sampled(rows: list[tuple[float, float] | None], bad: int | None = None) -> list[Sampled]:
    return [
        Sampled(None) if r is None else Sampled({"correct": r[0], "format": r[1]}, ok=j != bad)
        for j, r in enumerate(rows)
    ]


def default_run(root: Path, *, config: bool = True) -> PrimeRun:
    """A default PRIME-RL run (group_size 4, batch_size 8, filter_zero_advantages on). Rewards are
    correct + 0.5 x format. The plan (checked by the tests against `truth`):

    - A: rewards 1, 0, .5, .5: two zero-advantage members, not shipped; Z: zero-std, never shipped;
      A and Z fill batch 1 (step 1), which ships A's two other traces;
    - B and C, dispatched at step 1, arrive in step 2's window and are trained by batch 2 (step 2);
    - E, dispatched at step 1: one failed task (no trace), one errored trace; two episodes arrive in
      step 2's window, two in step 3's; trained at step 3 (its two clean traces);
    - D (step 3) trained at step 3; F is split: two traces by batch 3, two by batch 4 (two
      effective files, one group id); G trained at step 4; H half trained at step 4, its other
      two traces still queued when the run ends.
    """
    run = PrimeRun(root)
    a = run.dispatch("A", _sampled([(1, 0), (0, 0), (0, 1), (0, 1)]))
    z = run.dispatch("Z", _sampled([(1, 1)] * 4))
    b = run.dispatch("B", _sampled([(1, 1), (0, 1), (1, 0), (0, 0)]))
    c = run.dispatch("C", _sampled([(1, 1), (0, 0), (0, 1), (1, 0)]))
    e = run.dispatch("E", _sampled([(1, 1), None, (0, 1), (1, 0)], bad=3))
    run.arrive_all(a)
    run.arrive_all(z)  # 8 queued: batch 1 ships A's two non-zero traces
    run.arrive_all(b)
    run.arrive(e, 0)
    run.arrive(e, 1)
    run.arrive_all(c)  # batch 2: B and C
    run.arrive(e, 2)
    run.arrive(e, 3)  # E finishes in step 3's window: its 2 clean traces queued
    for name, rows in (
        ("D", [(1, 1), (0, 0), (1, 0), (0, 1)]),
        ("F", [(1, 0), (0, 0), (1, 1), (0, 1)]),
    ):
        run.arrive_all(run.dispatch(name, _sampled(rows)))  # after F: batch 3 = E, D, F[:2]
    for name, rows in (
        ("G", [(0, 1), (1, 1), (0, 0), (1, 0)]),
        ("H", [(1, 1), (0, 1), (1, 0), (0, 0)]),
    ):
        run.arrive_all(run.dispatch(name, _sampled(rows)))  # after H: batch 4 = F[2:], G, H[:2]
    run.eval_group("q", [1.0, 0.0], step=2)
    if config:
        run.write_config()
    return run

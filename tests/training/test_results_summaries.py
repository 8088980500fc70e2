"""What eval and teacher jobs record for their run's page: the teacher's reasons for dropping
trajectories, counted per check, and the eval's environment checks (the demo's "answers without
connections")."""

from __future__ import annotations

import json

from training.environments import get_environment
from training.environments.diagram import analyse, completion_text
from training.sinks import MemorySink


def test_it_counts_the_teachers_rejections_per_failed_check(tmp_path):
    from training.common import read_jsonl
    from training.teacher import TeacherJobConfig, main

    summary = main(
        TeacherJobConfig(
            output_dir=str(tmp_path),
            num_prompts=12,
            scripted_skill=0.0,
            min_scores={"schema_valid": 1.0, "json_valid": 1.0},
            min_reward=0.5,
        ),
        sink=MemorySink(),
    )
    rejected = read_jsonl(tmp_path / "rejected.jsonl")
    assert summary["rejected"] == len(rejected) > 0
    expected: dict[str, int] = {}
    for r in rejected:  # recount from the scores each rejected trajectory carries
        s = r["scores"]
        failed = [
            f"{n} < 1" for n in ("schema_valid", "json_valid") if s[n] is not None and s[n] < 1
        ]
        failed += [f"{n} unscorable" for n, v in s.items() if v is None]
        if "weighted score" in r["reason"]:
            failed.append("weighted score < 0.5")
        assert failed, r["reason"]
        for name in failed:
            expected[name] = expected.get(name, 0) + 1
    assert summary["rejected_by"] == expected
    counts = list(summary["rejected_by"].values())
    assert counts == sorted(counts, reverse=True)  # most frequent first


def test_it_reports_the_share_of_answers_without_connections():
    from training.eval import eval_checks

    env = get_environment("diagram")
    prompts = [p for p in env.prompts("holdout", 6, seed=0) if p.spec.get("edges")][:4]
    full = [env.solve(p) for p in prompts]
    # the teacher's habit: every shape drawn, every connection forgotten
    bare = [
        json.dumps([a for a in json.loads(answer) if a["action"] != "connect"]) for answer in full
    ]
    assert all(not analyse(completion_text(b)).canvas.edges for b in bare)
    groups = [
        {"rollouts": [{"completion": a}, {"completion": b}, {"completion": "not json"}]}
        for a, b in zip(full, bare, strict=True)
    ]
    checks = eval_checks(env, prompts, groups)
    assert checks == {
        "answers without connections": {
            "share": 2 / 3,
            "count": 2 * len(prompts),
            "n": 3 * len(prompts),
        }
    }

"""The diagram environment: parsing, canvas, the four reward components, prompts,
teacher, demo data."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from training.demo import generate_groups, linear_schedule
from training.environments import available_environments, get_environment
from training.environments.base import Prompt, Score
from training.environments.diagram import (
    Canvas,
    DiagramEnvironment,
    ScriptedDiagramPolicy,
    json_valid,
    layout_quality,
    schema_valid,
    seed_prompts,
    semantic_coverage,
    solve_actions,
    synthetic_prompt,
)

SVG_NS = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parents[2]


def shape(
    id: str, x: int = 0, y: int = 0, w: int = 100, h: int = 50, label: str | None = None
) -> dict:
    return {
        "action": "create_shape",
        "id": id,
        "label": label or id.title(),
        "shape": "rect",
        "x": x,
        "y": y,
        "w": w,
        "h": h,
    }


def connect(a: str, b: str) -> dict:
    return {"action": "connect", "from": a, "to": b}


@pytest.fixture
def env() -> DiagramEnvironment:
    return DiagramEnvironment()


@pytest.fixture
def ci() -> Prompt:
    return Prompt(
        key="t-ci",
        text="Draw a CI pipeline",
        split="train",
        spec={
            "nodes": ["Build", "Test", "Deploy"],
            "edges": [["Build", "Test"], ["Test", "Deploy"]],
        },
    )


def good_ci() -> list[dict]:
    return [
        shape("build", 0, 0),
        shape("test", 200, 0),
        shape("deploy", 400, 0),
        connect("build", "test"),
        connect("test", "deploy"),
    ]


# --- json_valid ------------------------------------------------------------------------------


def test_it_orders_json_credit_prose_malformed_wrong_type_valid(ci: Prompt) -> None:
    prose = json_valid(ci, "Sure, I will draw a build box and a test box.").value
    malformed = json_valid(ci, '[{"action": "create_shape", "id": "build"').value
    wrong_type = json_valid(ci, '{"actions": []}').value
    valid = json_valid(ci, json.dumps(good_ci())).value
    assert prose == 0.0
    assert 0.0 < malformed < wrong_type < valid == 1.0


def test_it_gives_more_credit_to_json_that_breaks_later(ci: Prompt) -> None:
    early = json_valid(ci, '[{"action" "create_shape", "id": "build", "label": "Build"}]')
    late = json_valid(ci, '[{"action": "create_shape", "id": "build", "label": "Build"')
    assert early.value < late.value < 0.6
    assert early.reason.startswith("JSON parse error at char 11: Expecting ':' delimiter")


def test_it_strips_json_fences_even_when_unclosed(ci: Prompt) -> None:
    body = json.dumps(good_ci())
    assert json_valid(ci, f"```json\n{body}\n```").value == 1.0
    assert json_valid(ci, f"Here you go:\n```\n{body}\n```\nDone.").value == 1.0
    assert json_valid(ci, f"```json\n{body}").value == 1.0  # truncated before the closing fence


def test_it_scores_empty_and_non_object_lists(ci: Prompt) -> None:
    assert json_valid(ci, "   ").value == 0.0
    assert json_valid(ci, "[1, 2]").value == 0.6


def test_it_survives_absurdly_nested_json(ci: Prompt) -> None:
    nested = "[" * 100_000 + "]" * 100_000  # the stdlib parser raises RecursionError here
    assert json_valid(ci, nested) == Score(0.1, "JSON parse error at char 0: too deeply nested")
    assert layout_quality(ci, nested).value == 0.0


def test_it_grades_the_last_assistant_message_of_a_chat(ci: Prompt) -> None:
    chat = [
        {"role": "user", "content": "draw it"},
        {"role": "assistant", "content": "hmm"},
        {"role": "assistant", "content": [{"type": "text", "text": json.dumps(good_ci())}]},
    ]
    assert json_valid(ci, chat).value == 1.0
    assert json_valid(ci, [{"role": "user", "content": "[]"}]).value == 0.0  # no assistant turn


# --- schema_valid and the canvas --------------------------------------------------------------


def test_it_records_canvas_errors_instead_of_raising() -> None:
    canvas = Canvas().apply_all(
        [
            shape("a"),
            shape("a", 300),  # duplicate id
            {"action": "draw_circle", "id": "c"},  # unknown action
            {
                "action": "create_shape",
                "id": "d",
                "label": "D",
                "shape": "rect",
                "x": 0,
                "y": 0,
                "w": 9,
            },
            {**shape("e", 500), "x": "10"},  # string coordinate
            {**shape("f", 500), "shape": "hexagon"},
            {**shape("g", 500), "w": True},  # bool is not an int here
            connect("a", "nowhere"),
            "not an object",
            connect("a", "a"),
            connect("a", "a"),  # duplicate edge
        ]
    )
    assert canvas.n_actions == 11 and canvas.n_applied == 2
    assert list(canvas.shapes) == ["a"]
    joined = "\n".join(canvas.errors)
    for fragment in (
        "duplicate id 'a'",
        "unknown action 'draw_circle'",
        "missing field 'h'",
        "'x' must be an integer",
        "'shape' must be one of",
        "'w' must be an integer",
        "unknown id 'nowhere'",
        "not an object",
        "duplicate edge",
    ):
        assert fragment in joined


def test_it_scores_schema_as_fraction_of_accepted_actions(ci: Prompt) -> None:
    actions = good_ci() + [connect("build", "ghost"), {"action": "create_shape", "id": "x"}]
    score = schema_valid(ci, json.dumps(actions))
    assert score.value == pytest.approx(5 / 7)
    assert score.reason.startswith("5/7 actions valid")
    assert schema_valid(ci, "not json").value == 0.0
    assert schema_valid(ci, "[]").value == 0.0


def test_it_refuses_actions_past_the_cap() -> None:
    canvas = Canvas().apply_all([shape(f"s{i}", i, 0, 1, 1) for i in range(250)])
    assert len(canvas.shapes) == 200
    assert "more than 200 actions" in canvas.errors[0]


# --- semantic_coverage ------------------------------------------------------------------------


def test_it_counts_nodes_and_directed_edges(ci: Prompt) -> None:
    partial = [shape("build"), shape("t", 200, label="  TEST "), connect("build", "t")]
    score = semantic_coverage(ci, json.dumps(partial))
    assert score.value == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert score.reason == "2/3 nodes, 1/2 edges"
    # A reversed edge is no hit, and it is an extra edge: 0.5 * 1 / (1 + 2) off the edge half.
    reversed_edge = [*good_ci()[:3], connect("test", "build"), connect("test", "deploy")]
    score = semantic_coverage(ci, json.dumps(reversed_edge))
    assert score.value == pytest.approx((1.0 + 1 / 2 - 1 / 6) / 2)
    assert score.reason == "3/3 nodes, 1/2 edges, 1 extra edges"


def test_it_penalises_extra_and_duplicate_nodes_mildly(ci: Prompt) -> None:
    extra = [*good_ci(), shape("logs", 600, 0)]
    dup = [*good_ci(), shape("build2", 600, 0, label="Build")]
    for actions in (extra, dup):
        score = semantic_coverage(ci, json.dumps(actions))
        assert score.value == pytest.approx((1.0 - 0.5 * 1 / 4 + 1.0) / 2)
        assert score.reason == "3/3 nodes, 2/2 edges, 1 extra nodes"
    spam = [*good_ci(), *(shape(f"junk{i}", 0, 100 + i, 1, 1) for i in range(150))]
    # Spam costs the node half up to 0.5: never worth more than the honest answer.
    assert semantic_coverage(ci, json.dumps(spam)).value == pytest.approx(
        (1.0 - 0.5 * 150 / 153 + 1.0) / 2
    )


def test_it_does_not_pay_to_connect_everything(ci: Prompt) -> None:
    ids = ["build", "test", "deploy"]
    everything = [*good_ci()[:3], *(connect(a, b) for a in ids for b in ids)]
    hacked = semantic_coverage(ci, json.dumps(everything))
    assert hacked.reason == "3/3 nodes, 2/2 edges, 7 extra edges"
    assert hacked.value < semantic_coverage(ci, json.dumps(good_ci())).value == 1.0
    assert hacked.value < 0.85


def test_it_cannot_score_a_prompt_without_nodes() -> None:
    prompt = Prompt(key="k", text="t", split="train", spec={})
    assert math.isnan(semantic_coverage(prompt, "[]").value)


# --- layout_quality ---------------------------------------------------------------------------


def test_it_flags_overlaps_and_out_of_bounds(ci: Prompt) -> None:
    actions = [
        shape("a", 0, 0),
        shape("b", 50, 20),
        shape("c", 300, 0),
        shape("d", 750, 0),
        shape("e", 100, 0),
    ]  # e touches a's edge exactly: touching is not overlapping
    score = layout_quality(ci, json.dumps(actions))
    # a-b overlap, b-e overlap, d sticks out past x=800: only c is clear.
    assert score.value == pytest.approx(1 / 5)
    assert score.reason == "1/5 shapes clear; 3 overlapping, 1 out of bounds"


def test_it_gives_no_layout_credit_when_nothing_is_drawn(ci: Prompt) -> None:
    assert layout_quality(ci, json.dumps([connect("a", "b")])).value == 0.0
    assert layout_quality(ci, "nope").reason == "nothing drawn"


# --- rendering --------------------------------------------------------------------------------


def test_it_renders_hostile_labels_inert(env: DiagramEnvironment, ci: Prompt) -> None:
    hostile = ["<script>alert(1)</script>", '" onload="alert(1)', "a & b \x00\x07 ]]>"]
    actions = [shape(f"s{i}", i * 200, 0, label=label) for i, label in enumerate(hostile)]
    actions.append({**connect("s0", "s1"), "label": "</text><script>x</script>"})
    svg = env.state(ci, json.dumps(actions))["svg"]
    root = ET.fromstring(svg)  # well-formed XML despite the NUL and control characters
    tags = {el.tag.removeprefix(SVG_NS) for el in root.iter()}
    assert "script" not in tags
    assert all(not k.startswith("on") for el in root.iter() for k in el.attrib)
    texts = [el.text for el in root.iter(f"{SVG_NS}text")]
    assert "<script>alert(1)</script>" in texts and '" onload="alert(1)' in texts
    assert "a & b  ]]>" in texts
    assert "<script>" not in svg


def test_it_reports_state_with_errors_and_shape_count(env: DiagramEnvironment, ci: Prompt) -> None:
    state = env.state(ci, json.dumps(good_ci() + [connect("build", "ghost")]))
    assert state["n_shapes"] == 3
    assert state["errors"] == ["action 5: connect to unknown id 'ghost'"]
    assert state["svg"].count("<rect") == 4  # background + three shapes
    empty = env.state(ci, "prose")
    assert empty["n_shapes"] == 0 and empty["svg"].startswith("<svg")


# --- environment, prompts, teacher ------------------------------------------------------------


def test_it_scores_the_reference_solution_perfectly(env: DiagramEnvironment) -> None:
    prompts = seed_prompts() + env.prompts("train", 100) + env.prompts("holdout", 40)
    for prompt in prompts:
        scores = env.score(prompt, env.solve(prompt))
        assert {n: s.value for n, s in scores.items()} == {c.name: 1.0 for c in env.components}, (
            prompt.key
        )


def test_it_declares_the_four_weighted_components(env: DiagramEnvironment) -> None:
    assert [(c.name, c.weight, c.kind) for c in env.components] == [
        ("json_valid", 0.2, "behavioural"),
        ("schema_valid", 0.2, "behavioural"),
        ("semantic_coverage", 1.0, "outcome"),
        ("layout_quality", 0.3, "process"),
    ]


def test_it_shows_the_request_and_schema_in_the_prompt(env: DiagramEnvironment) -> None:
    prompt = next(p for p in seed_prompts() if p.key == "diagram-seed-ci-pipeline")
    assert '"action":"create_shape"' in prompt.text and "800x600" in prompt.text
    assert prompt.text.endswith("Nodes: Build, Test, Deploy. Edges: Build->Test, Test->Deploy.")
    assert prompt.spec["edges"] == [["Build", "Test"], ["Test", "Deploy"]]


def test_it_generates_prompts_deterministically(env: DiagramEnvironment) -> None:
    first = env.prompts("train", 50, seed=3)
    assert first == DiagramEnvironment().prompts("train", 50, seed=3)
    assert env.prompts("train", 20, seed=3) == first[:20]
    assert env.prompts("train", 50, seed=4) != first
    assert len({p.key for p in first}) == 50 and all(p.split == "train" for p in first)


def test_it_keeps_train_and_holdout_disjoint(env: DiagramEnvironment) -> None:
    train = env.prompts("train", 400)
    holdout = env.prompts("holdout", 100)
    assert all(p.split == "holdout" for p in holdout)
    assert not {p.key for p in train} & {p.key for p in holdout}
    assert not {p.text for p in train} & {p.text for p in holdout}
    families = {p.spec["family"] for p in holdout}
    assert families == {"pipeline", "org_chart", "state_machine", "architecture", "flowchart"}


def test_it_holds_out_about_a_fifth_of_the_synthetic_stream() -> None:
    splits = [synthetic_prompt(i).split for i in range(2000)]
    assert 0.15 < splits.count("holdout") / len(splits) < 0.25
    assert synthetic_prompt(7) == synthetic_prompt(7)  # a pure function of its index
    assert synthetic_prompt(7).key == "diagram-state-machine-000007"


def test_it_registers_the_diagram_environment() -> None:
    assert "diagram" in available_environments()
    assert isinstance(get_environment("diagram"), DiagramEnvironment)
    with pytest.raises(KeyError, match="unknown environment"):
        get_environment("nope")


def test_it_never_imports_django() -> None:
    # A fresh interpreter: this test session may have Django loaded by other tests.
    code = (
        "import sys, training.demo, training.environments.diagram; "
        "sys.exit(any(m.split('.')[0] == 'django' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


def test_it_gives_a_perfect_teacher_at_full_skill(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=0, skill=1.0)
    for prompt in env.prompts("train", 30):
        scores = env.score(prompt, policy.sample(prompt))
        assert all(s.value == 1.0 for s in scores.values())


def test_it_samples_a_variety_of_faults_at_low_skill(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=1, skill=0.0)
    scored = [env.score(p, policy.sample(p)) for p in env.prompts("train", 40) for _ in range(8)]
    reasons = " | ".join(s.reason for scores in scored for s in scores.values())
    for fragment in (
        "not JSON",
        "JSON parse error",
        "extra",
        "overlapping",
        "actions valid; first",
    ):
        assert fragment in reasons
    assert any(" 1 out of bounds" in s["layout_quality"].reason for s in scored)
    assert any(s["semantic_coverage"].value < 1.0 and s["json_valid"].value == 1.0 for s in scored)


def test_it_gives_a_teacher_habit_at_a_fixed_rate(env: DiagramEnvironment) -> None:
    """omit_edges: valid, schema-correct answers without any connection, at the
    asked-for rate only."""
    policy = ScriptedDiagramPolicy(seed=0, skill=1.0, faults={"omit_edges": 0.5})
    prompts = env.prompts("train", 200)
    scored = [env.score(p, policy.sample(p)) for p in prompts]
    lazy = [s for s in scored if s["semantic_coverage"].value < 1.0]
    assert 70 <= len(lazy) <= 130
    assert all(
        s["json_valid"].value == s["schema_valid"].value == s["layout_quality"].value == 1.0
        for s in scored
    )
    assert all(re.search(r", 0/\d+ edges", s["semantic_coverage"].reason) for s in lazy)
    assert all(s["semantic_coverage"].value == 1.0 for s in scored if s not in lazy)
    # Without the habit the fault never fires and the stream of other faults is unchanged.
    plain, zero = (
        ScriptedDiagramPolicy(seed=3, skill=0.4),
        ScriptedDiagramPolicy(seed=3, skill=0.4, faults={"omit_edges": 0.0}),
    )
    assert [plain.sample(p) for p in prompts[:30]] == [zero.sample(p) for p in prompts[:30]]
    # A fixed rate replaces the skill-scaled one for a skill fault too.
    never = ScriptedDiagramPolicy(seed=1, skill=0.0, faults={"prose": 0.0, "break_json": 0.0})
    assert all(env.score(p, never.sample(p))["json_valid"].value >= 0.6 for p in prompts[:60])


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        ({"forget": 0.5}, "faults: unknown fault 'forget'"),
        ({"omit_edges": 1.5}, "faults: omit_edges must be a probability in [0, 1], got 1.5"),
        ({"drop_node": "0.2"}, "faults: drop_node must be a probability"),
    ],
)
def test_it_rejects_unknown_faults_and_bad_rates(faults: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ScriptedDiagramPolicy(faults=faults)


def test_it_samples_deterministically_from_a_seeded_rng(env: DiagramEnvironment) -> None:
    prompt = env.prompts("train", 1)[0]
    policy = ScriptedDiagramPolicy(seed=0, skill=0.3)
    a = [policy.sample(prompt, random.Random(5)) for _ in range(3)]
    b = [policy.sample(prompt, random.Random(5)) for _ in range(3)]
    assert a == b


def group_stds(records: list[dict]) -> dict[str, list[float]]:
    stds: dict[str, list[float]] = {}
    for record in records:
        names = record["rollouts"][0]["rewards"]
        for name in names:
            values = [r["rewards"][name]["value"] for r in record["rollouts"]]
            stds.setdefault(name, []).append(statistics.pstdev(values))
    return stds


def test_it_produces_groups_with_and_without_variance(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=0, skill=0.6)
    records = generate_groups(env, policy, steps=4, groups_per_step=8, G=8, seed=0)
    stds = group_stds(records)
    # Some component varies in most groups (a gradient exists) ...
    varying = [any(stds[n][i] > 0 for n in stds) for i in range(len(records))]
    assert sum(varying) > len(records) * 0.7
    # ... yet json_valid is saturated (all equal) in some groups: what the app must detect.
    assert 0 < sum(s == 0 for s in stds["json_valid"]) < len(records)


def test_it_improves_rewards_as_skill_rises(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=0, skill=0.0)
    records = generate_groups(
        env,
        policy,
        steps=6,
        groups_per_step=8,
        G=8,
        seed=1,
        skill_schedule=linear_schedule(0.0, 1.0, 6),
    )

    def mean_at(step: int) -> float:
        return statistics.mean(
            r["rewards"]["semantic_coverage"]["value"]
            for rec in records
            if rec["step"] == step
            for r in rec["rollouts"]
        )

    assert mean_at(0) < 0.8 < mean_at(5) == 1.0
    assert policy.skill == 1.0


def test_it_writes_ingestion_records_as_strict_json(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=0, skill=0.2)
    records = generate_groups(
        env, policy, steps=2, groups_per_step=3, G=4, seed=2, holdout_groups=2
    )
    assert len(records) == 2 * (3 + 2)
    assert [r["split"] for r in records[:5]] == ["train"] * 3 + ["holdout"] * 2
    text = json.dumps(records, allow_nan=False)  # raises on any NaN
    record = json.loads(text)[0]
    assert set(record) == {"step", "key", "prompt", "split", "rollouts"}
    rollout = record["rollouts"][0]
    assert set(rollout) == {"index", "completion", "rewards", "length", "truncated", "state"}
    assert set(rollout["rewards"]) == {
        "json_valid",
        "schema_valid",
        "semantic_coverage",
        "layout_quality",
    }
    assert rollout["length"] == len(rollout["completion"].split()) and rollout["truncated"] is False
    assert rollout["state"]["svg"].startswith("<svg")
    assert (
        generate_groups(env, ScriptedDiagramPolicy(0, 0.2), 2, 3, 4, 2, holdout_groups=2) == records
    )


def test_it_replaces_nan_with_none_in_records(env: DiagramEnvironment) -> None:
    class NoSpecEnv(DiagramEnvironment):
        def prompts(self, split, n, seed=0):  # type: ignore[override]
            return [
                Prompt(key=f"k{i}", text="t", split=split, spec={"nodes": []}) for i in range(n)
            ]

    class Echo:
        skill = 1.0

        def sample(self, prompt: Prompt, rng: random.Random | None = None) -> str:
            return "[]"

    records = generate_groups(NoSpecEnv(), Echo(), steps=1, groups_per_step=1, G=2, seed=0)
    assert records[0]["rollouts"][0]["rewards"]["semantic_coverage"]["value"] is None


def test_it_scores_thousands_of_completions_per_second(env: DiagramEnvironment) -> None:
    policy = ScriptedDiagramPolicy(seed=0, skill=0.3)
    pairs = [(p, policy.sample(p)) for p in env.prompts("train", 250) for _ in range(8)]
    start = time.perf_counter()
    for prompt, completion in pairs:
        env.score(prompt, completion)
    rate = len(pairs) / (time.perf_counter() - start)
    assert rate > 1000, f"{rate:.0f} completions/s"


def test_it_builds_solutions_inside_the_canvas_for_the_largest_prompts(
    env: DiagramEnvironment,
) -> None:
    prompts = env.prompts("train", 300)
    largest = max(prompts, key=lambda p: len(p.spec["nodes"]))
    actions = solve_actions(largest)
    assert len(largest.spec["nodes"]) >= 7
    assert all(
        a["x"] >= 0 and a["x"] + a["w"] <= 800 and a["y"] + a["h"] <= 600
        for a in actions
        if a["action"] == "create_shape"
    )

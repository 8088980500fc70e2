"""Versioned reward components: registration, parameter checks, fail-closed scoring."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from training import reward_versions as rv
from training.environments import diagram
from training.environments.base import Prompt, Score

PROMPT = diagram.make_prompt(
    "diagram-pipeline-000001",
    "pipeline",
    "a CI pipeline",
    ["Build", "Test", "Deploy"],
    [["Build", "Test"], ["Test", "Deploy"]],
)


def _answer(nodes: list[str], edges: list[tuple[str, str]]) -> str:
    acts = [
        {
            "action": "create_shape",
            "id": n,
            "label": n,
            "shape": "rect",
            "x": 10,
            "y": 10 + 80 * i,
            "w": 100,
            "h": 50,
        }
        for i, n in enumerate(nodes)
    ]
    acts += [{"action": "connect", "from": a, "to": b} for a, b in edges]
    return json.dumps(acts)


def test_it_registers_every_builtin_component_with_its_source_hash():
    versions = {v.label: v for v in rv.registered("diagram")}
    for comp in diagram.COMPONENTS:
        assert versions[comp.name].source_hash == comp.source_hash()
        assert (
            versions[comp.name].target
            == f"training.environments.diagram.rewards:{comp.fn.__name__}"
        )
    assert versions["semantic_coverage@strict"].params == {"min_coverage": 0.8}
    assert {v.component for v in rv.registered("ask_to_code")} == {
        "correctness",
        "asked_before_coding",
        "guessing_penalty",
        "loop_penalty",
    }


def test_it_scores_the_strict_variant_lower_only_below_its_threshold():
    strict = rv.lookup("diagram", "semantic_coverage@strict")
    fn = rv.resolve(strict.target)
    full = _answer(["Build", "Test", "Deploy"], [("Build", "Test"), ("Test", "Deploy")])
    partial = _answer(["Build", "Test", "Deploy"], [("Build", "Test")])
    assert rv.score_one(fn, strict.params, PROMPT, full) == rv.Scored(
        1.0, "3/3 nodes, 2/2 edges", True
    )
    before = diagram.semantic_coverage(PROMPT, partial).value
    after = rv.score_one(fn, strict.params, PROMPT, partial)
    assert (
        before == pytest.approx(0.75)
        and after.value == 0.0
        and "below the 0.8 threshold" in after.reason
    )


@pytest.mark.parametrize(
    "target, field, words",
    [
        ("no_such_module_xyz:f", "target", "does not import"),
        ("training.environments.diagram:nope", "target", "has no attribute"),
        ("training.environments.diagram", "target", "module:function"),
        ("training.environments.diagram:CANVAS_W", "target", "not callable"),
    ],
)
def test_it_refuses_a_target_that_does_not_resolve(target, field, words):
    with pytest.raises(rv.VersionError) as e:
        rv.make_version("diagram", "semantic_coverage", target)
    assert e.value.field == field and words in e.value.message


@pytest.mark.parametrize(
    "params, field",
    [
        ({"threshold": 1}, "params.threshold"),
        ({"prompt": 1}, "params.prompt"),
        ({"min_coverage": math.nan}, "params"),
        ([0.8], "params"),
    ],
)
def test_it_refuses_params_the_function_does_not_take(params, field):
    with pytest.raises(rv.VersionError) as e:
        rv.make_version(
            "diagram",
            "semantic_coverage",
            "training.environments.diagram:semantic_coverage",
            params,
        )
    assert e.value.field == field


def test_it_refuses_an_unregistered_version_from_user_input():
    with pytest.raises(rv.VersionError) as e:
        rv.from_spec("diagram", {"version": "os:system"}, "versions[0]")
    assert e.value.field == "versions[0].version" and "not registered" in e.value.message
    v = rv.from_spec("diagram", {"version": "semantic_coverage", "params": {"min_coverage": 0.5}})
    assert v.params == {"min_coverage": 0.5} and v.name == "semantic_coverage+params"


def _raises(prompt, completion):
    raise RuntimeError("boom")


def _text(prompt, completion):
    return "high"


def _nan(prompt, completion):
    return Score(math.nan, "no nodes")


def _slow(prompt, completion):
    while True:  # an infinite loop, not a sleep: the deadline must interrupt pure Python too
        pass


def _catches_everything(prompt, completion):
    try:
        while True:
            pass
    except Exception:
        return 1.0


@pytest.mark.parametrize(
    "fn, words",
    [
        (_raises, "raised RuntimeError: boom"),
        (_text, "returned str, not a number"),
        (_nan, "returned nan (no nodes)"),
        (_slow, "longer than 0.2 s"),
        (_catches_everything, "longer than 0.2 s"),
        (lambda p, c: True, "returned bool"),
        (lambda p, c: (math.inf, "x"), "returned inf"),
    ],
)
def test_it_fails_closed_with_a_reason(fn, words):
    out = rv.score_one(fn, {}, PROMPT, "[]", timeout_s=0.2)
    assert out.ok is False and out.value is None and words in out.reason


def test_it_accepts_numbers_pairs_and_scores():
    assert rv.score_one(lambda p, c: 1, {}, PROMPT, "") == rv.Scored(1.0, "", True)
    assert rv.score_one(lambda p, c: (0.5, "half"), {}, PROMPT, "") == rv.Scored(0.5, "half", True)


def test_it_registers_a_users_own_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent("""
        from training import reward_versions

        def brevity(prompt, completion, *, max_chars=100):
            return 1.0 if len(completion) <= max_chars else 0.0

        reward_versions.register(
            "diagram", "layout_quality", "my_rewards_mod:brevity", {"max_chars": 10},
            name="layout_quality@brevity",
        )
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        rv.load("my_rewards_mod")
        v = rv.lookup("diagram", "layout_quality@brevity")
        assert (
            v.component == "layout_quality"
            and v.params == {"max_chars": 10}
            and len(v.source_hash) == 16
        )
        with pytest.raises(rv.VersionError) as e:
            rv.load("my_missing_rewards_mod")
        assert e.value.field == "RD_REWARD_MODULES"
    finally:
        rv._REGISTRY.pop(("diagram", "layout_quality@brevity"), None)
        sys.modules.pop("my_rewards_mod", None)


def test_it_rebuilds_stored_prompts_of_both_environments():
    env = diagram.DiagramEnvironment()
    for p in env.prompts("train", 30) + env.prompts("holdout", 10):
        assert rv.prompt_for("diagram", p.key, p.text) == p
    assert rv.prompt_for("diagram", "k", "Draw a cat") is None
    ask = rv.prompt_for("ask_to_code", "ask_to_code-round_price-r2", "")
    assert ask is None or isinstance(ask, Prompt)
    from training.environments.ask_to_code import AskToCodeEnv

    p = AskToCodeEnv().prompts("train", 1)[0]
    assert rv.prompt_for("ask_to_code", p.key, p.messages) == p
    assert rv.prompt_for("unknown_env", "k", "") is None


def test_it_keeps_the_deadline_inside_a_shared_handler_and_restores_the_old_one():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with rv.deadlines():
        assert "longer than 0.2 s" in rv.score_one(_slow, {}, PROMPT, "[]", timeout_s=0.2).reason
        assert rv.score_one(lambda p, c: 1.0, {}, PROMPT, "", timeout_s=0.2).ok
    assert signal.getsignal(signal.SIGALRM) is before


def test_it_swaps_a_replayed_version_into_an_environment_for_training():
    env = diagram.DiagramEnvironment()
    strict = rv.lookup("diagram", "semantic_coverage@strict").as_dict()
    partial = _answer(["Build", "Test", "Deploy"], [("Build", "Test")])
    assert env.score(PROMPT, partial)["semantic_coverage"].value == pytest.approx(0.75)
    rv.apply_versions(env, [strict])
    assert env.score(PROMPT, partial)["semantic_coverage"].value == 0.0
    assert [c.weight for c in env.components] == [c.weight for c in diagram.COMPONENTS]
    with pytest.raises(rv.VersionError):
        rv.apply_versions(diagram.DiagramEnvironment(), [{**strict, "source_hash": "0" * 16}])
    with pytest.raises(rv.VersionError):
        rv.apply_versions(diagram.DiagramEnvironment(), [{**strict, "component": "nope"}])


# --------------------------------------------------------------------------------------------------
# "Train with this reward": GRPOJobConfig.reward_versions and the hook in grpo.main


def _grpo_base(tmp_path) -> dict:
    return {"base_model": "tiny", "output_dir": str(tmp_path)}


@pytest.mark.parametrize(
    "versions, field",
    [
        ([{"target": "m:f"}], "reward_versions"),
        ({"semantic_coverage": "m:f"}, "reward_versions.semantic_coverage"),
        ({"semantic_coverage": {"target": "no_colon"}}, "reward_versions.semantic_coverage.target"),
        ({"semantic_coverage": {"target": "m:"}}, "reward_versions.semantic_coverage.target"),
        (
            {"semantic_coverage": {"target": "m:f", "params": [1]}},
            "reward_versions.semantic_coverage.params",
        ),
        (
            {"semantic_coverage": {"target": "m:f", "source_hash": 3}},
            "reward_versions.semantic_coverage.source_hash",
        ),
        (
            {"semantic_coverage": {"target": "m:f", "code": "import os"}},
            "reward_versions.semantic_coverage.code",
        ),
        (
            {"semantic_coverage": {"target": "m:f", "component": "json_valid"}},
            "reward_versions.semantic_coverage.component",
        ),
    ],
)
def test_it_refuses_bad_reward_versions_naming_the_field(tmp_path, versions, field):
    from training.grpo import GRPOJobConfig

    with pytest.raises(ValueError) as e:
        GRPOJobConfig(**_grpo_base(tmp_path), reward_versions=versions)
    assert str(e.value).split(": ")[0] == field


def test_it_round_trips_reward_versions_through_the_config_file(tmp_path):
    from training.grpo import GRPOJobConfig

    strict = rv.lookup("diagram", "semantic_coverage@strict").as_dict()
    cfg = GRPOJobConfig(**_grpo_base(tmp_path), reward_versions={"semantic_coverage": strict})
    path = cfg.save(tmp_path)
    data = json.loads(path.read_text())
    assert GRPOJobConfig.from_dict(data).reward_versions == {"semantic_coverage": strict}
    assert GRPOJobConfig(**_grpo_base(tmp_path)).reward_versions is None


MARKER_MODULE = """
def marker(prompt, completion, *, value=0.5):
    return (value, "scored by the replayed marker version")
"""


@pytest.mark.slow
def test_it_trains_grpo_on_the_replayed_version(tiny_model, tmp_path, monkeypatch):
    """Two GRPO steps with semantic_coverage replaced by a version that scores a constant:
    every recorded rollout carries the new version's value and reason; the other components
    are the environment's."""
    from training.grpo import GRPOJobConfig
    from training.grpo import main as grpo
    from training.sinks import MemorySink

    (tmp_path / "replay_marker_mod.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        version = rv.register(
            "diagram",
            "semantic_coverage",
            "replay_marker_mod:marker",
            {"value": 0.625},
            name="semantic_coverage@marker",
        )
        sink = MemorySink()
        summary = grpo(
            GRPOJobConfig(
                base_model=tiny_model,
                output_dir=str(tmp_path / "grpo"),
                # One step is enough: the reward functions are built once, before training
                max_steps=1,
                num_prompts=4,
                num_generations=2,
                per_device_batch_size=4,
                max_completion_length=16,
                reward_versions={"semantic_coverage": version.as_dict()},
            ),
            sink=sink,
        )
    finally:
        rv._REGISTRY.pop(("diagram", "semantic_coverage@marker"), None)
        sys.modules.pop("replay_marker_mod", None)
    assert summary["global_step"] == 1 and sink.groups
    for g in sink.groups:
        for r in g["rollouts"]:
            assert r["rewards"]["semantic_coverage"]["value"] == 0.625
            assert (
                r["rewards"]["semantic_coverage"]["reason"]
                == "scored by the replayed marker version"
            )
            assert r["rewards"]["json_valid"]["reason"] != "scored by the replayed marker version"
    saved = json.loads((tmp_path / "grpo" / "config.json").read_text())
    assert saved["reward_versions"]["semantic_coverage"]["params"] == {"value": 0.625}


def test_it_refuses_to_train_a_version_whose_source_changed(tmp_path):
    from training.grpo import GRPOJobConfig
    from training.grpo import main as grpo

    strict = {**rv.lookup("diagram", "semantic_coverage@strict").as_dict(), "source_hash": "0" * 16}
    cfg = GRPOJobConfig(
        base_model="unused-never-loaded",
        output_dir=str(tmp_path),
        reward_versions={"semantic_coverage": strict},
    )
    with pytest.raises(rv.VersionError) as e:
        grpo(cfg)
    assert e.value.field == "reward_versions.semantic_coverage" and "changed" in e.value.message


def test_it_fails_closed_when_a_trained_version_raises_or_returns_nan(tmp_path, monkeypatch):
    """The swapped function is what the trainer calls: a raise or a NaN scores the component's
    minimum with the reason instead of raising into TRL or handing it NaN."""
    (tmp_path / "bad_versions_mod.py").write_text(
        textwrap.dedent("""
        def boom(prompt, completion):
            raise RuntimeError("verifier down")

        def nan(prompt, completion):
            return float("nan")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        versions = [
            rv.register(
                "diagram", "semantic_coverage", "bad_versions_mod:boom", name="cov@boom"
            ).as_dict(),
            rv.register(
                "diagram", "layout_quality", "bad_versions_mod:nan", name="layout@nan"
            ).as_dict(),
        ]
        env, again = (rv.apply_versions(diagram.DiagramEnvironment(), versions) for _ in range(2))
        scores = env.score(PROMPT, _answer(["Build"], []))
    finally:
        rv._REGISTRY.pop(("diagram", "cov@boom"), None)
        rv._REGISTRY.pop(("diagram", "layout@nan"), None)
        sys.modules.pop("bad_versions_mod", None)
    cov, layout = scores["semantic_coverage"], scores["layout_quality"]
    assert cov.value == 0.0 and "RuntimeError: verifier down" in cov.reason
    assert layout.value == 0.0 and "nan" in layout.reason and math.isfinite(layout.value)
    hashes = {c.name: c.source_hash() for c in env.components}
    assert hashes == {
        c.name: c.source_hash() for c in again.components
    }  # stable: no memory address in it
    assert hashes["semantic_coverage"] != diagram.DiagramEnvironment().components[2].source_hash()


@pytest.mark.parametrize(
    "change, field, words",
    [
        (
            {"target": "os:getcwd", "source_hash": ""},
            "reward_versions.semantic_coverage",
            "not a registered version",
        ),
        (
            {"target": "training.environments.diagram:json_valid"},
            "reward_versions.semantic_coverage",
            "not a registered version",
        ),  # registered, but for another component
        (
            {"params": {"min_coverage": "high"}},
            "reward_versions.semantic_coverage.params.min_coverage",
            "float",
        ),
        (
            {"params": {"shell": "rm -rf /"}},
            "reward_versions.semantic_coverage.params.shell",
            "not a parameter",
        ),
    ],
)
def test_it_trains_only_registered_versions_with_fitting_params(change, field, words):
    """A job config is JSON a trainer can write by hand: it may name only
    deployed, registered code."""
    strict = {**rv.lookup("diagram", "semantic_coverage@strict").as_dict(), **change}
    with pytest.raises(rv.VersionError) as e:
        rv.apply_versions(diagram.DiagramEnvironment(), [strict])
    assert e.value.field == field and words in e.value.message


# Versions stored before each environment became a package name the old module; their source
# hashes are unchanged, so a stored replay still re-scores and trains with the same functions.
OLD_TARGETS = [
    ("diagram", "json_valid", "training.environments.diagram:json_valid", "9e35a60990a155ac"),
    ("diagram", "schema_valid", "training.environments.diagram:schema_valid", "2bef3ae944d0775a"),
    (
        "diagram",
        "semantic_coverage",
        "training.environments.diagram:semantic_coverage",
        "48030eaeeeca25bd",
    ),
    (
        "diagram",
        "layout_quality",
        "training.environments.diagram:layout_quality",
        "2b6b7d6123120ca2",
    ),
    (
        "ask_to_code",
        "correctness",
        "training.environments.ask_to_code:correctness",
        "0ea682e2492f621e",
    ),
    (
        "ask_to_code",
        "asked_before_coding",
        "training.environments.ask_to_code:asked_before_coding",
        "bbe54db99be1c3f5",
    ),
    (
        "ask_to_code",
        "loop_penalty",
        "training.environments.ask_to_code:loop_penalty",
        "3f8ae323104110fd",
    ),
]


@pytest.mark.parametrize("env_name, component, target, source_hash", OLD_TARGETS)
def test_it_resolves_a_target_recorded_under_the_old_module_path(
    env_name, component, target, source_hash
):
    fn = rv.resolve(target)
    current = rv.lookup(env_name, component)
    assert fn is rv.resolve(current.target) and current.target != target
    assert rv.source_hash(fn) == source_hash == current.source_hash
    stored = {"component": component, "target": target, "params": {}, "source_hash": source_hash}
    from training.environments import get_environment

    env = rv.apply_versions(get_environment(env_name), [stored])
    swapped = next(c for c in env.components if c.name == component)
    assert swapped.fn.fn is fn  # a TrainedVersion of the same function


def test_it_resolves_an_old_variant_with_its_params():
    stored = {
        "component": "semantic_coverage",
        "target": "training.environments.diagram:semantic_coverage",
        "params": {"min_coverage": 0.8},
        "source_hash": "48030eaeeeca25bd",
        "name": "semantic_coverage@strict",
    }
    env = rv.apply_versions(diagram.DiagramEnvironment(), [stored])
    partial = _answer(["Build", "Test", "Deploy"], [("Build", "Test")])
    assert env.score(PROMPT, partial)["semantic_coverage"].value == 0.0


def test_it_trusts_an_old_path_only_inside_the_environments_package():
    stored = {"component": "json_valid", "target": "os.path:join", "source_hash": ""}
    with pytest.raises(rv.VersionError, match="not a registered version"):
        rv.apply_versions(diagram.DiagramEnvironment(), [stored])

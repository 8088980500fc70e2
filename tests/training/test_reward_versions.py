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

PROMPT = diagram.make_prompt("diagram-pipeline-000001", "pipeline", "a CI pipeline",
                             ["Build", "Test", "Deploy"], [["Build", "Test"], ["Test", "Deploy"]])


def _answer(nodes: list[str], edges: list[tuple[str, str]]) -> str:
    acts = [{"action": "create_shape", "id": n, "label": n, "shape": "rect", "x": 10, "y": 10 + 80 * i,
             "w": 100, "h": 50} for i, n in enumerate(nodes)]
    acts += [{"action": "connect", "from": a, "to": b} for a, b in edges]
    return json.dumps(acts)


def test_it_registers_every_builtin_component_with_its_source_hash():
    versions = {v.label: v for v in rv.registered("diagram")}
    for comp in diagram.COMPONENTS:
        assert versions[comp.name].source_hash == comp.source_hash()
        assert versions[comp.name].target == f"training.environments.diagram:{comp.fn.__name__}"
    assert versions["semantic_coverage@strict"].params == {"min_coverage": 0.8}
    assert {v.component for v in rv.registered("ask_to_code")} == {"correctness", "asked_before_coding",
                                                                   "guessing_penalty", "loop_penalty"}


def test_it_scores_the_strict_variant_lower_only_below_its_threshold():
    strict = rv.lookup("diagram", "semantic_coverage@strict")
    fn = rv.resolve(strict.target)
    full = _answer(["Build", "Test", "Deploy"], [("Build", "Test"), ("Test", "Deploy")])
    partial = _answer(["Build", "Test", "Deploy"], [("Build", "Test")])
    assert rv.score_one(fn, strict.params, PROMPT, full) == rv.Scored(1.0, "3/3 nodes, 2/2 edges", True)
    before = diagram.semantic_coverage(PROMPT, partial).value
    after = rv.score_one(fn, strict.params, PROMPT, partial)
    assert before == pytest.approx(0.75) and after.value == 0.0 and "below the 0.8 threshold" in after.reason


@pytest.mark.parametrize("target, field, words", [
    ("no_such_module_xyz:f", "target", "does not import"),
    ("training.environments.diagram:nope", "target", "has no attribute"),
    ("training.environments.diagram", "target", "module:function"),
    ("training.environments.diagram:CANVAS_W", "target", "not callable"),
])
def test_it_refuses_a_target_that_does_not_resolve(target, field, words):
    with pytest.raises(rv.VersionError) as e:
        rv.make_version("diagram", "semantic_coverage", target)
    assert e.value.field == field and words in e.value.message


@pytest.mark.parametrize("params, field", [
    ({"threshold": 1}, "params.threshold"),
    ({"prompt": 1}, "params.prompt"),
    ({"min_coverage": math.nan}, "params"),
    ([0.8], "params"),
])
def test_it_refuses_params_the_function_does_not_take(params, field):
    with pytest.raises(rv.VersionError) as e:
        rv.make_version("diagram", "semantic_coverage", "training.environments.diagram:semantic_coverage", params)
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


@pytest.mark.parametrize("fn, words", [
    (_raises, "raised RuntimeError: boom"), (_text, "returned str, not a number"),
    (_nan, "returned nan (no nodes)"), (_slow, "longer than 0.2 s"), (_catches_everything, "longer than 0.2 s"),
    (lambda p, c: True, "returned bool"), (lambda p, c: (math.inf, "x"), "returned inf"),
])
def test_it_fails_closed_with_a_reason(fn, words):
    out = rv.score_one(fn, {}, PROMPT, "[]", timeout_s=0.2)
    assert out.ok is False and out.value is None and words in out.reason


def test_it_accepts_numbers_pairs_and_scores():
    assert rv.score_one(lambda p, c: 1, {}, PROMPT, "") == rv.Scored(1.0, "", True)
    assert rv.score_one(lambda p, c: (0.5, "half"), {}, PROMPT, "") == rv.Scored(0.5, "half", True)


def test_it_registers_a_users_own_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(textwrap.dedent('''
        from training import reward_versions

        def brevity(prompt, completion, *, max_chars=100):
            return 1.0 if len(completion) <= max_chars else 0.0

        reward_versions.register("diagram", "layout_quality", "my_rewards_mod:brevity", {"max_chars": 10},
                                 name="layout_quality@brevity")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        rv.load("my_rewards_mod")
        v = rv.lookup("diagram", "layout_quality@brevity")
        assert v.component == "layout_quality" and v.params == {"max_chars": 10} and len(v.source_hash) == 16
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

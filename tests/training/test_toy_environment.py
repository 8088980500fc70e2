"""A new environment is one package: tests/training/toy_env fills in the base class, is
registered by name, and every generic path works with it without knowing it (prompts, scoring,
demo data, the scripted teacher, reward versions, replay variants and stored prompts)."""

from __future__ import annotations

import pytest

from training import demo
from training import reward_versions as rv
from training.common import env_prompts
from training.environments import available_environments

from .toy_env import ToyEnvironment, registered


@pytest.fixture
def toy():
    with registered() as env:
        yield env


def test_it_is_listed_and_built_by_its_registered_name(toy):
    assert "toy" in available_environments() and isinstance(toy, ToyEnvironment)
    assert not toy.multi_turn and toy.eval_checks(toy.prompts("train", 1)[0], "X") == {}


def test_it_serves_prompts_and_refuses_an_option_it_does_not_declare(toy):
    prompts = env_prompts(toy, "holdout", 3, seed=1)
    assert [p.split for p in prompts] == ["holdout"] * 3
    with pytest.raises(ValueError, match="max_nodes"):
        env_prompts(toy, "train", 3, max_nodes=4)


def test_it_makes_demo_groups_with_its_scripted_policy(toy):
    records = demo.generate_groups(
        toy, toy.scripted_policy(seed=1, skill=0.5), steps=2, groups_per_step=2, G=4, seed=0
    )
    assert len(records) == 4 and {r["step"] for r in records} == {0, 1}
    values = [r["rewards"]["shouted"]["value"] for g in records for r in g["rollouts"]]
    assert set(values) == {0.0, 1.0}  # skill 0.5: some whispered, some shouted
    assert all(set(r["rewards"]) == {"shouted", "brevity"} for g in records for r in g["rollouts"])


def test_it_answers_as_the_scripted_teacher(toy, tmp_path):
    from training.teacher import TeacherJobConfig, main

    out = main(TeacherJobConfig(env="toy", output_dir=str(tmp_path), num_prompts=4))
    assert out["kept"] == 4 and out["rejected"] == 0  # the reference solution scores full marks


def test_it_registers_its_components_and_replays_a_variant(toy):
    labels = {v.label for v in rv.registered("toy")}
    assert labels == {"shouted", "brevity", "shouted@any_case"}
    variant = rv.lookup("toy", "shouted@any_case")
    assert variant.target == "tests.training.toy_env.rewards:shouted"
    prompt = rv.prompt_for("toy", "toy-apple", "Shout: apple")
    assert prompt is not None and prompt.spec == {"word": "apple"}
    fn = rv.resolve(variant.target)
    assert rv.score_one(fn, {}, prompt, "apple").value == 0.0
    assert rv.score_one(fn, variant.params, prompt, "apple") == rv.Scored(1.0, "'apple'", True)
    trained = rv.apply_versions(toy, [{**variant.as_dict()}])
    assert trained.score(prompt, "apple")["shouted"].value == 1.0
    assert rv.prompt_for("toy", "toy-unknown", "Shout: unknown") is None

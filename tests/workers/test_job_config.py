"""A job's reward weights come from the run (Run.reward_weights), in component order."""

from workers.jobs import job_config


def _grpo(env3, personas, config):
    from webapp.rollouts.services import create_run

    return create_run(
        name="g",
        kind="grpo",
        environment=env3,
        config=config,
        owner=personas["trainer"],
        base_model="/models/x",
    )


def test_it_gives_the_trainer_the_runs_weights_in_component_order(env3, personas):
    run = _grpo(env3, personas, {"reward_weights": {"format": 0.0}})
    assert job_config(run).reward_weights == [1.0, 0.0, 0.2]  # correct, format, penalty


def test_it_prefers_the_weights_recorded_on_the_run(env3, personas):
    run = _grpo(env3, personas, {"reward_weights": {"format": 0.0}})
    run.reward_settings = {"weights": {"format": 0.7, "penalty": 0.0}}
    run.save()
    assert job_config(run).reward_weights == [1.0, 0.7, 0.0]


def test_it_keeps_a_list_written_in_the_config(env3, personas):
    run = _grpo(env3, personas, {"reward_weights": [0.1, 0.2, 0.3]})
    assert job_config(run).reward_weights == [0.1, 0.2, 0.3]

"""A replay of model-written code: ask_to_code's correctness re-runs the hidden tests
through the environment's own component, i.e. in training.sandbox (bubblewrap), never in
the worker's process."""

import pytest


@pytest.mark.slow
def test_it_reruns_submitted_code_in_the_sandbox(personas):
    from training.environments import ask_to_code as atc
    from training.environments.ask_to_code import hidden_tests
    from webapp.replays import services
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import RewardScore
    from webapp.rollouts.services import create_run, environment_from_training

    env = atc.AskToCodeEnv()
    records = atc.generate_groups(env, steps=1, groups_per_step=1, G=3, seed=1)
    prompt = atc.stored_prompt(records[0]["key"], records[0]["prompt"])
    spin = [
        *prompt.messages,
        {
            "role": "assistant",
            "content": "```python\ndef f(*a):\n    while True:\n        pass\n```",
        },
    ]
    scores = env.score(prompt, spin)
    records[0]["rollouts"].append(
        {
            "index": 3,
            "transcript": spin,
            "rewards": {k: {"value": s.value, "reason": s.reason} for k, s in scores.items()},
        }
    )
    run = create_run(
        name="atc",
        kind="grpo",
        environment=environment_from_training(env),
        config={},
        status="succeeded",
    )
    ingest_groups(run, {"groups": records})
    atc.clear_cache()  # the replay must run the tests again, not read the scoring process's cache
    calls = []
    real = hidden_tests.run_tests
    hidden_tests.run_tests = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        replay = services.create_replay(run, {"versions": [{"version": "correctness"}]})
        services.work(replay.id, "test")
    finally:
        hidden_tests.run_tests = real
    replay.refresh_from_db()
    assert replay.status == "succeeded" and replay.failed == 0 and len(calls) >= 2
    for s in replay.scores.select_related("rollout"):
        original = RewardScore.objects.get(rollout=s.rollout, component=s.component)
        assert s.value == original.value and s.reason == original.reason
    spun = replay.scores.get(rollout__index=3)
    assert spun.value == 0.0 and "hidden tests passed" in spun.reason

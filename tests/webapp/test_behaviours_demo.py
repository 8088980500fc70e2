"""The demo's behaviour story (seed_demo): the annotator's labelled hacks on the diagram run become
a behaviour through find more like this; on the scripted twin whose policy stops drawing extra
shapes halfway, its rate falls to nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from webapp.behaviours import charts, demo
from webapp.behaviours.models import Behaviour
from webapp.rollouts.models import Rollout
from webapp.runs.management.commands import seed_demo
from webapp.runs.models import Run


@pytest.mark.slow
def test_it_turns_the_labelled_hacks_into_a_behaviour_that_falls_on_the_twin(db):
    out = io.StringIO()
    call_command("seed_demo", steps=12, groups_per_step=6, G=8, stdout=out)
    run = Run.objects.get(name=seed_demo.RUN_NAME)
    b = Behaviour.objects.get(name=demo.BEHAVIOUR_NAME, environment=run.environment)
    assert f"/behaviours/{b.id}/" in out.getvalue()
    hacks = Rollout.objects.filter(run=run, annotations__label__slug="reward-hacking").distinct()
    on_run = charts.run_document(b, run)
    assert sum(on_run["matches"]) >= 0.8 * hacks.count() > 0
    twin = Run.objects.get(name=demo.TWIN_NAME)
    on_twin = charts.run_document(b, twin)
    assert on_twin["matches"][-3:] == [0, 0, 0] and sum(on_twin["matches"][:6]) > 0
    assert any(f["code"] == "behaviour_fading" for f in on_twin["findings"])
    call_command("seed_demo", steps=12, groups_per_step=6, G=8, stdout=io.StringIO())
    assert Behaviour.objects.filter(name=demo.BEHAVIOUR_NAME).count() == 1
    assert Run.objects.filter(name=demo.TWIN_NAME).count() == 1

"""A run marked deleted (webapp/runs/deletion.py) is gone from every page at once, including the
pages merged beside deletion: a behaviour's runs, the compare page, the launch form's default base
model (an SFT run whose output folder the deletion removes)."""

from __future__ import annotations

import pytest

from tests.conftest import make_group
from webapp.behaviours import services
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.services import create_run
from webapp.runs.base_models import latest_sft_output
from webapp.runs.deletion import request_delete


@pytest.fixture
def doomed(run, personas):
    twin = create_run(
        name="doomed-run",
        kind="import",
        environment=run.environment,
        config={},
        owner=personas["trainer"],
        status="running",
    )
    for r in (run, twin):
        ingest_groups(r, {"groups": [make_group(0, "p", [{"correct": 1}, {"correct": 0}])]})
    return twin


def test_a_behaviour_leaves_a_deleted_run_out(client_as, run, doomed):
    b = services.define(run.environment, name="answers", query={"q": "anything"})
    c = client_as("viewer")
    assert "doomed-run" in c.get(f"/behaviours/{b.id}/").content.decode()
    assert request_delete(doomed)
    page = c.get(f"/behaviours/{b.id}/").content.decode()
    assert "toy-run" in page and "doomed-run" not in page


def test_the_compare_page_leaves_a_deleted_run_out(client_as, run, doomed):
    assert request_delete(doomed)
    page = client_as("viewer").get(f"/jobs/compare/?run={run.id}&run={doomed.id}")
    assert page.status_code == 200 and "doomed-run" not in page.content.decode()


def test_a_deleted_sft_run_is_no_default_base_model(env3, personas):
    sft = create_run(
        name="sft",
        kind="sft",
        environment=env3,
        config={},
        owner=personas["trainer"],
        status="succeeded",
    )
    assert latest_sft_output(env3.name) == sft
    assert request_delete(sft)
    assert latest_sft_output(env3.name) is None


def test_a_review_queue_cannot_be_made_from_a_deleted_run(doomed):
    from webapp.annotations.forms import QueueForm

    assert request_delete(doomed)
    form = QueueForm({"name": "q", "run": doomed.id, "source": "random"})
    assert not form.is_valid() and "run" in form.errors

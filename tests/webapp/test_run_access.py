"""get_run_for: the one permission check of run-scoped views (the permission matrix
covers every URL)."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.test import RequestFactory

from webapp.accounts.roles import set_role
from webapp.runs.access import get_run_for


def request_as(user):
    request = RequestFactory().get("/")
    request.user = user
    return request


def test_it_checks_the_role_before_looking_the_run_up(run, personas):
    with pytest.raises(PermissionDenied, match="needs the trainer role"):
        get_run_for(
            request_as(personas["viewer"]), 10**9, "trainer"
        )  # not a 404: nothing is revealed
    with pytest.raises(Http404):
        get_run_for(request_as(personas["trainer"]), 10**9, "trainer")
    assert get_run_for(request_as(personas["viewer"]), run.id) == run


def test_it_lets_an_annotator_owner_write_to_their_own_run_only(run, personas):
    owner, other = personas["annotator"], personas["viewer"]
    run.owner = owner
    run.save(update_fields=["owner"])
    assert get_run_for(request_as(owner), run.id, "trainer", owner_may=True) == run
    with pytest.raises(PermissionDenied, match="needs the trainer role"):
        get_run_for(request_as(owner), run.id, "trainer")  # pages: the role alone
    with pytest.raises(PermissionDenied, match="ownership of the run"):
        get_run_for(request_as(other), run.id, "trainer", owner_may=True)
    set_role(owner, "viewer")  # demoted: owning the run no longer lets them write
    with pytest.raises(PermissionDenied, match="ownership of the run"):
        get_run_for(request_as(owner), run.id, "trainer", owner_may=True)

"""The one permission check every run-scoped view starts with, page or API: `get_run_for`."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from webapp.accounts.roles import has_role
from webapp.runs.models import Run


def get_run_for(
    request: HttpRequest,
    run_id: int,
    role: str = "viewer",
    *,
    owner_may: bool = False,
    related: tuple[str, ...] = ("environment",),
    fields: tuple[str, ...] = (),
) -> Run:
    """The run `run_id` for a request that may act on it with `role`: PermissionDenied (a 403, as
    JSON under the API) when the user lacks the role, before the run is looked up; Http404 when it
    does not exist. `owner_may`: the run's owner may also act with the annotator role (the API's
    write rule: a script feeding its own run); a viewer changes nothing, owner or not. Roles are
    read per request, so a demotion takes effect on the next one. `fields`: load only these
    (a hot read path that needs neither the run's JSON nor its log); () loads them all."""
    runs = (
        Run.objects.select_related(*related) if related else Run.objects.all()
    ).live()  # (): no join at all; a run marked deleted is gone for every page and the API
    if fields:
        runs = runs.only(*fields)
    if has_role(request.user, role):
        return get_object_or_404(runs, id=run_id)
    if not owner_may:
        raise PermissionDenied(f"this action needs the {role} role")
    run = get_object_or_404(runs, id=run_id)
    if run.owner_id == request.user.id and has_role(request.user, "annotator"):
        return run
    raise PermissionDenied(f"this needs the {role} role or ownership of the run")

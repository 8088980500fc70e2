"""Links into the pages other apps own: the explorer sorted by a component, and the group view."""

from __future__ import annotations

from urllib.parse import urlencode

from django.urls import reverse


def explorer_url(
    run_id: int, sort: str | None = None, order: str = "desc", step_min: int | None = None
) -> str:
    base = reverse("rollouts-explorer", kwargs={"run_id": run_id})
    params = {"sort": sort, "order": order} if sort else {}
    if step_min is not None:
        params["step_min"] = int(step_min)
    return f"{base}?{urlencode(params)}" if params else base


def group_url(group_id: int) -> str:
    return reverse("rollouts-group", kwargs={"group_id": group_id})


def with_links(run_id: int, findings: list[dict]) -> list[dict]:
    """Findings (JSON, possibly cached) with the explorer link of their example transcripts: from
    the step the finding holds from (its onset) on, when it has one."""
    return [
        {
            **f,
            "link": explorer_url(
                run_id, f.get("sort"), f.get("order") or "desc", f.get("onset_step")
            ),
        }
        for f in findings
    ]

"""Every URL pattern x every persona, for GET and POST, against an explicit expectation table.

The URL list comes from the resolver itself, so a new view without an entry in EXPECTED fails the
test until someone classifies it. Int path parameters are filled with ids of real objects (a run
with groups and rollouts, an annotation, a review queue, a dataset, an ablation). Each POST runs
inside a savepoint that is rolled back, so cells are independent (a delete by one role leaves the
object for the next). A viewer's POSTs must all be 403/405 with every table's row count unchanged.

The matrix is printed (pytest -s) and written to test-artifacts/permissions_matrix.txt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.conftest import make_group

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
RANK = {"viewer": 0, "annotator": 1, "trainer": 2, "admin": 3}
PUBLIC, NONE, OWNER = "public", None, "owner"  # OWNER: trainer role or the run's owner (API writes)

# url name -> (minimum role for GET, minimum role for POST). NONE: the method is refused (405).
EXPECTED: dict[str, tuple[str | None, str | None]] = {
    "healthz": (PUBLIC, NONE),
    "accounts-login": (PUBLIC, PUBLIC),
    "accounts-logout": (NONE, "login"),  # POST logs out and redirects to the login page, for anyone
    "api-schema": ("viewer", NONE),
    "api-runs": ("viewer", "trainer"),
    "api-run-groups": ("viewer", OWNER),
    "api-run-metrics": (NONE, OWNER),
    "api-run-rollouts": ("viewer", NONE),
    "api-run-finish": (NONE, OWNER),
    "api-run-settings": (NONE, OWNER),
    "api-run-ablations": ("viewer", "trainer"),
    "api-run-diagnostics": ("viewer", NONE),
    "api-ablation": ("viewer", NONE),
    "rollouts-transcript": ("viewer", NONE),
    "diagnostics-run": ("viewer", NONE),
    "diagnostics-ablations": ("viewer", NONE),
    "diagnostics-ablation-save": (NONE, "trainer"),
    "diagnostics-ablation-compare": ("viewer", NONE),
    "diagnostics-overlay": ("viewer", NONE),
    "diagnostics-ablation": ("viewer", NONE),
    "diagnostics-ablation-launch": (NONE, "trainer"),
    "annotations-home": ("viewer", NONE),
    "annotations-rollout": ("viewer", NONE),
    "annotations-slot": ("viewer", NONE),
    "annotations-annotate": (NONE, "annotator"),
    "annotations-delete": (
        NONE,
        "annotator",
    ),  # and only the author (the annotator persona) or an admin
    "annotations-queue-new": ("trainer", "trainer"),
    "annotations-queue": ("viewer", NONE),
    "annotations-queue-assign": (NONE, "trainer"),
    "annotations-agreement": ("viewer", NONE),
    "annotations-focus-next": ("annotator", NONE),
    "annotations-focus": ("annotator", NONE),
    "annotations-focus-save": (NONE, "annotator"),
    "annotations-focus-skip": (NONE, "annotator"),
    "annotations-labels": ("viewer", NONE),
    "annotations-label-new": ("admin", "admin"),
    "annotations-label-edit": ("admin", "admin"),
    "annotations-activity": ("admin", NONE),
    "annotations-datasets": ("viewer", NONE),
    "annotations-export": (NONE, "trainer"),
    "annotations-dataset": ("viewer", NONE),
    "annotations-dataset-download": ("viewer", NONE),
    "annotations-dataset-launch": (NONE, "trainer"),
    "jobs-launch": ("trainer", "trainer"),
    "jobs-compare": ("viewer", NONE),
    "jobs-workers": ("viewer", NONE),
    "jobs-detail": ("viewer", NONE),
    "jobs-progress": ("viewer", NONE),
    "jobs-cancel": (NONE, "trainer"),
    "runs-list": ("viewer", NONE),
    "runs-dashboard": ("viewer", NONE),
    "runs-live": ("viewer", NONE),
    "rollouts-explorer": ("viewer", NONE),
    "rollouts-no-signal": ("viewer", NONE),
    "rollouts-group": ("viewer", NONE),
    "replays-run": ("viewer", "trainer"),
    "replays-detail": ("viewer", NONE),
    "replays-progress": ("viewer", NONE),
    "replays-cancel": (NONE, "trainer"),
    "replays-train": (NONE, "trainer"),
    "replays-resume": (NONE, "trainer"),
    "api-run-replays": ("viewer", "trainer"),
    "api-replay": ("viewer", NONE),
    "api-replay-regress": ("viewer", NONE),
    "api-replay-train": (NONE, "trainer"),
    "behaviours-list": ("viewer", NONE),
    "behaviours-detail": ("viewer", NONE),
    "behaviours-limit": (NONE, "annotator"),
    "behaviours-panel": ("viewer", NONE),
    "behaviours-series": ("viewer", NONE),
    "behaviours-new": ("annotator", "annotator"),
    "behaviours-like": ("viewer", NONE),
    "behaviours-replay": ("viewer", NONE),
    "api-behaviours": ("viewer", "annotator"),
    "api-behaviour": ("viewer", NONE),
    "api-behaviour-run": ("viewer", NONE),
    "api-behaviour-overlay": ("viewer", NONE),
    "api-replay-behaviours": ("viewer", NONE),
    "api-behaviours-propose": (NONE, "annotator"),
    "rollouts-tokens": ("viewer", NONE),
    "api-rollout-tokens": ("viewer", NONE),
    "api-run-token-stats": ("viewer", NONE),
}
# Cells that differ from the role ladder on purpose.
OVERRIDES = {
    ("annotations-delete", "POST", "trainer"): "403"
}  # only the author or an admin deletes
OPEN_NAMES = {"healthz"}  # outside the login wall: a refused method is a 405 even for anonymous
# Views whose POST changes only the caller's own session (logging in or out), not shared state.
SESSION_ONLY = {"accounts-login", "accounts-logout"}
PERSONAS = (
    "anonymous",
    "viewer",
    "annotator",
    "trainer",
    "admin",
    "token",
)  # token: annotator, not the owner


def url_patterns() -> list[tuple[str, str]]:
    """(name, route) of every named pattern, admin and static excluded."""
    out: list[tuple[str, str]] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                if route.startswith("admin/"):
                    continue
                walk(p.url_patterns, route)
            elif (
                isinstance(p, URLPattern) and p.name and not route.startswith(("static", "admin/"))
            ):
                out.append((p.name, route))

    walk(get_resolver().url_patterns, "")
    return out


@pytest.fixture
def world(run, personas, make_user):
    from rest_framework.authtoken.models import Token

    from webapp.annotations import services
    from webapp.annotations.models import Dataset, Label
    from webapp.diagnostics.models import Ablation
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Group, Rollout

    ingest_groups(
        run,
        {
            "groups": [
                make_group(0, "p0", [{"correct": 1.0}, {"correct": 0.0}]),
                make_group(1, "p1", [{"correct": 0.5}, {"correct": 0.0}]),
            ]
        },
    )
    rollout = Rollout.objects.filter(run=run).order_by("id").first()
    import numpy as np

    from webapp.tokens import codec
    from webapp.tokens.models import RolloutTokens

    arrays = codec.TokenArrays(ids=np.arange(3), sampler_logprobs=np.array([-0.1, -0.2, -0.3]))
    RolloutTokens.objects.create(
        rollout=rollout,
        run=run,
        step=rollout.step,
        n_tokens=3,
        fields="ids,sampler_logprobs",
        data=codec.encode(arrays),
    )
    label = Label.objects.create(slug="hack", name="Reward hack")
    annotation, _ = services.save_annotation(rollout, personas["annotator"], label=label, note="n")
    queue = services.create_queue(
        name="q",
        run=run,
        source="explorer",
        params={},
        limit=10,
        seed=0,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[personas["annotator"]],
    )
    dataset = Dataset.objects.create(
        name="d",
        kind="sft",
        version=1,
        created_by=personas["trainer"],
        source={"type": "run", "run_id": run.id},
    )
    ablation = Ablation.objects.create(
        run=run,
        name="drop format",
        spec={
            "drop": ["format"],
            "weights": {},
            "scale_rewards": "group",
            "aggregation": "sum_then_normalize",
        },
        results={},
        created_by=personas["trainer"],
    )
    from webapp.replays import results as replays
    from webapp.replays.models import Replay

    replay = Replay.objects.create(run=run, name="r", versions=[], status="succeeded")
    Replay.objects.filter(id=replay.id).update(
        results=replays.pack_results(replays.compute_results(replay))
    )
    from webapp.behaviours.services import define

    behaviour = define(run.environment, name="answers", query={"q": "answer"})
    outsider = make_user("outsider", "annotator")
    token = Token.objects.create(user=outsider)
    return {
        "run_id": run.id,
        "other_id": run.id,
        "group_id": Group.objects.filter(run=run).first().id,
        "rollout_id": rollout.id,
        "annotation_id": annotation.id,
        "queue_id": queue.id,
        "position": queue.items.order_by("position").first().position,
        "label_id": label.id,
        "dataset_id": dataset.id,
        "ablation_id": ablation.id,
        "kind": "grpo",
        "token": token.key,
        "replay_id": replay.id,
        "behaviour_id": behaviour.id,
    }


def fill(name: str, world: dict[str, Any]) -> str:
    from django.urls import get_resolver

    pattern = next(p for p in get_resolver().reverse_dict.getlist(name))
    params = pattern[0][0][1]
    return reverse(name, kwargs={k: world[k] for k in params})


def classify(res: Any) -> str:
    code = res.status_code
    if code == 401:
        return "login"
    if code in (301, 302, 303, 307, 308):
        return "login" if res["Location"].startswith(reverse("accounts-login")) else "ok"
    if code in (403, 405, 404, 429):
        return str(code)
    if code < 300 or code == 400:  # 400: allowed through, the (empty) input was refused
        return "ok"
    return str(code)


def expected(name: str, method: str, persona: str, need: str | None) -> str:
    if (name, method, persona) in OVERRIDES:
        return OVERRIDES[(name, method, persona)]
    if need == PUBLIC:
        return "ok"
    if need == "login":
        return "login"
    if persona == "anonymous" and need is None and name in OPEN_NAMES:
        return "405"
    if persona == "anonymous":
        return "login"
    if need is None:
        return "405"
    role = "annotator" if persona == "token" else persona
    need = "trainer" if need == OWNER else need  # the run's owner is the trainer persona
    return "ok" if RANK[role] >= RANK[need] else "403"


def row_counts() -> dict[str, int]:
    return {
        m._meta.label: m.objects.count()
        for m in apps.get_models()
        if m._meta.label != "sessions.Session"
    }


class _Rollback(Exception):
    pass


def request(client: Any, method: str, url: str, is_api: bool) -> Any:
    if method == "GET":
        return client.get(url)
    result = {}
    try:
        with transaction.atomic():
            if is_api:
                result["res"] = client.post(url, data=b"{}", content_type="application/json")
            else:
                result["res"] = client.post(url, {})
            raise _Rollback
    except _Rollback:
        pass
    return result["res"]


def test_it_enforces_the_permission_matrix_on_every_url(client, personas, world, capsys):
    from rest_framework.test import APIClient

    patterns = url_patterns()
    unknown = sorted({name for name, _ in patterns} - set(EXPECTED))
    assert not unknown, f"unclassified URL names (add them to EXPECTED): {unknown}"
    lines, mismatches = [], []
    header = f"{'url name':<32} {'method':<6} {'needs':<10} " + " ".join(
        f"{p:<10}" for p in PERSONAS
    )
    lines.append(header)
    lines.append("-" * len(header))
    viewer_posts = 0
    for name, _route in sorted(patterns):
        url = fill(name, world)
        is_api = url.startswith("/api/")
        for method, need in zip(("GET", "POST"), EXPECTED[name], strict=True):
            cells = []
            for persona in PERSONAS:
                if persona == "token" and not is_api:
                    cells.append("-")
                    continue
                if persona == "token":
                    c = APIClient()
                    c.credentials(HTTP_AUTHORIZATION=f"Token {world['token']}")
                else:
                    c = client
                    c.logout()
                    if persona != "anonymous":
                        c.force_login(personas[persona])
                before = row_counts() if persona == "viewer" and method == "POST" else None
                got = classify(request(c, method, url, is_api))
                if before is not None:
                    viewer_posts += 1
                    assert row_counts() == before, f"viewer POST {url} changed the database"
                    if name not in SESSION_ONLY and got not in ("403", "405"):
                        mismatches.append(f"viewer POST {url}: {got}, must be 403 or 405")
                want = expected(name, method, persona, need)
                mark = "" if got == want else "!"
                if mark:
                    mismatches.append(
                        f"{persona} {method} {url} ({name}): got {got}, expected {want}"
                    )
                cells.append(got + mark)
            lines.append(
                f"{name:<32} {method:<6} {str(need):<10} " + " ".join(f"{c:<10}" for c in cells)
            )
    text = "\n".join(lines)
    out = ROOT / "test-artifacts" / "permissions_matrix.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        text + "\n\nlegend: ok = 2xx, 3xx not to login, or 400 (allowed, empty input refused); "
        "login = redirect to login / 401; ! = differs from EXPECTED\n"
    )
    with capsys.disabled():
        print("\n" + text)
    assert viewer_posts == len(patterns)
    assert not mismatches, "\n".join(mismatches)

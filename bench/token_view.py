"""The token view of a 32,000-token rollout, as the transcript page's panel fetches it, and that
rollout's transcript page (panel closed: the page only counts the tokens) against the page of a twin
rollout with the same text and no tokens, in one run.

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench_token_view
    .venv/bin/python bench/token_view.py

(a) GET /rollouts/<id>/tokens.json (decode, text per token, colour ranges, five strip charts,
    orjson), median of 20 (target < 200 ms);
(b) GET /rollouts/<id>/ with tokens / without (target: ratio ~1, the page never reads the arrays).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.records import GroupRecord, RolloutRecord  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

REPEATS = 20


def timed(client, url: str, repeats: int = REPEATS) -> list[float]:
    client.get(url)  # warm
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = client.get(url)
        out.append(time.perf_counter() - t0)
        assert res.status_code == 200, (url, res.status_code)
    return out


def twin_without_tokens(rollout_id: int) -> int:
    from bench.tokens import new_run
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Rollout

    r = Rollout.objects.get(id=rollout_id)
    run = new_run(f"bench-tokens-twin-view-{time.time()}")
    twin = RolloutRecord(index=0, completion=r.completion, rewards={})
    g = GroupRecord(step=0, key="big", prompt="p", rollouts=[twin])
    ingest_groups(run, {"groups": [g.to_json()]})
    return Rollout.objects.get(run=run).id


def main(argv: list[str] | None = None) -> None:
    import argparse

    import django

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from bench.harness import load_average
    from bench.tokens import big_rollout
    from webapp.accounts.roles import set_role

    if connection.vendor != "postgresql":
        sys.exit("bench/token_view.py measures Postgres: set DATABASE_URL=postgres://...")
    call_command("migrate", verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username="bench-token-view")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)
    print(f"load {load_average()}")
    rid = big_rollout(user)
    twin = twin_without_tokens(rid)
    view = timed(client, f"/rollouts/{rid}/tokens.json")
    size = len(client.get(f"/rollouts/{rid}/tokens.json").content)
    # Alternating, so that a change in the machine's load hits both alike.
    with_tokens, without = [], []
    for _ in range(REPEATS):
        with_tokens += timed(client, f"/rollouts/{rid}/", 1)
        without += timed(client, f"/rollouts/{twin}/", 1)
    med = statistics.median
    print(
        f"(a) token view JSON, 32,000 tokens: median {med(view) * 1000:.1f} ms, max "
        f"{max(view) * 1000:.1f} ms, {size / 1e6:.2f} MB (target < 200 ms)"
    )
    print(
        f"(b) transcript page with tokens {med(with_tokens) * 1000:.1f} ms / without "
        f"{med(without) * 1000:.1f} ms: ratio {med(with_tokens) / med(without):.2f}"
    )
    print(f"load average: {load_average()} (2 cores, shared with other work)")
    from webapp.runs.models import Run

    Run.objects.filter(name__startswith="bench-tokens-").delete()


if __name__ == "__main__":
    main()

"""`python manage.py reward_regress RUN --replay ID`: annotated failures as a test suite for
a reward change.

Exit status: 0 when no annotated reward hack outranks its group's median under the replayed reward,
1 when one does (each is listed), 2 for bad input (unknown run or replay, a replay of another run,
or one that has not finished).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from webapp.errors import FieldError
from webapp.replays import results
from webapp.replays.models import Replay


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


class Command(BaseCommand):
    help = (
        "Exit non-zero when an annotated reward hack still outranks its group's median under a "
        "replay's reward."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", type=int, help="run id")
        parser.add_argument("--replay", type=int, required=True, help="replay id (of that run)")

    def handle(self, *args: Any, **opts: Any) -> None:
        replay = Replay.objects.select_related("run").filter(id=opts["replay"]).first()
        if replay is None:
            raise CommandError(f"replay: no replay {opts['replay']}", returncode=2)
        if replay.run_id != opts["run"]:
            raise CommandError(
                f"replay: replay {replay.id} replays run {replay.run_id}, not {opts['run']}",
                returncode=2,
            )
        try:
            result = results.regress(replay)
        except FieldError as e:
            raise CommandError(f"{e.field}: {e.message}", returncode=2) from None
        h = result.headline
        self.stdout.write(f"replay {replay.id} ({replay.name}): {replay.summary}")
        self.stdout.write(
            f"reward hacks still ranked best in their group: {h['hacks_still_best']} of "
            f"{h['hacks']}; above their group's median: {h['hacks_above_median']} of {h['hacks']}"
        )
        for r in result.rows:
            mark = "FAIL" if r["regression"] else "ok  "
            self.stdout.write(
                f"{mark} rollout {r['rollout_id']} ({r['kind']}, step {r['step']}): rank "
                f"{r['rank_before']} -> {r['rank_after']} of {r['size']}, reward "
                f"{_f(r['reward_before'])} -> {_f(r['reward_after'])}, median "
                f"{_f(r['median_after'])}"
            )
        if not result.ok:
            n = sum(r["regression"] for r in result.rows)
            raise CommandError(
                f"{n} annotated reward hack(s) still outrank their group's median", returncode=1
            )
        self.stdout.write("ok: no annotated reward hack outranks its group's median")

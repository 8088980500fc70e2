"""Bulk data for operations tests and benches (online migrations, deletion, backup): realistic
multi-turn agent groups to ingest through the real service, and `fill_run`, which copies a run's
ingested step 0 into many more steps in SQL so a table reaches 10^5-10^6 rows in seconds.

Filled rows are copies: the same transcripts, scores and previews at other steps, with new ids,
group keys kept, and the copied groups' packed score blobs still naming the template's rollout ids
(pages that read the blobs are not what these rows are for). The column lists come from the
database's own catalogue, so a column someone adds later is copied too.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import setup_django  # noqa: E402
from training.records import GroupRecord, RolloutRecord  # noqa: E402

TOOLS = ("run_tests", "read_file", "search_docs")
AGENT_COMPONENTS = ("correct", "format", "penalty")  # the rewards of agent_group's rollouts


def agent_transcript(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    """A multi-turn agent transcript: system, user, then assistant turns with tool calls and tool
    results, and a final answer."""
    words = "parse tokens reward verifier group advantage diagram shape edge node cache retry"
    vocab = words.split()
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {
            "role": "user",
            "content": "Fix the failing test in parser.py: " + " ".join(rng.choices(vocab, k=30)),
        },
    ]
    for t in range(turns):
        tool = rng.choice(TOOLS)
        msgs.append(
            {
                "role": "assistant",
                "content": " ".join(rng.choices(vocab, k=rng.randint(20, 120))),
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {"name": tool, "arguments": f'{{"path": "src/m{t}.py"}}'},
                    }
                ],
            }
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{t}",
                "content": "\n".join(" ".join(rng.choices(vocab, k=12)) for _ in range(8)),
            }
        )
    msgs.append({"role": "assistant", "content": "Done: " + " ".join(rng.choices(vocab, k=40))})
    return msgs


def agent_group(
    step: int, key: str, size: int, rng: random.Random, components=AGENT_COMPONENTS
) -> dict[str, Any]:
    """One group record for the ingestion API (webapp/rollouts/validation.py's fields)."""
    rollouts = [
        RolloutRecord(
            index=i,
            transcript=agent_transcript(rng, rng.randint(1, 4)),
            rewards={c: round(rng.random(), 3) for c in components},
            length=rng.randint(50, 2000),
        )
        for i in range(size)
    ]
    return GroupRecord(step=step, key=key, prompt=f"task {key}", rollouts=rollouts).to_json()


def _columns(cur, table: str) -> list[str]:
    cur.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema() AND column_name <> 'id' ORDER BY ordinal_position",
        [table],
    )
    return [r[0] for r in cur.fetchall()]


def _select(columns: list[str], alias: str, override: dict[str, str]) -> tuple[str, str]:
    names = ", ".join(f'"{c}"' for c in columns)
    values = ", ".join(override.get(c, f'{alias}."{c}"') for c in columns)
    return names, values


def fill_run(cursor, run_id: int, copies: int, first_step: int = 1) -> int:
    """Copy the run's step-0 groups, rollouts and scores into steps first_step .. first_step +
    copies - 1 (Postgres). Returns the number of rollouts added."""
    g_cols = _columns(cursor, "rollouts_group")
    names, values = _select(g_cols, "t", {"step": "s.s"})
    cursor.execute(
        f"INSERT INTO rollouts_group ({names}) SELECT {values} FROM rollouts_group t, "
        f"generate_series(%s, %s) AS s(s) WHERE t.run_id = %s AND t.step = 0",
        [first_step, first_step + copies - 1, run_id],
    )
    r_cols = _columns(cursor, "rollouts_rollout")
    names, values = _select(r_cols, "t", {"group_id": "ng.id", "step": "ng.step"})
    cursor.execute(
        f"INSERT INTO rollouts_rollout ({names}) SELECT {values} FROM rollouts_rollout t "
        "JOIN rollouts_group tg ON tg.id = t.group_id AND tg.step = 0 "
        "JOIN rollouts_group ng ON ng.run_id = tg.run_id AND ng.key = tg.key "
        "AND ng.step BETWEEN %s AND %s WHERE t.run_id = %s",
        [first_step, first_step + copies - 1, run_id],
    )
    added = cursor.rowcount
    cursor.execute("ANALYZE rollouts_group")  # fresh statistics, or the next join is planned blind
    cursor.execute("ANALYZE rollouts_rollout")
    s_cols = _columns(cursor, "rollouts_rewardscore")
    names, values = _select(s_cols, "ts", {"rollout_id": "nr.id", "step": "nr.step"})
    cursor.execute(
        f"INSERT INTO rollouts_rewardscore ({names}) SELECT {values} FROM rollouts_rewardscore ts "
        "JOIN rollouts_rollout tr ON tr.id = ts.rollout_id AND tr.step = 0 "
        "JOIN rollouts_group tg ON tg.id = tr.group_id "
        "JOIN rollouts_group ng ON ng.run_id = tg.run_id AND ng.key = tg.key "
        "AND ng.step BETWEEN %s AND %s "
        "JOIN rollouts_rollout nr ON nr.group_id = ng.id AND nr.index = tr.index "
        "WHERE ts.run_id = %s AND ts.step = 0",
        [first_step, first_step + copies - 1, run_id],
    )
    return added


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="Copy a run's stored step 0 into more steps (Postgres), to grow it fast."
    )
    p.add_argument("--run", type=int, required=True, help="run id (its step 0 is the template)")
    p.add_argument("--copies", type=int, required=True, help="steps to add")
    args = p.parse_args(argv)
    setup_django(migrate=False)
    from django.db import connection

    with connection.cursor() as cur:
        print(f"added {fill_run(cur, args.run, args.copies):,} rollouts to run {args.run}")


if __name__ == "__main__":
    main()

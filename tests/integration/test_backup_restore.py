"""The documented backup round trip (docs/operations.md): pg_dump -Fc of a seeded database,
pg_restore into a new one, and every table comes back equal row for row: runs, groups, rollouts,
scores, annotations, queues, datasets, replays and their scores, the search words, the sequences."""

from __future__ import annotations

import io
import os
import re
import subprocess

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="pg_dump / pg_restore are Postgres tools",
    ),
]

KEY_TABLES = (
    "runs_run",
    "rollouts_rollout",
    "rollouts_rewardscore",
    "annotations_annotation",
    "replays_replay",
    "replays_replayscore",
)


def conninfo(name: str) -> str:
    from django.db import connection

    s = connection.settings_dict
    return (
        f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER']} dbname={name}"
    )


def tables(conn) -> list[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    ).fetchall()
    return [r[0] for r in rows]


def content(conn, table: str) -> list[tuple]:
    return conn.execute(f'SELECT * FROM "{table}" ORDER BY 1').fetchall()


def sequences(conn) -> dict[str, int]:
    rows = conn.execute("SELECT sequencename, last_value FROM pg_sequences").fetchall()
    return dict(rows)


def major(text: str) -> int:
    return int(re.search(r"(\d+)\.", text).group(1))


def test_it_dumps_and_restores_a_seeded_database_equal(transactional_db, tmp_path):
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    call_command("seed_demo", steps=2, groups_per_step=2, G=4, stdout=io.StringIO())
    server = connection.cursor().connection.info.server_version // 10000
    for tool in ("pg_dump", "pg_restore"):
        version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
        assert major(version) >= server, f"{tool} {version} is older than the server ({server})"

    source = connection.settings_dict["NAME"]
    restored = f"{source}_restored"
    dump = tmp_path / "rd.dump"
    base = conninfo(source)
    subprocess.run(
        ["pg_dump", "--format=custom", "--file", str(dump), "--dbname", base],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{restored}"')
        admin.execute(f'CREATE DATABASE "{restored}"')
    try:
        subprocess.run(
            [
                "pg_restore",
                "--no-owner",
                "--exit-on-error",
                "--dbname",
                conninfo(restored),
                str(dump),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        with psycopg.connect(base) as a, psycopg.connect(conninfo(restored)) as b:
            assert tables(a) == tables(b)
            for table in KEY_TABLES:
                assert content(a, table), f"the seed left {table} empty: nothing to compare"
            for table in tables(a):
                assert content(a, table) == content(b, table), table
            assert sequences(a) == sequences(b)
            indexes = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
            assert sorted(a.execute(indexes).fetchall()) == sorted(b.execute(indexes).fetchall())
    finally:
        with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{restored}"')

"""What every benchmark shares: the Postgres database it needs (created when missing, dropped by
name), Django set up production-like, the standard four reward components, seeding helpers (a run
found again by name, batches ingested with progress, fresh planner statistics), timing, the load
average printed beside each figure, ratios, and a progress bar (tqdm on a terminal, one line per
10% otherwise, so logs stay readable).

A script imports it after putting the repository on sys.path, so it runs as `python bench/x.py` and
as `python -m bench.x`. Django is imported inside the functions that need it: `--help` and the pure
helpers work without a database.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

T = TypeVar("T")

# The standard environment of the one-line benches (pages, api_read, ablation, load): an outcome,
# a behavioural component that saturates early, a process score and a penalty.
COMPONENTS: list[dict[str, Any]] = [
    {"name": "correct", "weight": 1.0, "kind": "outcome", "min_value": 0.0, "max_value": 1.0},
    {"name": "format", "weight": 0.2, "kind": "behavioural", "min_value": 0.0, "max_value": 1.0},
    {"name": "coverage", "weight": 0.5, "kind": "process", "min_value": 0.0, "max_value": 1.0},
    {
        "name": "length_penalty",
        "weight": 0.1,
        "kind": "penalty",
        "min_value": -1.0,
        "max_value": 0.0,
    },
]
COMPONENT_NAMES = tuple(c["name"] for c in COMPONENTS)
# The tables a seed fills (VACUUM ANALYZE after seeding gives the planner fresh statistics).
ROLLOUT_TABLES = (
    "rollouts_group",
    "rollouts_rollout",
    "rollouts_rewardscore",
    "rollouts_groupcomponentstat",
    "rollouts_stepstat",
)


def components(**changes: dict[str, Any]) -> list[dict[str, Any]]:
    """COMPONENTS with some fields changed per component: components(format={"weight": 0.5})."""
    return [{**c, **changes.get(c["name"], {})} for c in COMPONENTS]


# --- the database ---------------------------------------------------------------------------------


def database_url(name: str | None = None) -> str:
    """DATABASE_URL, or the same server with database `name`."""
    url = os.environ.get("DATABASE_URL", "")
    if name is None:
        return url
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path=f"/{name}"))


def database_name(url: str | None = None) -> str:
    return urllib.parse.urlsplit(url or database_url()).path.lstrip("/")


def _server(url: str | None = None) -> Any:
    import psycopg

    maintenance = urllib.parse.urlsplit(url or database_url())._replace(path="/postgres")
    return psycopg.connect(urllib.parse.urlunsplit(maintenance), autocommit=True)


def database_exists(name: str, url: str | None = None) -> bool:
    with _server(url) as conn:
        return bool(conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone())


def create_database(name: str, url: str | None = None) -> bool:
    """Create database `name` on DATABASE_URL's server (or `url`'s) unless it exists; True when
    this call created it."""
    with _server(url) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        conn.execute(f'CREATE DATABASE "{name}"')
        return True


def drop_database(name: str, url: str | None = None) -> None:
    """Drop database `name` if it exists, closing its other sessions first."""
    with _server(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def require_postgres() -> str:
    """Stop unless DATABASE_URL names a Postgres database; create it when missing. Returns the
    database name."""
    url = database_url()
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(
            "DATABASE_URL: set it to a Postgres database (the benchmark measures Postgres plans)"
        )
    name = database_name(url)
    create_database(name, url)
    return name


def production_like_env() -> None:
    """Production-like request path: no DEBUG query log, no HTTPS redirect for the test client,
    persistent connections as gunicorn would run. Call it before setup_django()."""
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-use-0123456789")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
    os.environ.setdefault("DB_CONN_MAX_AGE", "60")


def setup_django(postgres: bool = True, migrate: bool = True) -> None:
    """The usual start of a database bench: Postgres required (and created), production-like
    settings, django.setup(), migrations applied."""
    if postgres:
        require_postgres()
    production_like_env()
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


# --- seeding --------------------------------------------------------------------------------------


def bench_run(
    name: str,
    environment: str = "bench-4c",
    comps: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> Any:
    """The run called `name` (found again, so a rerun reuses what is seeded), else a new one in
    `environment` with `comps` (default COMPONENTS); `fields` go to get_or_create_run (kind,
    config, base_model...)."""
    from webapp.rollouts.services import ensure_environment, get_or_create_run

    env = ensure_environment(environment, COMPONENTS if comps is None else comps)
    fields = {"kind": "grpo", "config": {}, **fields}
    return get_or_create_run(name=name, environment=env, **fields)[0]


def ingest_batches(
    run: Any, batches: Iterable[list[dict]], rollouts: int, desc: str, window: int = 0
) -> float:
    """Ingest each batch of groups through the one ingestion service, with progress counted in
    rollouts (`rollouts`: the total). Returns the seconds taken. With `window`, also prints the
    service's rollouts/s over each `window` rollouts (time inside ingest_groups only, so the
    batches' generation is not counted) and, at the end, the last window's rate over the first's:
    whether ingestion slows down as the tables grow."""
    from webapp.rollouts.ingest import ingest_groups

    t0 = time.perf_counter()
    rates: list[float] = []
    in_window, spent = 0, 0.0
    with progress(rollouts, desc) as bar:
        for groups in batches:
            t = time.perf_counter()
            ingest_groups(run, {"groups": groups})
            spent += time.perf_counter() - t
            n = sum(len(g["rollouts"]) for g in groups)
            bar.update(n)
            in_window += n
            if window and in_window >= window:
                rates.append(in_window / spent)
                report(f"{desc}: window {len(rates)} ({in_window:,} rollouts) {rates[-1]:,.0f}/s")
                in_window, spent = 0, 0.0
    if len(rates) >= 2:
        report(
            f"{desc}: last window / first window = {ratio(rates[-1], rates[0])} "
            f"({rates[-1]:,.0f} / {rates[0]:,.0f} rollouts/s; target >= 0.8)"
        )
    return time.perf_counter() - t0


def vacuum_analyze(tables: Iterable[str] = ROLLOUT_TABLES) -> None:
    """Fresh planner statistics, as autovacuum would eventually give."""
    from django.db import connection

    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"VACUUM ANALYZE {table}")


# --- timing, the load average, ratios -------------------------------------------------------------


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def load_line() -> str:
    return f"load average: {load_average()} ({os.cpu_count()} CPUs, shared with other work)"


def with_load(line: str) -> str:
    """A figure's line with the 1-minute load average beside it: on a shared machine a time means
    little without it."""
    return f"{line}  (load {os.getloadavg()[0]:.2f})"


def report(line: str) -> None:
    print(with_load(line), flush=True)


def ratio(numerator: float, denominator: float, digits: int = 2) -> str:
    """`numerator / denominator` as "1.23x" ("n/a" when the denominator is 0)."""
    if not denominator:
        return "n/a"
    return f"{numerator / denominator:.{digits}f}x"


@dataclass(frozen=True)
class Timing:
    median: float  # seconds
    best: float  # seconds
    result: Any  # what the last call returned

    @property
    def ms(self) -> float:
        return self.median * 1000


def timed(fn: Callable[[], Any], repeat: int, warmup: int = 0) -> Timing:
    """Median and best wall time of `repeat` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return Timing(statistics.median(times), min(times), result)


def median_ms(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> tuple[float, float]:
    """(median, best) in milliseconds of `repeat` calls after `warmup` untimed ones."""
    t = timed(fn, repeat, warmup)
    return t.median * 1000, t.best * 1000


# --- progress -------------------------------------------------------------------------------------


class TenPercent:
    """A progress bar for logs: one line per 10% reached."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc = total, desc
        self.done, self.shown, self.t0 = 0, 0, time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        reached = min(10, self.done * 10 // self.total) if self.total else 0
        if reached > self.shown:  # one line, however many tenths this step crossed
            self.shown = reached
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(
                f"{self.desc}: {self.shown * 10}% ({self.done:,}/{self.total:,}, {rate:,.1f}/s)",
                flush=True,
            )

    def __enter__(self) -> TenPercent:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def progress(total: int, desc: str, unit: str = "rollout") -> Any:
    """A bar to `update(n)`: tqdm on a terminal, TenPercent otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=True)
    return TenPercent(total, desc)


def track(items: Iterable[T], desc: str, unit: str = "batch") -> Iterator[T]:
    """Iterate with progress (a list or anything with len)."""
    items = list(items)
    with progress(len(items), desc, unit) as bar:
        for item in items:
            yield item
            bar.update(1)

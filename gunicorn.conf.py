"""gunicorn settings for `make serve` (the Makefile passes --bind and --workers; the rest is here).

Threaded workers (gthread): a sync worker is held for the whole of a request, so four trainers
posting batches of groups (hundreds of ms each, mostly waiting on Postgres) left one of five sync
workers for the readers, and explorer reads queued behind the writes (bench/load.py: read p95 776
ms). Threads let a worker serve reads while its other threads wait on COPY. Each thread keeps its
database connection for DB_CONN_MAX_AGE seconds (Django checks it before reuse): opening one per
request cost a Postgres backend start per read. Connections: workers x threads (default 3 x 4 = 12
on 2 cores).
"""

from __future__ import annotations

import os

worker_class = "gthread"
threads = int(
    os.environ.get("THREADS", "4")
)  # per worker: requests in flight while others wait on I/O
timeout = 120  # seconds a request may run before its worker is restarted (a large ingest batch)
graceful_timeout = 30
max_requests = 2000  # recycle workers now and then (memory held by one huge request is returned)
max_requests_jitter = 200
accesslog = "-"
errorlog = "-"
# Inherited by the workers (forked from this process): persistent connections unless
# the caller chose.
os.environ.setdefault("DB_CONN_MAX_AGE", "60")

"""The explorer's search backends, one per database vendor, chosen once at first use (backend()).
base.py holds the interface and the plans every backend shares (walking the sort order, checking
rows against the search); postgres.py the planner over the trigram and word indexes; sqlite.py
the plain text scan. A new backend: a SearchBackend subclass, named in BACKENDS.
"""

from __future__ import annotations

import functools

from django.db import connection
from django.utils.module_loading import import_string

from webapp.explorer.search.base import SearchBackend

# A database vendor -> its backend's class; any other vendor gets DEFAULT.
BACKENDS = {"postgresql": "webapp.explorer.search.postgres.PostgresSearch"}
DEFAULT = "webapp.explorer.search.sqlite.SQLiteSearch"


@functools.cache
def backend() -> SearchBackend:
    """The backend of the default database's vendor (the project runs on one database)."""
    return import_string(BACKENDS.get(connection.vendor, DEFAULT))()

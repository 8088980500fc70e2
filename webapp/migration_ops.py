"""Migration operations that never stop ingestion on Postgres: `AddIndexOnline`,
`RemoveIndexOnline`, `ReplaceIndexOnline` and `create_index_concurrently` build and drop indexes
CONCURRENTLY; on SQLite they do what Django's own operations do. A migration using them says
`atomic = False`, and each operation must leave the database usable on its own. A failed
concurrent build's INVALID leftover is dropped first, so re-running repairs it. Applied
migrations import these names: keep them stable. Why and when: docs/migrations.md.
"""

from __future__ import annotations

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import Index

TEMPORARY_SUFFIX = "_new"


def _postgres(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def _not_in_transaction(schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.in_atomic_block:
        raise RuntimeError(
            "an online index operation runs in a migration with atomic = False "
            "(Postgres refuses CONCURRENTLY inside a transaction)"
        )


def drop_invalid_index(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    """Drop the index `name` if a failed concurrent build left it INVALID (Postgres)."""
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND pg_catalog.pg_table_is_visible(c.oid)",
            [name],
        )
        row = cur.fetchone()
    if row and row[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def create_index_concurrently(
    schema_editor: BaseDatabaseSchemaEditor, name: str, rest: str
) -> None:
    """`CREATE INDEX CONCURRENTLY IF NOT EXISTS <name> <rest>` on Postgres (rest: `ON table USING
    ...`), after dropping an invalid leftover; `CREATE INDEX IF NOT EXISTS` elsewhere."""
    if _postgres(schema_editor):
        _not_in_transaction(schema_editor)
        drop_invalid_index(schema_editor, name)
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} {rest}")
    else:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} {rest}")


def drop_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    concurrently = "CONCURRENTLY " if _postgres(schema_editor) else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


def _add(schema_editor: BaseDatabaseSchemaEditor, model, index: Index) -> None:
    if _postgres(schema_editor):
        _not_in_transaction(schema_editor)
        drop_invalid_index(schema_editor, index.name)
        schema_editor.add_index(model, index, concurrently=True)
    else:
        schema_editor.add_index(model, index)


def _remove(schema_editor: BaseDatabaseSchemaEditor, model, index: Index) -> None:
    if _postgres(schema_editor):
        _not_in_transaction(schema_editor)
        schema_editor.remove_index(model, index, concurrently=True)
    else:
        schema_editor.remove_index(model, index)


class AddIndexOnline(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on Postgres."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _add(schema_editor, model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _remove(schema_editor, model, self.index)


class RemoveIndexOnline(migrations.RemoveIndex):
    """RemoveIndex, dropped CONCURRENTLY on Postgres."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _remove(schema_editor, model, index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _add(schema_editor, model, index)


class ReplaceIndexOnline(migrations.operations.base.Operation):
    """Redefine the index `index.name` of `model_name` (the state's index of that name is the old
    one). Postgres: build the new definition concurrently as `<name>_new`, drop the old one
    concurrently, rename; the table always has one of them."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, model_name: str, index: Index) -> None:
        self.model_name = model_name
        self.index = index

    @property
    def model_name_lower(self) -> str:
        return self.model_name.lower()

    def deconstruct(self):
        return self.__class__.__qualname__, [], {"model_name": self.model_name, "index": self.index}

    def state_forwards(self, app_label, state) -> None:
        state.remove_index(app_label, self.model_name_lower, self.index.name)
        state.add_index(app_label, self.model_name_lower, self.index)

    def _swap(self, app_label, schema_editor, state, new: Index) -> None:
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if not _postgres(schema_editor):
            schema_editor.execute(f"DROP INDEX IF EXISTS {new.name}")
            schema_editor.add_index(model, new)
            return
        temporary = new.clone()
        temporary.name = new.name[: 63 - len(TEMPORARY_SUFFIX)] + TEMPORARY_SUFFIX
        _add(schema_editor, model, temporary)
        drop_index_concurrently(schema_editor, new.name)
        schema_editor.execute(f"ALTER INDEX {temporary.name} RENAME TO {new.name}")

    def database_forwards(self, app_label, schema_editor, from_state, to_state) -> None:
        self._swap(app_label, schema_editor, to_state, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state) -> None:
        old = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.index.name)
        self._swap(app_label, schema_editor, to_state, old)

    def describe(self) -> str:
        return f"Replace index {self.index.name} on {self.model_name} (online)"

    @property
    def migration_name_fragment(self) -> str:
        return f"replace_{self.index.name.lower()}"

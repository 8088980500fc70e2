"""Group.packed_scores becomes NOT NULL: every writer fills it (ingestion, in the same transaction as
the group's rows), and the run reader (webapp/rollouts/arrays.py) reads nothing else. Groups still
without a blob (stored by a raw INSERT since 0006) are backfilled first, by 0006's backfill."""

import importlib

from django.db import migrations, models

_0006 = importlib.import_module("webapp.rollouts.migrations.0006_group_packed_scores")


class Migration(migrations.Migration):
    # The backfill commits before the ALTER: Postgres refuses to alter a table with pending trigger
    # events (deferred foreign-key checks) from updates in the same transaction.
    atomic = False

    dependencies = [
        ("rollouts", "0008_search_index_by_run"),
    ]

    operations = [
        migrations.RunPython(_0006.backfill, migrations.RunPython.noop, elidable=True),  # per batch
        migrations.AlterField(
            model_name="group",
            name="packed_scores",
            field=models.BinaryField(editable=False),
        ),
    ]

"""An index on ReplayScore.rollout: deleting a run's rollouts (the reaper, webapp/runs/deletion.py)
deletes their replay scores by rollout, a scan of every replay score per batch without it. Built
CONCURRENTLY on Postgres (webapp/migration_ops.py): replay scores are as many as a run's scores."""

from django.db import migrations, models

from webapp.migration_ops import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY refuses a transaction block

    dependencies = [
        ("replays", "0003_resumed_at"),
    ]

    operations = [
        AddIndexOnline(
            model_name="replayscore",
            index=models.Index(fields=["rollout"], name="replayscore_rollout"),
        ),
    ]

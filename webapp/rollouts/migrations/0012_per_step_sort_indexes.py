# Step ranges on the explorer at any run size (issue 30 item 2): the page of a step range sorted
# by a component, the reward, the advantage or the length merges each step's top entries
# (webapp/explorer/paging.py, per_step_fetch), which needs the sort value in the key after the
# step. score_step held the value as an INCLUDE column (the same bytes: same size); it is rebuilt
# with the value in the key under the same name; the three Rollout indexes are new. All are built
# CONCURRENTLY (docs/migrations.md): ingestion never waits for them.

from django.db import migrations, models

from webapp.migration_ops import AddIndexOnline, ReplaceIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY refuses a transaction block

    dependencies = [
        ("rollouts", "0011_step_range_indexes"),
    ]

    operations = [
        ReplaceIndexOnline(
            model_name="rewardscore",
            index=models.Index(
                fields=["run", "component", "step", "value", "rollout"], name="score_step"
            ),
        ),
        AddIndexOnline(
            model_name="rollout",
            index=models.Index(
                fields=["run", "step", "reward", "id"], name="rollout_run_step_reward"
            ),
        ),
        AddIndexOnline(
            model_name="rollout",
            index=models.Index(
                fields=["run", "step", "advantage", "id"], name="rollout_run_step_adv"
            ),
        ),
        AddIndexOnline(
            model_name="rollout",
            index=models.Index(
                fields=["run", "step", "length", "id"], name="rollout_run_step_length"
            ),
        ),
    ]

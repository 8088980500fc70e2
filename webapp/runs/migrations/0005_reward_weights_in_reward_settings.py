"""A run's weights in one place: every config's `reward_weights` moves into `reward_settings`
(weights already there, the trainer's, win) and leaves the config. The runs table is small (one row
per job or import), so one pass over the rows with the key is enough."""

from django.db import migrations


def _settle(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    Component = apps.get_model("rollouts", "RewardComponent")
    for run in Run.objects.filter(config__has_key="reward_weights").iterator():
        given = run.config.get("reward_weights")
        if isinstance(given, list) and run.environment_id:
            names = list(
                Component.objects.filter(environment_id=run.environment_id)
                .order_by("position", "id")
                .values_list("name", flat=True)
            )
            given = dict(zip(names, given)) if len(names) == len(given) else None
        if not isinstance(given, dict):
            continue
        own = dict(run.reward_settings or {})
        weights = {str(k): float(v) for k, v in given.items() if isinstance(v, (int, float))}
        own["weights"] = {**weights, **(own.get("weights") or {})}
        own.setdefault("source", "created")
        run.reward_settings = own
        run.config = {k: v for k, v in run.config.items() if k != "reward_weights"}
        run.save(update_fields=["config", "reward_settings"])


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_run_kind_choices_from_table"),
        ("rollouts", "0001_initial"),
    ]

    operations = [migrations.RunPython(_settle, migrations.RunPython.noop)]

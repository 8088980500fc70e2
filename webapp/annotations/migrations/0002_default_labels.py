"""Install the default label taxonomy (webapp/annotations/taxonomy.py)."""

from django.db import migrations

from webapp.annotations.taxonomy import DEFAULT_LABELS, ensure_default_labels


def create_labels(apps, schema_editor):
    ensure_default_labels(apps.get_model("annotations", "Label"))


def remove_labels(apps, schema_editor):
    Label = apps.get_model("annotations", "Label")
    Label.objects.filter(slug__in=[row[0] for row in DEFAULT_LABELS], annotations__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("annotations", "0001_initial")]

    operations = [migrations.RunPython(create_labels, remove_labels)]

from django.contrib import admin

from webapp.runs.models import Run, StepMetric


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "status", "environment", "owner", "created_at")
    list_filter = ("kind", "status")
    search_fields = ("name",)
    raw_id_fields = ("parent", "owner")


@admin.register(StepMetric)
class StepMetricAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "name", "value")
    list_filter = ("name",)
    raw_id_fields = ("run",)

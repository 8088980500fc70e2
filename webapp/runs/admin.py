from django.contrib import admin, messages

from webapp.runs import deletion
from webapp.runs.models import Run, StepMetric


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Deleting a run here marks it deleted and stops its job; its rows are reaped in the
    background in batches (webapp/runs/deletion.py): a cascade in the request would race the job's
    writes (a 500 at commit) and hold millions of rows locked."""

    list_display = (
        "id",
        "name",
        "kind",
        "status",
        "environment",
        "owner",
        "created_at",
        "deleted_at",
    )
    list_filter = ("kind", "status")
    search_fields = ("name",)
    raw_id_fields = ("parent", "owner")
    readonly_fields = ("deleted_at",)

    def get_deleted_objects(self, objs, request):
        # Django's confirmation page would collect every rollout and score of the run (millions).
        runs = list(objs)
        listed = [
            f"{r} (#{r.id}): hidden now, its job stopped, its rows and output folder removed in "
            "the background"
            for r in runs
        ]
        return listed, {Run._meta.verbose_name_plural: len(runs)}, set(), []

    def delete_model(self, request, obj: Run) -> None:
        deletion.request_delete(obj)

    def delete_queryset(self, request, queryset) -> None:
        n = sum(deletion.request_delete(run) for run in queryset)
        messages.info(
            request, f"{n} run(s) marked deleted; their rows are removed in the background"
        )


@admin.register(StepMetric)
class StepMetricAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "name", "value")
    list_filter = ("name",)
    raw_id_fields = ("run",)

from django.contrib import admin

from webapp.diagnostics.models import Ablation


@admin.register(Ablation)
class AblationAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "run", "created_by", "created_at", "twin")
    list_filter = ("created_at",)
    search_fields = ("name", "run__name")
    raw_id_fields = ("run", "twin", "created_by")
    readonly_fields = ("results",)

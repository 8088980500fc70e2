from django.contrib import admin

from webapp.behaviours.models import Behaviour


@admin.register(Behaviour)
class BehaviourAdmin(admin.ModelAdmin):
    list_display = ("name", "environment", "critical", "max_rate", "version", "created_at")
    list_filter = ("environment", "critical")
    search_fields = ("name",)

from django.contrib import admin

from webapp.annotations.models import ActivityEvent, Annotation, Dataset, Label, ReviewQueue


@admin.register(Label)
class LabelAdmin(admin.ModelAdmin):
    list_display = ("position", "name", "slug", "key", "is_bad", "color")
    list_editable = ("name", "key", "is_bad", "color")
    list_display_links = ("position",)


@admin.register(Annotation)
class AnnotationAdmin(admin.ModelAdmin):
    list_display = ("id", "rollout", "author", "label", "created_at", "updated_at")
    list_filter = ("label",)
    raw_id_fields = ("rollout",)


@admin.register(ReviewQueue)
class ReviewQueueAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "run", "source", "limit", "overlap", "created_at")
    raw_id_fields = ("run",)


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "version", "kind", "format", "created_by", "created_at")


@admin.register(ActivityEvent)
class ActivityEventAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "rollout_id", "label_slug", "detail")
    list_filter = ("action",)

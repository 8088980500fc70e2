from django.contrib import admin

from webapp.rollouts.models import (
    Environment,
    Group,
    GroupComponentStat,
    RewardComponent,
    RewardScore,
    Rollout,
)


class RewardComponentInline(admin.TabularInline):
    model = RewardComponent
    extra = 0


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("name", "description")
    inlines = [RewardComponentInline]


@admin.register(RewardComponent)
class RewardComponentAdmin(admin.ModelAdmin):
    list_display = ("environment", "name", "weight", "kind", "min_value", "max_value")
    list_filter = ("environment", "kind")


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "run",
        "step",
        "key",
        "split",
        "size",
        "reward_mean",
        "reward_std",
        "zero_std",
    )
    list_filter = ("split", "zero_std")
    raw_id_fields = ("run",)


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "step", "index", "reward", "advantage", "length")
    raw_id_fields = ("run", "group")


@admin.register(RewardScore)
class RewardScoreAdmin(admin.ModelAdmin):
    list_display = ("rollout", "component", "value", "reason")
    raw_id_fields = ("rollout", "run")


@admin.register(GroupComponentStat)
class GroupComponentStatAdmin(admin.ModelAdmin):
    list_display = ("group", "component", "mean", "std", "min", "max", "zero_std")
    raw_id_fields = ("group", "run")

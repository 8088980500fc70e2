from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from webapp.api import views
from webapp.diagnostics import api as diagnostics_api

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("runs/", views.runs, name="api-runs"),
    path("runs/<int:run_id>/groups/", views.run_groups, name="api-run-groups"),
    path("runs/<int:run_id>/metrics/", views.run_metrics, name="api-run-metrics"),
    path("runs/<int:run_id>/settings/", views.run_settings, name="api-run-settings"),
    path("runs/<int:run_id>/rollouts/", views.run_rollouts, name="api-run-rollouts"),
    path("runs/<int:run_id>/finish/", views.run_finish, name="api-run-finish"),
    path("runs/<int:run_id>/ablations/", diagnostics_api.run_ablations, name="api-run-ablations"),
    path(
        "runs/<int:run_id>/diagnostics/",
        diagnostics_api.run_diagnostics,
        name="api-run-diagnostics",
    ),
    path("ablations/<int:ablation_id>/", diagnostics_api.ablation_detail, name="api-ablation"),
    path("", include("webapp.replays.api_urls")),
    path("", include("webapp.tokens.api_urls")),
    path("", include("webapp.behaviours.api_urls")),
]

from django.urls import path

from webapp.diagnostics import views

urlpatterns = [
    path("runs/<int:run_id>/", views.run_diagnostics, name="diagnostics-run"),
    path("runs/<int:run_id>/ablations/", views.ablations, name="diagnostics-ablations"),
    path(
        "runs/<int:run_id>/ablations/save/", views.ablation_save, name="diagnostics-ablation-save"
    ),
    path(
        "runs/<int:run_id>/ablations/compare/",
        views.ablation_compare,
        name="diagnostics-ablation-compare",
    ),
    path("runs/<int:run_id>/overlay/<int:other_id>/", views.overlay, name="diagnostics-overlay"),
    path("ablations/<int:ablation_id>/", views.ablation_detail, name="diagnostics-ablation"),
    path(
        "ablations/<int:ablation_id>/launch/",
        views.ablation_launch,
        name="diagnostics-ablation-launch",
    ),
]

"""Mounted at the site root, so it also carries the run-scoped rollout pages (explorer, no-signal)
and /groups/<id>/; their views live in webapp.rollouts.views."""

from django.urls import path

from webapp.rollouts import views as rollout_views
from webapp.runs import views

urlpatterns = [
    path("", views.runs_list, name="runs-list"),
    path("runs/<int:run_id>/", views.run_dashboard, name="runs-dashboard"),
    path("runs/<int:run_id>/live.json", views.run_live, name="runs-live"),
    path("runs/<int:run_id>/rollouts/", rollout_views.explorer, name="rollouts-explorer"),
    path("runs/<int:run_id>/no-signal/", rollout_views.no_signal, name="rollouts-no-signal"),
    path("groups/<int:group_id>/", rollout_views.group_view, name="rollouts-group"),
]

"""Included by webapp/api/urls.py at /api/v1/."""

from django.urls import path

from webapp.behaviours import api

urlpatterns = [
    path("behaviours/", api.behaviours, name="api-behaviours"),
    path("behaviours/<int:behaviour_id>/", api.behaviour_detail, name="api-behaviour"),
    path(
        "behaviours/<int:behaviour_id>/runs/<int:run_id>/",
        api.behaviour_run,
        name="api-behaviour-run",
    ),
    path(
        "behaviours/<int:behaviour_id>/overlay/",
        api.behaviour_overlay,
        name="api-behaviour-overlay",
    ),
    path("replays/<int:replay_id>/behaviours/", api.replay_effects, name="api-replay-behaviours"),
    path("runs/<int:run_id>/behaviours/propose/", api.propose, name="api-behaviours-propose"),
]

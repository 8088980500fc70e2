"""Included by webapp/api/urls.py at /api/v1/."""

from django.urls import path

from webapp.replays import api

urlpatterns = [
    path("runs/<int:run_id>/replays/", api.run_replays, name="api-run-replays"),
    path("replays/<int:replay_id>/", api.replay_detail, name="api-replay"),
    path("replays/<int:replay_id>/regress/", api.replay_regress, name="api-replay-regress"),
    path("replays/<int:replay_id>/train/", api.replay_train, name="api-replay-train"),
]

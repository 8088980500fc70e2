"""Included by webapp/api/urls.py at /api/v1/."""

from django.urls import path

from webapp.tokens import api

urlpatterns = [
    path("rollouts/<int:rollout_id>/tokens/", api.rollout_tokens, name="api-rollout-tokens"),
    path("runs/<int:run_id>/token-stats/", api.run_token_stats, name="api-run-token-stats"),
]

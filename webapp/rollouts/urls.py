"""Mounted at /rollouts/. The run-scoped explorer, no-signal and group pages are
routed in webapp/runs/urls.py (mounted at the root) so their URLs read
/runs/<id>/rollouts/ and /groups/<id>/."""

from django.urls import path

from webapp.rollouts import views
from webapp.tokens import pages as token_pages

urlpatterns = [
    path("<int:rollout_id>/", views.transcript, name="rollouts-transcript"),
    path("<int:rollout_id>/tokens.json", token_pages.rollout_tokens, name="rollouts-tokens"),
]

from django.urls import path

from webapp.replays import views

urlpatterns = [
    path("runs/<int:run_id>/", views.run_replays, name="replays-run"),
    path("<int:replay_id>/", views.replay_detail, name="replays-detail"),
    path("<int:replay_id>/progress/", views.replay_progress, name="replays-progress"),
    path("<int:replay_id>/cancel/", views.replay_cancel, name="replays-cancel"),
    path("<int:replay_id>/train/", views.replay_train, name="replays-train"),
    path("<int:replay_id>/resume/", views.replay_resume, name="replays-resume"),
]

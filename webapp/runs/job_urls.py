from django.urls import path

from webapp.runs import job_views

urlpatterns = [
    path("launch/<str:kind>/", job_views.launch, name="jobs-launch"),
    path("compare/", job_views.compare, name="jobs-compare"),
    path("workers/", job_views.workers, name="jobs-workers"),
    path("<int:run_id>/", job_views.detail, name="jobs-detail"),
    path("<int:run_id>/progress/", job_views.progress, name="jobs-progress"),
    path("<int:run_id>/cancel/", job_views.cancel, name="jobs-cancel"),
]

from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path, re_path
from django.views.decorators.http import require_safe

from webapp.api import errors as api_errors

handler404 = "webapp.api.errors.page_not_found"
handler500 = "webapp.api.errors.server_error"

urlpatterns = [
    path(
        "healthz",
        require_safe(lambda request: HttpResponse("ok", content_type="text/plain")),
        name="healthz",
    ),
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("api/v1/", include("webapp.api.urls")),
    re_path(r"^api/", api_errors.not_found),  # any other /api/ path: a JSON 404, never an HTML page
    path("rollouts/", include("webapp.rollouts.urls")),
    path("diagnostics/", include("webapp.diagnostics.urls")),
    path("annotations/", include("webapp.annotations.urls")),
    path("jobs/", include("webapp.runs.job_urls")),
    path("replays/", include("webapp.replays.urls")),
    path("behaviours/", include("webapp.behaviours.urls")),
    path("", include("webapp.runs.urls")),
]

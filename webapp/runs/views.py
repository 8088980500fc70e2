from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.runs.models import Run


def runs_list(request: HttpRequest) -> HttpResponse:
    runs = Run.objects.select_related("environment").order_by("-created_at")[:200]
    return render(request, "runs/list.html", {"runs": runs})

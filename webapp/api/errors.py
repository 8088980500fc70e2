"""Every API error is JSON of the form {"errors": [{"field": "...", "error": "..."}]}: the services'
FieldError (bad input, 400; Conflict, 409) and DRF's exceptions through `exception_handler`, so
views do not catch them; unknown /api/ paths through `not_found`, and 404/500 raised outside DRF
through the handlers webapp/urls.py installs."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from webapp.errors import FieldError


def error_response(
    errors: list[dict[str, str]], code: int = status.HTTP_400_BAD_REQUEST
) -> Response:
    return Response({"errors": errors}, status=code)


def exception_handler(exc, context):
    if isinstance(exc, FieldError):
        return error_response(exc.errors, exc.status)
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ParseError):
        response.data = {"errors": [{"field": "body", "error": f"malformed JSON: {exc.detail}"}]}
    elif isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict):
        response.data = {
            "errors": [
                {"field": k, "error": " ".join(map(str, v)) if isinstance(v, list) else str(v)}
                for k, v in exc.detail.items()
            ]
        }
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"errors": [{"field": "", "error": str(detail)}]}
    return response


def _json_error(message: str, code: int) -> JsonResponse:
    return JsonResponse({"errors": [{"field": "", "error": message}]}, status=code)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for every path under /api/ that no API view matches, as JSON (also when DEBUG
    is on, where Django would answer with its HTML debug page): a client parses one
    error shape everywhere."""
    slashed = request.path_info + "/"
    if not request.path_info.endswith("/") and _resolves(slashed):
        return _json_error(f"not found; the URL ends with a slash: {slashed}", 404)
    return _json_error("not found", 404)


def _resolves(path: str) -> bool:
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return match.func is not not_found


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """settings.handler404: JSON under /api/, Django's page elsewhere."""
    if request.path_info.startswith("/api/"):
        return not_found(request, exception)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """settings.handler500: JSON under /api/ (no detail: it is in the server log),
    Django's page elsewhere."""
    if request.path_info.startswith("/api/"):
        return _json_error("internal server error", 500)
    return defaults.server_error(request)

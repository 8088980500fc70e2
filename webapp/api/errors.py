"""Every API error is JSON of the form {"errors": [{"field": "...", "error": "..."}]}."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler


def error_response(errors: list[dict[str, str]], code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"errors": errors}, status=code)


def exception_handler(exc, context):
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ParseError):
        response.data = {"errors": [{"field": "body", "error": f"malformed JSON: {exc.detail}"}]}
    elif isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict):
        response.data = {"errors": [{"field": k, "error": " ".join(map(str, v)) if isinstance(v, list) else str(v)}
                                    for k, v in exc.detail.items()]}
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"errors": [{"field": "", "error": str(detail)}]}
    return response

"""The API's JSON body reader: every refusal is a FieldError (a 400 naming the field) that the API's
exception handler answers, so views call `parse_body` and never catch."""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.request import Request

from training import token_wire
from webapp.errors import FieldError
from webapp.rollouts.validation import unstorable_text

# NUL and lone surrogates can only arrive as \u escapes: walk the body only when one may be there.
_UNSTORABLE_ESCAPE = re.compile(rb"\\u(0000|[dD][89a-fA-F])")


class _Constant(FieldError):
    pass


def _reject_constant(name: str) -> Any:
    raise _Constant("body", f"{name} is not allowed: numbers must be finite")


def parse_body(request: Request) -> Any:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise FieldError(
            "body", f"body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"
        ) from None
    if request.content_type == token_wire.CONTENT_TYPE:  # JSON + raw token arrays (no base64)
        try:
            raw, data = token_wire.split(raw)
            body = _loads(raw)
            token_wire.resolve(body, data)
        except token_wire.WireError as e:
            raise FieldError(e.path, e.message) from None
        return body
    return _loads(raw)


def _loads(raw: bytes) -> Any:
    try:
        body = json.loads(raw or b"null", parse_constant=_reject_constant)
    except _Constant:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FieldError("body", f"malformed JSON: {e}") from None
    except RecursionError:
        raise FieldError("body", "malformed JSON: nested too deeply") from None
    except ValueError as e:  # an integer literal past Python's 4300-digit conversion limit
        raise FieldError("body", f"malformed JSON: {e}") from None
    if _UNSTORABLE_ESCAPE.search(raw):
        bad = unstorable_text(body, "")
        if bad is not None:
            raise FieldError(bad[0], bad[1])
    return body

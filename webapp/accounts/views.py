"""Login with a failure rate limit.

The limit counts failed logins per (normalised username, client address) in Django's cache, which
settings point at one store for every server process (Redis when configured, else files on the
host): with several gunicorn workers a per-process counter would allow workers x MAX_FAILURES
guesses. We use the cache API directly rather than django-ratelimit or django-axes: the rule is
one counter with one key, and those would bring their own key functions, models and middleware to
say the same.
"""

from __future__ import annotations

import hashlib
import unicodedata

from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

MAX_FAILURES = 10  # per client address and username, per window
WINDOW_SECONDS = 300


def normalise_username(raw: str) -> str:
    """The form of a username that the limit counts: NFKC (as Django normalises usernames, so the
    full-width "ｖｉｅｗｅｒ" is "viewer"), case-folded and stripped, so no spelling of one name
    gets a fresh allowance of guesses."""
    return unicodedata.normalize("NFKC", raw[:150]).casefold().strip()


def failure_key(request: HttpRequest) -> str:
    username = normalise_username(request.POST.get("username") or "")
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[
        :32
    ]  # any text, safe key
    return f"login-fail:{request.META.get('REMOTE_ADDR', '')}:{digest}"


class LoginView(auth_views.LoginView):
    """Django's login view with a failure rate limit. Passwords are never logged."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if cache.get(failure_key(request), 0) >= MAX_FAILURES:
            response = self.render_to_response(
                {
                    "form": self.get_form(),
                    "rate_limited": True,
                    "next": request.POST.get("next", ""),
                }
            )
            response.status_code = 429
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):  # type: ignore[override]
        key = failure_key(self.request)
        cache.add(key, 0, WINDOW_SECONDS)
        try:
            cache.incr(key)  # atomic on Redis: concurrent failures on several workers all count
        except ValueError:  # expired between add and incr
            cache.set(key, 1, WINDOW_SECONDS)
        return super().form_invalid(form)

from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

MAX_FAILURES = 10  # per client address and username, per window
WINDOW_SECONDS = 300


def _key(request: HttpRequest) -> str:
    username = (request.POST.get("username") or "")[:150].lower()
    return f"login-fail:{request.META.get('REMOTE_ADDR', '')}:{username}"


class LoginView(auth_views.LoginView):
    """Django's login view with a failure rate limit. Passwords are never logged."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        key = _key(request)
        if cache.get(key, 0) >= MAX_FAILURES:
            response = self.render_to_response(
                {"form": self.get_form(), "rate_limited": True, "next": request.POST.get("next", "")}
            )
            response.status_code = 429
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):  # type: ignore[override]
        key = _key(self.request)
        cache.add(key, 0, WINDOW_SECONDS)
        cache.incr(key)
        return super().form_invalid(form)

"""The login rate limit holds across server processes: two `runserver` processes on one database and
the configured cache (the broker's Redis when CELERY_BROKER_URL is Redis, else the file cache under
RD_VAR_DIR), failed logins sent to them in turn, and the limit trips after MAX_FAILURES in total,
not per process."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.conftest import database_url_for_children
from tests.reliability.conftest import Server
from webapp.accounts.views import MAX_FAILURES


def post_login(
    opener: urllib.request.OpenerDirector, base: str, username: str, password: str
) -> int:
    page = opener.open(f"{base}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    body = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token}
    )
    request = urllib.request.Request(
        f"{base}/accounts/login/", data=body.encode(), headers={"Referer": base}
    )
    try:
        return opener.open(request, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a successful login's 302 is the answer we want to see


@pytest.mark.slow
def test_it_counts_failed_logins_across_server_processes(transactional_db, tmp_path, settings):
    from django.contrib.auth import get_user_model

    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher"
    ]  # what the servers check
    username = (
        f"limit-{uuid.uuid4().hex[:8]}"  # the shared cache outlives this test: a fresh bucket
    )
    get_user_model().objects.create_user(username=username, password="the-right-pass-word")
    servers = [Server(database_url_for_children(), tmp_path / f"server{i}.log") for i in range(2)]
    for s in servers:
        s.start()
    try:
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), NoRedirect()
        )
        codes = [
            post_login(opener, servers[i % 2].url, username, f"wrong-{i}")
            for i in range(MAX_FAILURES)
        ]
        assert codes == [200] * MAX_FAILURES
        assert post_login(opener, servers[0].url, username, "wrong-again") == 429
        assert post_login(opener, servers[1].url, f" {username.upper()} ", "wrong-again") == 429
        assert post_login(opener, servers[1].url, username, "the-right-pass-word") == 429
    finally:
        for s in servers:
            s.stop()

"""Deployment security, measured against the real settings module with DEBUG=0 (in a subprocess,
since settings are read once per process): `check --deploy` is clean, cookies are Secure and
HttpOnly behind TLS, the security headers are sent; and in process: the login rate limit, and
passwords never logged."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache
from django.core.management import call_command

from tests.conftest import PASSWORD

ROOT = Path(__file__).resolve().parents[2]


def _prod_env(tmp_path: Path) -> dict[str, str]:
    alphabet = string.ascii_letters + string.digits + "!@#%^&*(-_=+)"
    # DJANGO_ALLOW_ASYNC_UNSAFE is set by the browser tests' conftest (Playwright runs an event
    # loop); a production process never has it, and check --deploy rightly refuses it.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    env.update(
        DEBUG="0",
        SECRET_KEY="".join(secrets.choice(alphabet) for _ in range(50)),
        ALLOWED_HOSTS="example.com",
        RD_VAR_DIR=str(tmp_path / "var"),
        DJANGO_SETTINGS_MODULE="webapp.settings",
    )
    return env


@pytest.mark.slow
def test_it_passes_check_deploy_with_debug_off(tmp_path):
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=_prod_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout, out.stdout + out.stderr
    assert "WARNING" not in out.stderr and "?: (security" not in out.stdout + out.stderr


_PROBE = r"""
import json, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from django.test import Client
get_user_model().objects.create_user("alice", password="s3cure-pass-word")
c = Client(HTTP_HOST="example.com")
page = c.get("/accounts/login/", secure=True)
creds = {"username": "alice", "password": "s3cure-pass-word"}
login = c.post("/accounts/login/", creds, secure=True)
plain = Client(HTTP_HOST="example.com").get("/accounts/login/")
proxied = Client(HTTP_HOST="example.com").get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
def cookie(resp, name):
    m = resp.cookies.get(name)
    return None if m is None else {"secure": bool(m["secure"]), "httponly": bool(m["httponly"]),
                                   "samesite": m["samesite"]}
print(json.dumps({
    "page": page.status_code, "login": login.status_code,
    "plain": [plain.status_code, plain.get("Location")],
    "proxied": proxied.status_code,
    "csrf": cookie(page, "csrftoken"), "session": cookie(login, "sessionid"),
    "headers": {h: page.get(h) for h in ("X-Content-Type-Options", "Referrer-Policy",
                                         "X-Frame-Options", "Strict-Transport-Security",
                                         "Cross-Origin-Opener-Policy")},
    "proxied_hsts": proxied.get("Strict-Transport-Security"),
}))
"""


@pytest.mark.slow
def test_it_sends_secure_cookies_and_security_headers_behind_tls(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env=_prod_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["page"] == 200 and r["login"] == 302
    assert r["csrf"]["secure"] and r["session"]["secure"] and r["session"]["httponly"]
    h = r["headers"]
    assert h["X-Content-Type-Options"] == "nosniff"
    assert h["Referrer-Policy"] == "same-origin"
    assert h["X-Frame-Options"] == "DENY"
    assert h["Strict-Transport-Security"].startswith("max-age=31536000")
    assert r["plain"][0] == 301 and r["plain"][1].startswith(
        "https://"
    )  # plain HTTP is redirected to TLS
    assert (
        r["proxied"] == 200 and r["proxied_hsts"]
    )  # TLS terminated by a proxy (X-Forwarded-Proto: https)


def test_it_rate_limits_failed_logins_and_refuses_the_right_password_while_limited(
    client, personas
):
    cache.clear()
    for attempt in range(10):
        res = client.post(
            "/accounts/login/", {"username": "viewer", "password": f"wrong-{attempt}"}
        )
        assert res.status_code == 200, attempt
    assert (
        client.post("/accounts/login/", {"username": "viewer", "password": "wrong-10"}).status_code
        == 429
    )
    res = client.post("/accounts/login/", {"username": "viewer", "password": PASSWORD})
    assert res.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another user from the same address is not locked out by someone else's failures.
    assert (
        client.post("/accounts/login/", {"username": "trainer", "password": PASSWORD}).status_code
        == 302
    )
    cache.clear()


def test_it_never_logs_a_password(client, db, caplog, capsys, settings, monkeypatch):
    cache.clear()
    secret = "Pw-" + secrets.token_hex(8)
    wrong = "Wrong-" + secrets.token_hex(8)
    root = logging.getLogger()
    caplog.set_level(logging.DEBUG)
    settings.DEBUG = True  # the most verbose configuration: SQL logging on, debug error pages
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setenv("RD_PASSWORD", secret)  # the documented way: never on a command line
    call_command("createuser", "carol", "--role", "annotator", stdout=out, stderr=err)
    assert (
        client.post("/accounts/login/", {"username": "carol", "password": wrong}).status_code == 200
    )
    assert (
        client.post("/accounts/login/", {"username": "carol", "password": secret}).status_code
        == 302
    )
    client.logout()
    for _ in range(11):  # into the rate limit, whose response must not echo the password either
        res = client.post("/accounts/login/", {"username": "carol", "password": wrong})
    assert res.status_code == 429
    assert wrong not in res.content.decode()
    captured = capsys.readouterr()
    everything = caplog.text + out.getvalue() + err.getvalue() + captured.out + captured.err
    assert caplog.records, "nothing was logged at all: the capture is not working"
    assert secret not in everything and wrong not in everything
    assert root.level <= logging.DEBUG or caplog.handler.level <= logging.DEBUG
    cache.clear()

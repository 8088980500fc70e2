"""Login rate limit keyed on the normalised username, and `createuser` without a
password on argv."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import CommandError, call_command

from tests.conftest import PASSWORD
from webapp.accounts.views import MAX_FAILURES, normalise_username

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()  # the tests' own in-process cache (tests/conftest.py), never the shared one
    yield
    cache.clear()


def test_it_normalises_usernames_like_django_then_folds_case_and_spaces():
    assert (
        normalise_username("ｖｉｅｗｅｒ") == "viewer"
    )  # full-width: NFKC, as Django normalises usernames
    assert normalise_username("  Viewer \t") == "viewer"
    assert normalise_username("STRASSE") == normalise_username("straße")  # casefold, not lower


@pytest.mark.parametrize("variant", ["viewer ", " viewer", "VIEWER", "ｖｉｅｗｅｒ", "Ｖiewer\t"])
def test_it_counts_every_spelling_of_a_username_in_one_bucket(client, personas, variant):
    for attempt in range(MAX_FAILURES):
        name = (
            "viewer" if attempt % 2 else variant
        )  # alternate spellings: one counter for all of them
        assert (
            client.post(
                "/accounts/login/", {"username": name, "password": f"no-{attempt}"}
            ).status_code
            == 200
        )
    assert (
        client.post("/accounts/login/", {"username": variant, "password": "again"}).status_code
        == 429
    )
    assert (
        client.post("/accounts/login/", {"username": "viewer", "password": PASSWORD}).status_code
        == 429
    )
    assert "_auth_user_id" not in client.session


def test_it_keeps_separate_buckets_per_client_address(client, personas):
    for _ in range(MAX_FAILURES):
        client.post(
            "/accounts/login/", {"username": "viewer", "password": "no"}, REMOTE_ADDR="10.0.0.1"
        )
    assert (
        client.post(
            "/accounts/login/", {"username": "viewer", "password": "no"}, REMOTE_ADDR="10.0.0.1"
        ).status_code
        == 429
    )
    assert (
        client.post(
            "/accounts/login/", {"username": "viewer", "password": PASSWORD}, REMOTE_ADDR="10.0.0.2"
        ).status_code
        == 302
    )


# ---- createuser


def test_it_reads_the_password_from_the_environment_variable_it_is_told(db, monkeypatch):
    monkeypatch.setenv("ALICE_PW", "s3cure-pass-word")
    call_command(
        "createuser",
        "alice",
        "--password-env",
        "ALICE_PW",
        "--role",
        "trainer",
        stdout=io.StringIO(),
    )
    assert get_user_model().objects.get(username="alice").check_password("s3cure-pass-word")


def test_it_reads_rd_password_by_default(db, monkeypatch):
    monkeypatch.setenv("RD_PASSWORD", "another-pass-word")
    call_command("createuser", "bob", stdout=io.StringIO())
    assert get_user_model().objects.get(username="bob").check_password("another-pass-word")


def test_it_prompts_for_the_password_twice_on_a_terminal(db, monkeypatch):
    import webapp.accounts.management.commands.createuser as cmd

    monkeypatch.delenv("RD_PASSWORD", raising=False)
    answers = iter(["typed-pass-word", "typed-pass-word"])
    monkeypatch.setattr(cmd, "getpass", lambda prompt: next(answers))
    monkeypatch.setattr(cmd, "_interactive", lambda: True)
    call_command("createuser", "carol", stdout=io.StringIO())
    assert get_user_model().objects.get(username="carol").check_password("typed-pass-word")


def test_it_refuses_a_prompted_password_typed_differently_twice(db, monkeypatch):
    import webapp.accounts.management.commands.createuser as cmd

    monkeypatch.delenv("RD_PASSWORD", raising=False)
    answers = iter(["typed-pass-word", "typo-pass-word"])
    monkeypatch.setattr(cmd, "getpass", lambda prompt: next(answers))
    monkeypatch.setattr(cmd, "_interactive", lambda: True)
    with pytest.raises(CommandError, match="did not match"):
        call_command("createuser", "carol", stdout=io.StringIO())
    assert not get_user_model().objects.filter(username="carol").exists()


def test_it_says_where_a_password_can_come_from_when_none_is_given(db, monkeypatch):
    import webapp.accounts.management.commands.createuser as cmd

    monkeypatch.delenv("RD_PASSWORD", raising=False)
    monkeypatch.setattr(cmd, "_interactive", lambda: False)
    with pytest.raises(CommandError, match="RD_PASSWORD"):
        call_command("createuser", "dave", stdout=io.StringIO())


def test_it_names_an_empty_or_missing_password_variable(db, monkeypatch):
    monkeypatch.delenv("NOPE_PW", raising=False)
    with pytest.raises(CommandError, match="--password-env: NOPE_PW is not set"):
        call_command("createuser", "erin", "--password-env", "NOPE_PW", stdout=io.StringIO())


def test_it_still_accepts_password_on_the_command_line_with_a_warning(db):
    err = io.StringIO()
    call_command(
        "createuser", "frank", "--password", "argv-pass-word", stdout=io.StringIO(), stderr=err
    )
    assert get_user_model().objects.get(username="frank").check_password("argv-pass-word")
    assert "visible to every user" in err.getvalue()


# ---- the shared cache the limit lives in


def test_it_builds_the_cache_from_its_url():
    from webapp.env import cache_settings

    redis = cache_settings("redis://cache:6379/3")
    assert redis["BACKEND"].endswith("RedisCache") and redis["LOCATION"] == "redis://cache:6379/3"
    assert cache_settings("file:///srv/rd/cache") == {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": "/srv/rd/cache",
    }
    assert cache_settings("locmem://")["BACKEND"].endswith("LocMemCache")


@pytest.mark.parametrize(
    "env, backend",
    [
        ({"CELERY_BROKER_URL": "redis://127.0.0.1:6379/5"}, "RedisCache redis://127.0.0.1:6379/5"),
        ({"CELERY_BROKER_URL": "filesystem://"}, "FileBasedCache {var}/cache/django"),
        (
            {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/5", "CACHE_URL": "file:///tmp/elsewhere"},
            "FileBasedCache /tmp/elsewhere",
        ),
    ],
)
def test_it_shares_the_brokers_redis_or_a_file_cache_by_default(env, backend, tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import os; os.environ['DJANGO_SETTINGS_MODULE'] = 'webapp.settings'; from django.conf "
        "import settings; c = settings.CACHES['default']; print(c['BACKEND'].rsplit('.', 1)[1], "
        "c['LOCATION'])"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("CACHE_URL", "CELERY_BROKER_URL")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "RD_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.stdout.strip() == backend.format(var=tmp_path), out.stderr[-2000:]

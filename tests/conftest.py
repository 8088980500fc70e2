"""Shared fixtures: the four role personas plus an outsider, a run with a 3-component environment,
and an API client factory. Integration fixtures (live server, worker) live beside their tests."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PASSWORD = "correct-horse-battery"


@pytest.fixture
def make_user(db):
    from django.contrib.auth import get_user_model

    from webapp.accounts.roles import set_role

    def make(username: str, role: str | None = "viewer"):
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        if role == "admin":
            user.is_staff = user.is_superuser = True
            user.save()
        if role:
            set_role(user, role)
        return user

    return make


@pytest.fixture
def personas(make_user) -> dict:
    return {role: make_user(role, role) for role in ("viewer", "annotator", "trainer", "admin")}


@pytest.fixture
def client_as(client, personas):
    def login(role: str | None):
        client.logout()
        if role is not None:
            client.force_login(personas[role])
        return client

    return login


@pytest.fixture
def env3(db):
    from webapp.rollouts.services import ensure_environment

    return ensure_environment(
        "toy",
        [
            {"name": "correct", "weight": 1.0, "kind": "outcome", "min_value": 0.0, "max_value": 1.0},
            {"name": "format", "weight": 0.5, "kind": "behavioural", "min_value": 0.0, "max_value": 1.0},
            {"name": "penalty", "weight": 0.2, "kind": "penalty", "min_value": -1.0, "max_value": 0.0},
        ],
    )


@pytest.fixture
def run(env3, personas):
    from webapp.rollouts.services import create_run

    return create_run(name="toy-run", kind="import", environment=env3, config={}, owner=personas["trainer"],
                      status="running")


def make_group(step: int, key: str, values: list[dict], prompt: str = "Solve it") -> dict:
    """A group record with one rollout per entry of `values` (component -> value)."""
    return {
        "step": step,
        "key": key,
        "prompt": prompt,
        "rollouts": [
            {"index": i, "completion": f"answer {key} {i}", "rewards": v, "length": 10 + i}
            for i, v in enumerate(values)
        ],
    }


@pytest.fixture
def api(db):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    def for_user(user):
        c = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        c.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return c

    return for_user


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2 costs ~0.5 s per user on two cores; tests create many users and check no hash strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

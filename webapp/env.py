"""Typed readers for settings from the environment. Each raises on a bad value,
naming the variable."""

from __future__ import annotations

import os


class ConfigError(ValueError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    raw = os.environ.get(name, default)
    scheme = raw.split("://", 1)[0] if "://" in raw else ""
    if scheme not in schemes:
        raise ConfigError(f"{name}: expected a URL with scheme {' or '.join(schemes)}, got {raw!r}")
    return raw


def cache_settings(url: str) -> dict:
    """Django's CACHES["default"] for a CACHE_URL (already checked by env_url)."""
    scheme, rest = url.split("://", 1)
    if scheme in ("redis", "rediss"):
        # Keys carry a prefix: the cache may share a Redis database with the Celery broker.
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "rd-cache",
        }
    if scheme == "file":
        return {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": rest or "/",
        }
    return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}

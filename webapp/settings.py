"""Settings, all from the environment (see webapp/env.py). Embedded defaults: SQLite
+ filesystem broker."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from webapp.env import ConfigError, cache_settings, env_bool, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(
    env_str("RD_VAR_DIR", str(BASE_DIR / "var"))
)  # runtime files: sqlite, broker, models, outputs

DEBUG = env_bool("DEBUG", True)
# Development default, refused when DEBUG=0
_DEV_SECRET = "dev-only-insecure-secret-key-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise ConfigError(
        "SECRET_KEY: the development default is refused when DEBUG=0; set a real secret"
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "webapp.accounts",
    "webapp.rollouts",
    "webapp.runs",
    "webapp.diagnostics",
    "webapp.annotations",
    "webapp.api",
    "webapp.replays",
    "webapp.tokens",
    "webapp.behaviours",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "webapp.accounts.middleware.LoginRequiredMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webapp.accounts.context.roles",
            ],
        },
    },
]

_default_db = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASE_URL = env_url("DATABASE_URL", _default_db, schemes=("sqlite", "postgres", "postgresql"))
DATABASES = {
    # DB_CONN_MAX_AGE > 0 (make serve's default, gunicorn.conf.py): a connection outlives its
    # request, checked before reuse so a restarted Postgres costs one retry-free reconnect,
    # not a 500.
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0), conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL lets the web server read while the worker writes; IMMEDIATE avoids upgrade deadlocks.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test_db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 8},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "accounts-login"
LOGIN_REDIRECT_URL = "runs-list"
LOGOUT_REDIRECT_URL = "accounts-login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # runserver and tests serve static without collectstatic

# Security: secure cookies and HSTS when not in DEBUG (behind TLS in production).
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Ingestion limits: a body or a group past these gets a 400 naming the limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 32 * 1024 * 1024, minimum=1024)
INGEST_MAX_GROUP_SIZE = env_int("INGEST_MAX_GROUP_SIZE", 1024, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "webapp.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "webapp.api.errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"login": env_str("LOGIN_RATE", "10/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Reward debugger API",
    "DESCRIPTION": "Ingest and query rollouts, groups and per-component rewards.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.IsAuthenticated"
    ],  # every page needs a login, the schema too
}

# Celery: Redis in production; kombu's filesystem transport as the embedded default (no server).
_broker_dir = VAR_DIR / "broker"
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", "filesystem://", schemes=("filesystem", "redis", "rediss", "amqp")
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(
            _broker_dir / "control"
        ),  # else kombu writes ./control in the working dir
        "store_processed": False,
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True  # state lives on the Run row, not in a result backend
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-task leaves the message for another worker
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a GPU worker must not hoard queued jobs it cannot run
CELERY_TASK_DEFAULT_QUEUE = "default"
WORKER_QUEUES = ("default", "gpu")  # webapp/celery.py declares them as kombu Queues
CELERY_TASK_ROUTES = {"workers.tasks.run_job": {"queue": "gpu"}}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# One cache shared by every server and worker process (the login rate limit must hold across
# gunicorn workers): CACHE_URL, else the broker's Redis when the broker is Redis, else files under
# VAR_DIR (shared by the processes of one host). redis://host:port/db, file:///path, or locmem://
# (one process only).
_redis_broker = CELERY_BROKER_URL.split("://", 1)[0] in ("redis", "rediss")
CACHE_URL = env_url(
    "CACHE_URL",
    CELERY_BROKER_URL if _redis_broker else f"file://{VAR_DIR / 'cache' / 'django'}",
    schemes=("redis", "rediss", "file", "locmem"),
)
CACHES = {"default": cache_settings(CACHE_URL)}

WORKER_DEVICE = env_str("WORKER_DEVICE", "auto")  # auto: CUDA when present, else CPU
WORKER_HEARTBEAT_SECONDS = env_int("WORKER_HEARTBEAT_SECONDS", 10, minimum=1)
RUNS_DIR = Path(env_str("RD_RUNS_DIR", str(VAR_DIR / "runs")))
MODELS_DIR = Path(env_str("RD_MODELS_DIR", str(VAR_DIR / "models")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

os.makedirs(STATIC_ROOT, exist_ok=True)  # whitenoise warns when it is missing (runserver, tests)

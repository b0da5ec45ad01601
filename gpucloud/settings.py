"""gpucloud settings. Every value comes from the environment (see docs/configuration in README).

Embedded defaults make `make demo` work on a laptop: a SQLite file, a filesystem
Celery broker and an in-process cache. Production sets DATABASE_URL (PostgreSQL),
REDIS_URL and CELERY_BROKER_URL.
"""
from __future__ import annotations

from pathlib import Path

import dj_database_url

from gpucloud.lib.env import env_bool, env_decimal, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUCLOUD_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and not env_bool("GPUCLOUD_INSECURE_DEFAULT_SECRET", False):
        # Refusing to start is kinder than signing sessions with a public key.
        raise RuntimeError("SECRET_KEY is not set (or set DEBUG=1 for a local demo)")
    SECRET_KEY = "insecure-local-demo-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "django_htmx",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served by us: no CDN behind a firewall
    "gpucloud.tenancy",
    "gpucloud.catalogue",
    "scheduler",
    "billing",
    "agents",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "gpucloud.lib.middleware.RejectNulMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gpucloud.urls"
WSGI_APPLICATION = "gpucloud.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "")
if not DATABASE_URL:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASE_URL = f"sqlite:///{VAR_DIR / 'gpucloud.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The demo's web, worker, beat and agents all write. Take SQLite's write lock at BEGIN, so
    # a second writer waits (up to `timeout` s) instead of failing at once with "database is
    # locked" when its read transaction tries to upgrade; WAL lets readers go on meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        transaction_mode="IMMEDIATE", timeout=20, init_command="PRAGMA journal_mode=WAL;"
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "gpucloud"),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = DEBUG

LOGIN_URL = "/api/auth/login/"

# Behind a TLS-terminating proxy the client address is the first X-Forwarded-For hop.
TRUST_X_FORWARDED_FOR = env_bool("TRUST_X_FORWARDED_FOR", False)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gpucloud.api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "gpucloud.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "gpucloud.api.filters.StrictFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["gpucloud.api.throttling.PerKeyThrottle"],
    "DEFAULT_THROTTLE_RATES": {"per_key": env_str("API_RATE_LIMIT", "600/min")},
    "EXCEPTION_HANDLER": "gpucloud.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # The API speaks JSON only, as its schema says: a form or multipart body is a 415, not a
    # second dialect in which "" means null and a list is one repeated field.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "gpucloud API",
    "DESCRIPTION": (
        "Rent GPUs and run batch jobs on a gpucloud installation. Authenticate with "
        "`Authorization: Bearer <api key>`. Every error has the shape "
        '`{"error": {"code", "message", "fields"}}`.'
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpucloud.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RoleEnum": "gpucloud.tenancy.choices.Role",
        "PriceKindEnum": "gpucloud.catalogue.choices.PriceKind",
        "WorkloadStateEnum": "scheduler.choices.State",
        "WorkloadKindEnum": "scheduler.choices.WorkloadKind",
    },
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
if CELERY_BROKER_URL == "filesystem://":
    # A broker with no server for the laptop demo: kombu passes messages through files.
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"

# Tenancy and catalogue policy.
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 400)
INVITATION_TTL_DAYS = env_int("INVITATION_TTL_DAYS", 7)
DEFAULT_PLAN = env_str("DEFAULT_PLAN", "starter")
# Plan defaults for quotas; Quota rows per tenant override or narrow them.
PLAN_QUOTAS: dict[str, dict[str, int]] = {
    "starter": {"max_gpus": 8, "max_instances": 8},
    "team": {"max_gpus": 64, "max_instances": 32},
    "enterprise": {"max_gpus": 1024, "max_instances": 512},
}

# Prometheus scrapes /metrics; with a token set it must send `Authorization: Bearer <token>`.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# Scheduler.
SCHEDULER_POLICY = env_str("SCHEDULER_POLICY", "gpucloud")
SCHEDULER_TICK_S = env_int("SCHEDULER_TICK_S", 2)
SCHEDULER_CYCLE_TIME_LIMIT_S = env_int("SCHEDULER_CYCLE_TIME_LIMIT_S", 60)
# One cycle per region at a time. Only the concurrency tests switch this off, to
# prove the database alone still refuses a double booking.
SCHEDULER_LOCK = env_bool("SCHEDULER_LOCK", True)

# Host agents (docs/agent.md). Agents heartbeat every AGENT_HEARTBEAT_INTERVAL_S; a host
# silent for HOST_DOWN_AFTER_S goes DOWN (no new work), and the work of a host DOWN for
# HOST_LOST_GRACE_S more becomes LOST (GPUs freed, jobs requeued).
AGENT_HEARTBEAT_INTERVAL_S = env_int("AGENT_HEARTBEAT_INTERVAL_S", 5)
HOST_DOWN_AFTER_S = env_int("HOST_DOWN_AFTER_S", 30)
HOST_LOST_GRACE_S = env_int("HOST_LOST_GRACE_S", 120)
AGENT_PIDS_LIMIT = env_int("AGENT_PIDS_LIMIT", 4096)
AGENT_RATE_LIMIT = env_str("AGENT_RATE_LIMIT", "120/min")  # per host; heartbeats need 12/min
# GPU samples from heartbeats: raw for an hour, then 1-minute averages for 30 days.
GPU_SAMPLE_RAW_RETENTION_S = env_int("GPU_SAMPLE_RAW_RETENTION_S", 3600)
GPU_SAMPLE_MINUTE_RETENTION_DAYS = env_int("GPU_SAMPLE_MINUTE_RETENTION_DAYS", 30)

# Billing (docs/billing.md). Money is Decimal, read from the environment exactly.
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "USD")
# Every new tenant starts with this credit: generous, so a newcomer can launch at once.
BILLING_SIGNUP_CREDIT = env_decimal("BILLING_SIGNUP_CREDIT", "1000.00")
BILLING_LOW_BALANCE = env_decimal("BILLING_LOW_BALANCE", "10.00")  # warn below this
# At zero balance spot work stops at once; on-demand work after this grace.
BILLING_GRACE_S = env_int("BILLING_GRACE_S", 3600)
BILLING_PAYMENT_PROVIDER = env_str("BILLING_PAYMENT_PROVIDER", "billing.payments.NullProvider")
BILLING_WEBHOOK_TIMEOUT_S = env_int("BILLING_WEBHOOK_TIMEOUT_S", 5)
# Usage is posted in closed windows of METERING_INTERVAL_S, METERING_SETTLE_S behind the
# clock so that every transition of the window has committed.
METERING_INTERVAL_S = env_int("METERING_INTERVAL_S", 60)
METERING_SETTLE_S = env_int("METERING_SETTLE_S", 30)
SPOT_FLOOR_FRACTION = env_decimal("SPOT_FLOOR_FRACTION", "0.30")  # where no SpotFloor row says
SPOT_RECOMPUTE_S = env_int("SPOT_RECOMPUTE_S", 60)
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpucloud <noreply@localhost>")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

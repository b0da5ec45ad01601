"""gpucloud settings. Every value comes from the environment (see docs/configuration in README).

Embedded defaults make `make demo` work on a laptop: a SQLite file, a Celery broker
on a second SQLite file and an in-process cache. Production sets DATABASE_URL (PostgreSQL),
REDIS_URL and CELERY_BROKER_URL.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url

from gpucloud.lib.env import EnvError, env_bool, env_decimal, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUCLOUD_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        # Refusing to start is kinder than signing sessions with a public key. There is no
        # switch around this: only the DEBUG demo gets the key below.
        raise RuntimeError("SECRET_KEY is not set (or set DEBUG=1 for a local demo)")
    SECRET_KEY = "insecure-local-demo-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Under /api/ and /agent/ a refused CSRF check answers in the API's error shape, not HTML.
CSRF_FAILURE_VIEW = "gpucloud.api.errors.csrf_failure"

# HTTPS. The defaults are production's (`manage.py check --deploy` is clean with them); DEBUG
# relaxes them for the laptop demo on plain http. Each can be set on its own.
_HTTPS = not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _HTTPS)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # load balancers probe over plain http
if env_bool("TRUST_X_FORWARDED_PROTO", False):
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips the client's own),
    # or every request looks like http and SECURE_SSL_REDIRECT loops.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _HTTPS)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if _HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _HTTPS)
# Preloading is a promise about the whole registrable domain that takes months to undo: the
# operator opts in. Until then Django's reminder (W021) is silenced, and only that one.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    # Django's admin with our site class: two-factor for operators (gpucloud/admin_site.py).
    "gpucloud.apps.AdminConfig",
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
    "axes",  # failed sign-ins and lockouts (AccessAttempt, AccessLog in the admin)
    "django_otp",
    "django_otp.plugins.otp_totp",  # TOTP two-factor devices
    "gpucloud.tenancy",
    "gpucloud.catalogue",
    "scheduler",
    "billing",
    "agents",
    "alarms",
    "volumes",
    "frontend",
    "autoscaling",
    "notifications",
    "gateway",  # no models: its AppConfig gives the instances' resource its connect hints
]

MIDDLEWARE = [
    # First: a body over MAX_REQUEST_BODY_BYTES is refused before any middleware reads it.
    "gpucloud.lib.middleware.RequestBodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "gpucloud.lib.middleware.RejectNulMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",  # request.user.is_verified(): a second factor this session
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes asks: turns a refused (locked-out) sign-in into the lockout response.
    "axes.middleware.AxesMiddleware",
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
        # Before each request's first query, check that a kept connection still works (one
        # round trip), so a restarted or failed-over server costs no request an error.
        conn_health_checks=env_bool("DB_CONN_HEALTH_CHECKS", False),
    )
}
# DB_POOL_SIZE > 0 (the web server sets it): the process's threads share a psycopg pool of at
# most that many connections (Django's own pool). A request takes one at its first query and
# gives it back at its end, and a parked long poll gives its back while it waits, so neither an
# idle thread nor a parked heartbeat holds a connection and none is opened per request.
DB_POOL_SIZE = env_int("DB_POOL_SIZE", 0)
if DB_POOL_SIZE > 0 and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them; Django's kept ones can't mix
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1, "max_size": DB_POOL_SIZE, "timeout": env_int("DB_POOL_TIMEOUT_S", 30),
        "max_lifetime": env_int("DB_POOL_MAX_LIFETIME_S", 3600),
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
            "BACKEND": "gpucloud.lib.cache.RedisCache",  # one client per pool, not per call
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "gpucloud"),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# The gateway (python -m gateway, docs/connect.md): SSH into instances through the agents' tunnels.
GATEWAY_BIND = env_str("GATEWAY_BIND", "127.0.0.1")
GATEWAY_SSH_PORT = env_int("GATEWAY_SSH_PORT", 2222)
GATEWAY_TUNNEL_PORT = env_int("GATEWAY_TUNNEL_PORT", 8022)
GATEWAY_HOST_KEY_PATH = Path(env_str("GATEWAY_HOST_KEY_PATH", str(VAR_DIR / "gateway_host_key")))
GATEWAY_REPLICA = env_str("GATEWAY_REPLICA", "gw-1")
GATEWAY_SESSION_LIMIT = env_int("GATEWAY_SESSION_LIMIT", 20)
# Relaying between replicas (gateway/relay.py): each listens on GATEWAY_RELAY_PORT (0: any free
# port; advertised in Redis either way) for the others, reached at GATEWAY_RELAY_HOST (empty: the
# bind address, or this machine's address when bound to all), authenticated by GATEWAY_RELAY_SECRET
# (empty: derived from SECRET_KEY, which replicas share).
GATEWAY_RELAY_PORT = env_int("GATEWAY_RELAY_PORT", 8023)
GATEWAY_RELAY_HOST = env_str("GATEWAY_RELAY_HOST", "")
GATEWAY_RELAY_SECRET = env_str("GATEWAY_RELAY_SECRET", "")
# Where users reach the gateway: the host and port in the `connect` hints of the API and console.
GATEWAY_PUBLIC_HOST = env_str("GATEWAY_PUBLIC_HOST", "127.0.0.1")
GATEWAY_PUBLIC_SSH_PORT = env_int("GATEWAY_PUBLIC_SSH_PORT", GATEWAY_SSH_PORT)
# The gateway's HTTP side: published container ports at <url>/i/<instance id>/<port>/, the web terminal.
GATEWAY_HTTP_PORT = env_int("GATEWAY_HTTP_PORT", 8088)
GATEWAY_PUBLIC_HTTP_URL = env_str("GATEWAY_PUBLIC_HTTP_URL", f"http://{GATEWAY_PUBLIC_HOST}:{GATEWAY_HTTP_PORT}")

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

# Sign-in security (docs/architecture.md "Sign-in"). django-axes goes first: it refuses a
# locked-out sign-in before any backend checks the password, on every path that calls
# `authenticate(request=...)` (console, /api/auth/login/, /admin/login/).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"  # rows: PostgreSQL and SQLite alike
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15))
# Either is enough to lock: failures against one account (from anywhere), or from one address
# (against any accounts).
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# Not reset on success: with "either locks", a success deletes every row of that address too,
# so an attacker could clear their count against someone else by signing in to their own
# account. Failures age out after the cool-off instead.
AXES_RESET_ON_SUCCESS = False
# Attempts during a lockout neither count nor extend it: the lock ends LOGIN_LOCKOUT_MINUTES
# after it began, however often an attacker keeps knocking.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_USERNAME_CALLABLE = "gpucloud.tenancy.lockout.username_of"
AXES_CLIENT_IP_CALLABLE = "gpucloud.tenancy.lockout.client_address"
AXES_LOCKOUT_CALLABLE = "gpucloud.tenancy.lockout.lockout_response"
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "otp_token"]
# Two-factor: staff may not use /admin/ without a verified TOTP device when this is on.
REQUIRE_2FA_FOR_STAFF = env_bool("REQUIRE_2FA_FOR_STAFF", False)
OTP_TOTP_ISSUER = env_str("OTP_TOTP_ISSUER", "gpucloud")
# Password-reset links (Django's) stay valid this long.
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT_S", 3 * 3600)

# The client's address (rate limits, the audit log's source IP; gpucloud.lib.http.client_ip):
# REMOTE_ADDR, or behind TRUSTED_PROXY_HOPS proxies that each append to X-Forwarded-For, the
# address the outermost of them saw (the Nth entry from the right). TRUST_X_FORWARDED_FOR=1
# is the older spelling of one hop.
TRUST_X_FORWARDED_FOR = env_bool("TRUST_X_FORWARDED_FOR", False)
TRUSTED_PROXY_HOPS = env_int("TRUSTED_PROXY_HOPS", 1 if TRUST_X_FORWARDED_FOR else 0)
if TRUSTED_PROXY_HOPS < 0:
    raise EnvError(f"TRUSTED_PROXY_HOPS={TRUSTED_PROXY_HOPS} must be 0 or more")

# The largest request body any view reads (API, agents, console forms), in bytes. Heartbeats
# carry up to 1 MiB of log tails as JSON (agents.protocol.HEARTBEAT_LOGS_MAX_BYTES). A larger
# body is answered 413 before anything reads it (gpucloud.lib.middleware.RequestBodyLimitMiddleware).
MAX_REQUEST_BODY_BYTES = env_int("MAX_REQUEST_BODY_BYTES", 4 * 1024 * 1024)
if MAX_REQUEST_BODY_BYTES < 64 * 1024:
    raise EnvError(f"MAX_REQUEST_BODY_BYTES={MAX_REQUEST_BODY_BYTES} is too small for a heartbeat (min 65536)")
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES  # Django's own check of request.body agrees

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
    "NUM_PROXIES": TRUSTED_PROXY_HOPS,
    "DEFAULT_THROTTLE_RATES": {
        # 50/s: above what one automation client submits and polls here (docs/benchmarks.md,
        # "End to end"); arrays make bulk work one request.
        "per_key": env_str("API_RATE_LIMIT", "3000/min"),
        # Sign-ups per client address (API and console alike).
        "signup": env_str("SIGNUP_RATE_LIMIT", "10/hour"),
    },
    "EXCEPTION_HANDLER": "gpucloud.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # The API speaks JSON only, as its schema says: a form or multipart body is a 415, not a
    # second dialect in which "" means null and a list is one repeated field. JSON nested past a
    # sane depth, or text that is not Unicode, is a 400 (gpucloud.api.parsers).
    "DEFAULT_PARSER_CLASSES": ["gpucloud.api.parsers.JSONParser"],
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
        "ScalingPolicyKindEnum": "autoscaling.choices.PolicyKind",
        "ScalingPolicyMetricEnum": "autoscaling.choices.PolicyMetric",
        "ActivityKindEnum": "autoscaling.choices.ActivityKind",
        "JobArrayStateEnum": "scheduler.arrays.ARRAY_STATES",
        "AlarmStateEnum": "alarms.choices.AlarmState",
        "NotificationDeliveryEnum": "notifications.choices.Delivery",
    },
}

# No broker server for the laptop demo: messages are rows of a SQLite file of their own
# (gpucloud/lib/broker.py; docs/architecture.md says why not kombu's filesystem transport).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL or f"sqlite:///{VAR_DIR / 'broker.sqlite3'}")
if CELERY_BROKER_URL.startswith("sqlite:"):
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT = "gpucloud.lib.broker:Transport"
    # The SQLite transport has no broadcast: no remote control, events or mingle to wait for.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Beat keeps its schedule in Redis under a lock (celery-redbeat): a second beat (the HA
    # profile runs a standby) waits for the lock instead of firing every tick twice, and takes
    # over BEAT_LOCK_TIMEOUT_S after the first one died. The demo's SQLite broker has no Redis:
    # it keeps Celery's file scheduler, with one beat.
    BEAT_LOCK_TIMEOUT_S = env_int("BEAT_LOCK_TIMEOUT_S", 30)
    CELERY_BEAT_SCHEDULER = "redbeat.RedBeatScheduler"
    CELERY_REDBEAT_REDIS_URL = CELERY_BROKER_URL
    CELERY_REDBEAT_LOCK_TIMEOUT = BEAT_LOCK_TIMEOUT_S
    CELERY_BEAT_MAX_LOOP_INTERVAL = max(1, BEAT_LOCK_TIMEOUT_S // 5)  # the lock is renewed every loop
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"

# Tenancy and catalogue policy.
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 400)
INVITATION_TTL_DAYS = env_int("INVITATION_TTL_DAYS", 7)
DEFAULT_PLAN = env_str("DEFAULT_PLAN", "starter")
# Anyone may create an account and a tenant at /console/signup/ and POST /api/v1/auth/signup.
OPEN_SIGNUP = env_bool("OPEN_SIGNUP", True)
# How long the link that confirms a new account's email address (and so grants the
# sign-up credit) stays valid.
EMAIL_VERIFICATION_TTL_HOURS = env_int("EMAIL_VERIFICATION_TTL_HOURS", 72)
# Password-reset mails (docs/security.md): at most this many per e-mail address and per client
# address ("N/period"); a request past either limit gets the same answer and sends nothing.
PASSWORD_RESET_RATE_LIMIT_EMAIL = env_str("PASSWORD_RESET_RATE_LIMIT_EMAIL", "3/hour")
PASSWORD_RESET_RATE_LIMIT_IP = env_str("PASSWORD_RESET_RATE_LIMIT_IP", "10/hour")
# Plan defaults for quotas; Quota rows per tenant override or narrow them.
PLAN_QUOTAS: dict[str, dict[str, int]] = {
    "starter": {"max_gpus": 8, "max_instances": 8},
    "team": {"max_gpus": 64, "max_instances": 32},
    "enterprise": {"max_gpus": 1024, "max_instances": 512},
}

# Volumes (volumes/, docs/volumes.md): the most GiB of live volumes a tenant holds, by plan;
# how long a deleted volume's data is kept before the purge removes it from its host.
VOLUME_QUOTA_GIB: dict[str, int] = {"starter": 1024, "team": 16 * 1024, "enterprise": 256 * 1024, "default": 1024}
VOLUME_PURGE_GRACE_S = env_int("VOLUME_PURGE_GRACE_S", 24 * 3600)
# The largest volume (its tar) an operator can move between hosts: the control plane relays
# the data through PostgreSQL (docs/volumes.md "Moving a volume").
VOLUME_MOVE_MAX_BYTES = env_int("VOLUME_MOVE_MAX_BYTES", 8 * 1024**3)

# Prometheus scrapes /metrics with `Authorization: Bearer <token>`. With no token /metrics is
# served only when DEBUG (the demo); otherwise it answers 403.
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
# An agent whose registration answer was lost repeats it with the same bootstrap token and
# registration nonce within this many seconds of the first and gets the same host again.
REGISTER_RETRY_WINDOW_S = env_int("REGISTER_RETRY_WINDOW_S", 600)
AGENT_PIDS_LIMIT = env_int("AGENT_PIDS_LIMIT", 4096)
# The bound on starting (docs/lifecycle.md): a workload whose container failed to start this
# many times in a row, or that is still SCHEDULED/STARTING this many seconds after its
# placement, ends FAILED with the runtime's message and frees its GPUs (never billed: billing
# counts RUNNING only). A running instance whose container was lost more than
# WORKLOAD_CONTAINER_LOSSES times ends FAILED instead of being recreated again.
WORKLOAD_START_ATTEMPTS = env_int("WORKLOAD_START_ATTEMPTS", 3)
WORKLOAD_START_TIMEOUT_S = env_int("WORKLOAD_START_TIMEOUT_S", 900)
WORKLOAD_CONTAINER_LOSSES = env_int("WORKLOAD_CONTAINER_LOSSES", 3)
AGENT_RATE_LIMIT = env_str("AGENT_RATE_LIMIT", "120/min")  # per host; heartbeats need 12/min
# Long polls (POST /agent/v1/wait, agents/longpoll.py) one web process holds at once; each holds
# a thread, so keep it below gunicorn's --threads. 0: off (agents wait out their interval).
AGENT_LONGPOLL_SLOTS = env_int("AGENT_LONGPOLL_SLOTS", 0)
# GPU samples from heartbeats: raw for an hour, then 1-minute averages for 30 days.
GPU_SAMPLE_RAW_RETENTION_S = env_int("GPU_SAMPLE_RAW_RETENTION_S", 3600)
# Autoscaling (docs/autoscaling.md): the beat's tick evaluates every group each AUTOSCALING_TICK_S,
# a group at most once per AUTOSCALING_MIN_INTERVAL_S, however many workers run the tick; a change
# to a group queues an evaluation at once.
AUTOSCALING_TICK_S = env_int("AUTOSCALING_TICK_S", 30)
AUTOSCALING_MIN_INTERVAL_S = env_int("AUTOSCALING_MIN_INTERVAL_S", 15)
AUTOSCALING_RECONCILE_ON_CHANGE = env_bool("AUTOSCALING_RECONCILE_ON_CHANGE", True)
GPU_SAMPLE_MINUTE_RETENTION_DAYS = env_int("GPU_SAMPLE_MINUTE_RETENTION_DAYS", 30)

# Billing (docs/billing.md). Money is Decimal, read from the environment exactly.
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "USD")
# Every new tenant starts with this credit; a self-signed-up one once its owner confirms
# their email address (operators' `create_tenant` and the demo grant it at once).
BILLING_SIGNUP_CREDIT = env_decimal("BILLING_SIGNUP_CREDIT", "1000.00")
BILLING_LOW_BALANCE = env_decimal("BILLING_LOW_BALANCE", "10.00")  # warn below this
# At zero balance spot work stops at once; on-demand work after this grace.
BILLING_GRACE_S = env_int("BILLING_GRACE_S", 3600)
BILLING_PAYMENT_PROVIDER = env_str("BILLING_PAYMENT_PROVIDER", "billing.payments.NullProvider")
BILLING_WEBHOOK_TIMEOUT_S = env_int("BILLING_WEBHOOK_TIMEOUT_S", 5)
# Adding credit (docs/billing.md): the smallest and largest top-up a renter may ask for, and
# Stripe Checkout's keys when BILLING_PAYMENT_PROVIDER is billing.payments.StripeCheckoutProvider.
# The key and the webhook secret are secrets: read here only, never logged or shown.
BILLING_TOPUP_MIN = env_decimal("BILLING_TOPUP_MIN", "5.00")
BILLING_TOPUP_MAX = env_decimal("BILLING_TOPUP_MAX", "10000.00")
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "")
STRIPE_API_BASE = env_str("STRIPE_API_BASE", "https://api.stripe.com")  # a stand-in's address in tests
STRIPE_WEBHOOK_TOLERANCE_S = env_int("STRIPE_WEBHOOK_TOLERANCE_S", 300)
# A metering run refreshes a month's draft invoice it posted into when the draft is missing or
# older than this (the hourly invoices task refreshes them all): billing.services.invoices_follow.
INVOICE_DRAFT_REFRESH_S = env_int("INVOICE_DRAFT_REFRESH_S", 300)
# Outbound URLs (webhooks) must be https to a public address. 1 also allows http and private,
# loopback and CGNAT addresses: for a demo or tests, never on a shared installation. Link-local
# and metadata addresses (169.254.169.254) stay refused either way (gpucloud/lib/outbound.py).
WEBHOOK_ALLOW_PRIVATE = env_bool("WEBHOOK_ALLOW_PRIVATE", False)
# Usage is posted in closed windows of METERING_INTERVAL_S, METERING_SETTLE_S behind the
# clock so that every transition of the window has committed.
METERING_INTERVAL_S = env_int("METERING_INTERVAL_S", 60)
METERING_SETTLE_S = env_int("METERING_SETTLE_S", 30)
# A metering run posts this many workloads' windows per transaction (a few statements each
# chunk): bigger chunks cost fewer round trips, smaller ones hold the meters' and accounts'
# locks for less time.
METERING_CHUNK = env_int("METERING_CHUNK", 500)
SPOT_FLOOR_FRACTION = env_decimal("SPOT_FLOOR_FRACTION", "0.30")  # where no SpotFloor row says
SPOT_RECOMPUTE_S = env_int("SPOT_RECOMPUTE_S", 60)
# Alarms (docs/alarms.md): a period is evaluated once it ended this long ago (its samples have
# arrived); a failing action (a webhook answering 5xx) is tried this many times with backoff.
ALARM_EVAL_DELAY_S = env_int("ALARM_EVAL_DELAY_S", 15)
ALARM_ACTION_MAX_ATTEMPTS = env_int("ALARM_ACTION_MAX_ATTEMPTS", 8)
# Notifications (docs/notifications.md): a log entry is read once it is this old (its transaction
# has committed), and a person gets at most this many notification e-mails an hour (the rest stay
# in their console inbox). The links in e-mails start with PUBLIC_URL (the console's address).
NOTIFY_SETTLE_S = env_int("NOTIFY_SETTLE_S", 3)
NOTIFY_EMAIL_PER_HOUR = env_int("NOTIFY_EMAIL_PER_HOUR", 20)
PUBLIC_URL = env_str("PUBLIC_URL", "http://127.0.0.1:8000")
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

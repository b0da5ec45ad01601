"""Settings for the test suite: the real engines (PostgreSQL, Redis) on this machine by default.

Environment variables still win, so CI or a developer can point the suite elsewhere.
"""
from __future__ import annotations

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucloud")
# A Redis database of its own, so the tests' FLUSHDB between cases touches nothing else.
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
# The broker gets its own database too: clearing the cache must not eat queued tasks.
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("SECRET_KEY", "test-only-secret-key")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
# The test client and the live server speak plain http: production's https defaults off here
# (tests/test_deploy.py checks those defaults with `check --deploy`).
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
os.environ.setdefault("SESSION_COOKIE_SECURE", "0")
os.environ.setdefault("CSRF_COOKIE_SECURE", "0")
os.environ.setdefault("SECURE_HSTS_SECONDS", "0")

from gpucloud.settings import *  # noqa: E402,F403

# Hashing user passwords is deliberately slow; tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
WHITENOISE_AUTOREFRESH = True  # no collectstatic before tests

"""gpucloud: a self-hostable, multi-tenant GPU cloud."""
from __future__ import annotations

# Load the Celery app whenever Django starts so @shared_task binds to it.
from gpucloud.celery import app as celery_app

__all__ = ("celery_app",)
__version__ = "0.1.0"

"""The gateway: an SSH server and the agents' tunnel endpoint (docs/connect.md).

A Django-aware process, like the Celery worker: it authorises with the control plane's
own rules (tenancy permissions, the workload's state, the SSH keys) through the ORM, run
in a thread pool (`access.py`), rather than over a second, internal HTTP API that would
need its own authentication and would restate those rules.
"""

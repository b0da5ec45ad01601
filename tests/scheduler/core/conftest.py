"""Hypothesis profile for the scheduler core: few, derandomised examples so the
suite is fast and CI is stable. Set HYPOTHESIS_PROFILE=core-deep to dig."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "core-ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("core-deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "core-ci"))

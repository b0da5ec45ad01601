from __future__ import annotations

from django.db import models


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"


class PriceKind(models.TextChoices):
    ON_DEMAND = "on_demand", "On demand"
    SPOT = "spot", "Spot"


# Fractional shares of one GPU an instance type may have, in milli-GPUs.
GPU_SHARES_MILLI = (125, 250, 500, 1000)

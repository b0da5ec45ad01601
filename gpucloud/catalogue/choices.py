from __future__ import annotations

from fractions import Fraction

from django.db import models


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"


class PriceKind(models.TextChoices):
    ON_DEMAND = "on_demand", "On demand"
    SPOT = "spot", "Spot"


# Fractional shares of one GPU an instance type may have, in milli-GPUs.
GPU_SHARES_MILLI = (125, 250, 500, 1000)


def gpu_share_text(milli: int) -> str:
    """How people read an amount of GPU given in milli-GPUs: "1/8 GPU", "1 GPU", "8 GPUs",
    "2 1/2 GPUs" (never "125‰" or "0.125"). The one place the console words a share."""
    whole, part = divmod(int(milli), 1000)
    if not part:
        return f"{whole} GPU" if whole == 1 else f"{whole} GPUs"
    frac = Fraction(part, 1000)
    text = f"{frac.numerator}/{frac.denominator}"
    return f"{text} GPU" if not whole else f"{whole} {text} GPUs"

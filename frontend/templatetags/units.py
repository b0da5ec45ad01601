"""Template filters that word quantities the one way the console words them."""
from __future__ import annotations

from django import template

from gpucloud.catalogue.choices import gpu_share_text

register = template.Library()


@register.filter
def gpu_share(milli: int | None) -> str:
    """`{{ allocation.milli|gpu_share }}` → "1/8 GPU"."""
    return "—" if milli is None else gpu_share_text(milli)

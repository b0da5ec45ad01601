"""Seed a realistic catalogue: regions, GPU models, instance types and prices. Idempotent."""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from gpucloud.catalogue.choices import PriceKind, Vendor
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.catalogue.services import PriceChange, price_set_many

REGIONS = [
    ("us-east-1", "US East (Ashburn)", "US", Decimal("1.00")),
    ("us-west-2", "US West (Hillsboro)", "US", Decimal("1.00")),
    ("eu-central-1", "EU Central (Frankfurt)", "DE", Decimal("1.12")),
    ("eu-north-1", "EU North (Stockholm)", "SE", Decimal("1.05")),
    ("ap-northeast-1", "Asia Pacific (Tokyo)", "JP", Decimal("1.18")),
]

# code, name, vendor, memory GiB, peak dense BF16 TFLOPS, interconnect, on-demand $/GPU-hour, regions
GPUS = [
    ("H100", "NVIDIA H100 SXM5 80GB", Vendor.NVIDIA, 80, "989.4", "NVLink 4 + NVSwitch, 900 GB/s",
     "2.49", ["us-east-1", "us-west-2", "eu-central-1", "eu-north-1", "ap-northeast-1"]),
    ("H200", "NVIDIA H200 SXM 141GB", Vendor.NVIDIA, 141, "989.4", "NVLink 4 + NVSwitch, 900 GB/s",
     "3.29", ["us-east-1", "us-west-2", "eu-central-1"]),
    ("A100", "NVIDIA A100 SXM4 80GB", Vendor.NVIDIA, 80, "312.0", "NVLink 3 + NVSwitch, 600 GB/s",
     "1.49", ["us-east-1", "us-west-2", "eu-central-1", "eu-north-1", "ap-northeast-1"]),
    ("L40S", "NVIDIA L40S 48GB", Vendor.NVIDIA, 48, "362.1", "PCIe 4.0 x16, 64 GB/s",
     "0.99", ["us-east-1", "us-west-2", "eu-central-1", "eu-north-1"]),
    ("MI300X", "AMD Instinct MI300X 192GB", Vendor.AMD, 192, "1307.4", "Infinity Fabric, 896 GB/s",
     "2.29", ["us-east-1", "eu-central-1"]),
]

# Per whole GPU: vCPUs, memory GiB, disk GiB. Fractions get their share, rounded up.
PER_GPU = {"H100": (24, 240, 1000), "H200": (24, 240, 1500), "A100": (16, 120, 500),
           "L40S": (12, 64, 400), "MI300X": (24, 240, 1500)}
WHOLE = {"H100": [1, 2, 4, 8], "H200": [1, 2, 4, 8], "A100": [1, 2, 4, 8], "L40S": [1, 2, 4, 8],
         "MI300X": [1, 8]}
FRACTIONS = {"A100": [250, 500], "L40S": [125, 250, 500]}
FRACTION_NAMES = {125: "eighth", 250: "quarter", 500: "half"}
FRACTION_PREMIUM = Decimal("1.10")  # sharing costs the operator some isolation and packing loss
SPOT_DISCOUNT = Decimal("0.45")  # spot sells at 45 % of on demand
CENT = Decimal("0.0001")


def _upsert(model: Any, key: str, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """update_or_create for many rows in three queries: read by key, insert the missing, update
    the changed (only their changed fields). `rows` maps each key value to its other fields."""
    found = model.objects.in_bulk(list(rows), field_name=key)
    fresh = [model(**{key: k, **fields}) for k, fields in rows.items() if k not in found]
    changed, fields_changed = [], set()
    for k, obj in found.items():
        diff = {f: v for f, v in rows[k].items() if getattr(obj, f) != v}
        if diff:
            for f, v in diff.items():
                setattr(obj, f, v)
            changed.append(obj)
            fields_changed |= diff.keys()
    model.objects.bulk_create(fresh)
    if changed:
        model.objects.bulk_update(changed, sorted(fields_changed))
    return {**found, **{getattr(obj, key): obj for obj in fresh}}


class Command(BaseCommand):
    help = "Create or update the demo/realistic catalogue (regions, GPU models, instance types, prices)."

    @transaction.atomic
    def handle(self, *args, **options):
        # A few queries in all, not one per row: the test suite seeds a catalogue per test.
        regions = _upsert(Region, "code", {code: {"name": name, "country": country, "active": True}
                                           for code, name, country, _ in REGIONS})
        multiplier = {code: m for code, _, _, m in REGIONS}
        gpus = _upsert(GpuModel, "code", {
            code: {"name": name, "vendor": vendor, "memory_gib": mem, "bf16_tflops": Decimal(tflops),
                   "interconnect": link}
            for code, name, vendor, mem, tflops, link, _, _ in GPUS})
        types: dict[str, dict[str, Any]] = {}
        offers: list[tuple[str, Decimal, list[str]]] = []  # instance type, on-demand base, regions
        for code, _, _, _, _, _, per_gpu, in_regions in GPUS:
            vcpu, ram, disk = PER_GPU[code]
            shapes = [(n, 1000, f"{code.lower()}.{n}x", f"{n}x {code}") for n in WHOLE[code]]
            shapes += [
                (1, m, f"{code.lower()}.{FRACTION_NAMES[m]}", f"{m / 1000:g} {code}")
                for m in FRACTIONS.get(code, [])
            ]
            for count, milli, it_code, it_name in shapes:
                share = Decimal(count * milli) / 1000
                types[it_code] = {
                    "name": it_name, "gpu_model": gpus[code], "gpu_count": count, "gpu_share_milli": milli,
                    "vcpus": max(2, int(vcpu * share)), "memory_gib": max(8, int(ram * share)),
                    "disk_gib": max(50, int(disk * share)), "active": True,
                }
                offers.append((it_code, Decimal(per_gpu) * share * (FRACTION_PREMIUM if milli < 1000 else 1),
                               in_regions))
        instance_types = _upsert(InstanceType, "code", types)
        changes = []
        for it_code, base, in_regions in offers:
            for region_code in in_regions:
                on_demand = (base * multiplier[region_code]).quantize(CENT, ROUND_HALF_UP)
                spot = (on_demand * SPOT_DISCOUNT).quantize(CENT, ROUND_HALF_UP)
                changes += [PriceChange(instance_types[it_code], regions[region_code], kind, amount)
                            for kind, amount in ((PriceKind.ON_DEMAND, on_demand), (PriceKind.SPOT, spot))]
        # Spot moves with demand once offered (billing.services.spot_prices_update): seeding
        # again must not put back the opening price (and add a row per restart).
        made = price_set_many(changes=changes, keep_existing_kinds=frozenset({PriceKind.SPOT}))
        self.stdout.write(
            f"catalogue: {len(regions)} regions, {len(GPUS)} GPU models, {len(types)} instance types, "
            f"{len(made)} new prices"
        )

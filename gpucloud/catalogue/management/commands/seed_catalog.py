"""Seed a realistic catalogue: regions, GPU models, instance types and prices. Idempotent."""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.core.management.base import BaseCommand
from django.db import transaction

from gpucloud.catalogue.choices import PriceKind, Vendor
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region
from gpucloud.catalogue.services import price_set

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


class Command(BaseCommand):
    help = "Create or update the demo/realistic catalogue (regions, GPU models, instance types, prices)."

    @transaction.atomic
    def handle(self, *args, **options):
        regions = {}
        for code, name, country, _ in REGIONS:
            regions[code], _ = Region.objects.update_or_create(
                code=code, defaults={"name": name, "country": country, "active": True}
            )
        multiplier = {code: m for code, _, _, m in REGIONS}
        n_types = n_prices = 0
        for code, name, vendor, mem, tflops, link, per_gpu, in_regions in GPUS:
            gpu, _ = GpuModel.objects.update_or_create(
                code=code,
                defaults={"name": name, "vendor": vendor, "memory_gib": mem,
                          "bf16_tflops": Decimal(tflops), "interconnect": link},
            )
            vcpu, ram, disk = PER_GPU[code]
            shapes = [(n, 1000, f"{code.lower()}.{n}x", f"{n}x {code}") for n in WHOLE[code]]
            shapes += [
                (1, m, f"{code.lower()}.{FRACTION_NAMES[m]}", f"{m / 1000:g} {code}")
                for m in FRACTIONS.get(code, [])
            ]
            for count, milli, it_code, it_name in shapes:
                share = Decimal(count * milli) / 1000
                it, _ = InstanceType.objects.update_or_create(
                    code=it_code,
                    defaults={
                        "name": it_name, "gpu_model": gpu, "gpu_count": count, "gpu_share_milli": milli,
                        "vcpus": max(2, int(vcpu * share)), "memory_gib": max(8, int(ram * share)),
                        "disk_gib": max(50, int(disk * share)), "active": True,
                    },
                )
                n_types += 1
                base = Decimal(per_gpu) * share * (FRACTION_PREMIUM if milli < 1000 else 1)
                for region_code in in_regions:
                    on_demand = (base * multiplier[region_code]).quantize(CENT, ROUND_HALF_UP)
                    spot = (on_demand * SPOT_DISCOUNT).quantize(CENT, ROUND_HALF_UP)
                    for kind, amount in ((PriceKind.ON_DEMAND, on_demand), (PriceKind.SPOT, spot)):
                        # Spot moves with demand once offered (billing.services.spot_prices_update):
                        # seeding again must not put back the opening price (and add a row per restart).
                        if kind == PriceKind.SPOT and Price.objects.filter(
                                instance_type=it, region=regions[region_code], kind=kind).exists():
                            continue
                        if price_set(instance_type=it, region=regions[region_code], kind=kind,
                                     per_hour=amount):
                            n_prices += 1
        self.stdout.write(
            f"catalogue: {len(regions)} regions, {len(GPUS)} GPU models, {n_types} instance types, "
            f"{n_prices} new prices"
        )

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpucloud.catalogue.choices import PriceKind
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region


class RegionSerializer(serializers.ModelSerializer):
    class Meta:
        model = Region
        fields = ["code", "name", "country"]


class GpuModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuModel
        fields = ["code", "name", "vendor", "memory_gib", "bf16_tflops", "interconnect"]


class PriceInForceSerializer(serializers.Serializer):
    region = serializers.CharField()
    kind = serializers.ChoiceField(choices=PriceKind.choices)
    currency = serializers.CharField()
    per_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    per_bf16_tflops_hour = serializers.DecimalField(max_digits=14, decimal_places=6)
    effective_from = serializers.DateTimeField()


class RegionAvailabilitySerializer(serializers.Serializer):
    region = serializers.CharField()
    available_now = serializers.IntegerField(
        help_text="one-node launches the scheduler would start now there, for a tenant with nothing "
                  "running (GET /api/v1/availability answers for yours)")
    can_host = serializers.BooleanField(help_text="whether some host of the region could ever run one")
    reason = serializers.CharField(help_text="why it never could there; empty when it can")
    availability = serializers.ChoiceField(
        choices=["available", "busy", "never"], read_only=True,
        help_text="available: available_now > 0; busy: some host could run it there, none is free now (a "
                  "launch queues); never: no host of the region could ever run it (a launch is refused)")


class InstanceTypeSerializer(serializers.ModelSerializer):
    gpu_model = GpuModelSerializer(read_only=True)
    gpus = serializers.DecimalField(
        max_digits=6, decimal_places=3, read_only=True,
        help_text="GPUs as a number: 8, 1, 0.25 for a quarter of one GPU",
    )
    bf16_tflops = serializers.DecimalField(max_digits=10, decimal_places=1, read_only=True)
    prices = serializers.SerializerMethodField()
    availability = serializers.SerializerMethodField()

    class Meta:
        model = InstanceType
        fields = ["code", "name", "gpu_model", "gpus", "gpu_count", "gpu_share_milli", "vcpus",
                  "memory_gib", "disk_gib", "bf16_tflops", "prices", "availability"]

    @extend_schema_field(PriceInForceSerializer(many=True))
    def get_prices(self, obj) -> list[dict]:
        """The price in force now per region and kind (filled in bulk by the view)."""
        prices = self.context.get("prices", {}).get(obj.pk, [])
        return PriceInForceSerializer(prices, many=True).data

    @extend_schema_field(RegionAvailabilitySerializer(many=True))
    def get_availability(self, obj) -> list[dict]:
        """Per region where it is priced: what would start now, whether it ever could (filled in bulk)."""
        rows = self.context.get("availability", {}).get(obj.pk, [])
        return RegionAvailabilitySerializer(rows, many=True).data


class PriceSerializer(serializers.ModelSerializer):
    instance_type = serializers.SlugRelatedField(slug_field="code", read_only=True)
    region = serializers.SlugRelatedField(slug_field="code", read_only=True)

    class Meta:
        model = Price
        fields = ["id", "instance_type", "region", "kind", "currency", "per_hour", "effective_from"]


class QuotaSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(allow_null=True, help_text="null: every GPU model")
    region = serializers.CharField(allow_null=True, help_text="null: every region")
    max_gpus = serializers.IntegerField(allow_null=True, help_text="null: no limit at this level")
    max_instances = serializers.IntegerField(allow_null=True)
    used_gpus = serializers.DecimalField(max_digits=10, decimal_places=3)
    used_instances = serializers.IntegerField()
    source = serializers.ChoiceField(choices=["plan", "tenant"])

from __future__ import annotations

from django.apps import AppConfig


class CatalogueConfig(AppConfig):
    name = "gpucloud.catalogue"
    label = "catalogue"
    verbose_name = "Catalogue"

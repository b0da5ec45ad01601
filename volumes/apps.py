from django.apps import AppConfig


class VolumesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "volumes"

    def ready(self) -> None:
        from volumes import receivers  # noqa: F401  (connects to the scheduler's signals)

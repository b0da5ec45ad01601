from django.core.management.base import BaseCommand

from volumes.services import storage_prices_seed


class Command(BaseCommand):
    help = "Give every active region a storage price (per GiB-hour) if it has none. Idempotent."

    def handle(self, *args, **options):
        self.stdout.write(f"storage prices added: {storage_prices_seed()}")

"""`manage.py volume_move VOLUME_ID [--to HOST] [--cancel]`: an operator moves a detached
volume to another host through the agents (docs/volumes.md "Moving a volume")."""
from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from agents.models import Host
from agents.protocol import host_name_normalise
from gpucloud.lib.errors import ServiceError
from volumes import moves, selectors
from volumes.models import Volume


class Command(BaseCommand):
    help = "Move a detached volume to another host of its region (or cancel its move)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("volume", help="the volume's id")
        parser.add_argument("--to", dest="host", default="", help="the target host's name (default: the ready "
                            "host of its region with the fewest volumes)")
        parser.add_argument("--cancel", action="store_true", help="cancel its open move instead")

    def handle(self, *args, volume: str, host: str, cancel: bool, **options) -> None:
        v = Volume.objects.filter(pk=volume).select_related("host").first() if _uuid(volume) else None
        if v is None:
            raise CommandError(f"No volume {volume}.")
        if cancel:
            move = selectors.open_move(v.pk)
            if move is None:
                raise CommandError(f"Volume {v.name} is not moving.")
            moves.move_cancel(move=move)
            self.stdout.write(f"cancelled the move of {v.name}; it stays on {v.host}")
            return
        target = Host.objects.filter(name=_host_name(host)).first() if host else moves.pick_target(v)
        if target is None:
            raise CommandError(f"No host {host}." if host else f"No other ready host in {v.region}.")
        try:
            move = moves.move_start(volume=v, target=target)
        except ServiceError as e:
            raise CommandError(e.message) from None
        self.stdout.write(f"moving {v.name} from {v.host} to {target.name} (move {move.pk})")


def _uuid(s: str) -> bool:
    try:
        uuid.UUID(s)
    except ValueError:
        return False
    return True


def _host_name(raw: str) -> str:
    """Names are stored in one form: "GPU-7 " finds gpu-7 (one outside the rule is looked up as given)."""
    try:
        return host_name_normalise(raw)
    except ValueError:
        return raw

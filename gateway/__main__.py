"""`python -m gateway`: the SSH server and the agents' tunnel endpoint (docs/connect.md)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
    django.setup()
    from django.conf import settings

    from gateway.server import Gateway, GatewayConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = GatewayConfig(
        bind=settings.GATEWAY_BIND, ssh_port=settings.GATEWAY_SSH_PORT, tunnel_port=settings.GATEWAY_TUNNEL_PORT,
        http_port=settings.GATEWAY_HTTP_PORT,
        host_key_path=settings.GATEWAY_HOST_KEY_PATH, replica=settings.GATEWAY_REPLICA,
        session_limit=settings.GATEWAY_SESSION_LIMIT, redis_url=settings.REDIS_URL,
        relay_port=settings.GATEWAY_RELAY_PORT, relay_host=settings.GATEWAY_RELAY_HOST,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Gateway(config).serve(stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()

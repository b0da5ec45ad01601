"""A tiny local image from the host's static busybox (Debian's ``busybox-static``), built
without any registry: the demo's stand-in for catalogue images the engine does not have
(``--docker-image-fallback``), and the images the Docker tests run.

The root filesystem is ``/bin/busybox`` plus a link per applet it lists (``busybox --list``)
and an empty ``/tmp``, imported as one layer (what ``tar -C dir -c . | docker import -``
does). The tag follows the binary and the applets, so a changed busybox builds a new image.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Final

BUSYBOX: Final = Path("/bin/busybox")
REPOSITORY: Final = "gpucloud/busybox-standin"


def applets(busybox: Path = BUSYBOX) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, timeout=10, check=True)
    return sorted({a.strip() for a in out.stdout.split() if a.strip() and "/" not in a})


def image_tar(busybox: Path, names: list[str]) -> bytes:
    """A root filesystem of one static busybox and its applet links, as a tar stream."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(busybox), arcname="bin/busybox")
        for name in names:
            if name == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buf.getvalue()


def busybox_image(client: Any, repository: str = REPOSITORY, busybox: Path = BUSYBOX) -> str:
    """``repository:<tag>`` built from ``busybox`` on ``client``'s engine, unless it is there
    already. Raises FileNotFoundError without a busybox (``apt-get install busybox-static``)."""
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} is missing: apt-get install busybox-static")
    names = applets(busybox)
    digest = hashlib.sha256(busybox.read_bytes())
    digest.update(repr(names).encode())
    tag = digest.hexdigest()[:12]
    name = f"{repository}:{tag}"
    try:
        client.images.get(name)
    except Exception as e:  # docker.errors.ImageNotFound; the SDK is imported by the caller
        if type(e).__name__ != "ImageNotFound":
            raise
        client.api.import_image_from_data(image_tar(busybox, names), repository=repository, tag=tag)
    return name

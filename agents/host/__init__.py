"""gpucloud host agent: discovers GPUs, runs the containers the control plane wants, reports back.

Imports nothing from Django; talks to the control plane only over HTTP using the
protocol in ``agents.protocol``. Entry point: ``python -m agents.host``.
"""

from __future__ import annotations

__version__ = "0.1.0"

"""gpucloud's Python SDK and CLI: `from gpucloud_sdk import Client`. Imports no Django."""
from __future__ import annotations

from gpucloud_sdk import errors
from gpucloud_sdk.client import TERMINAL_STATES, Client, operation
from gpucloud_sdk.errors import ApiError, GpucloudError

__all__ = ["ApiError", "Client", "GpucloudError", "TERMINAL_STATES", "errors", "operation"]
__version__ = "0.1.0"

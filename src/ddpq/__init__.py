"""ddpq: a GPU job queue daemon for a lab's shared training server.

``from ddpq import Client`` is the Python client (``ddpq.client.library``). It is imported
when first named, so that ``import ddpq`` (every command, the shim's package) stays as
light as this file.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing costs more than this whole module (mypy
# reads a module-level TYPE_CHECKING = False as it reads typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ddpq.client.errors import DdpqError as DdpqError
    from ddpq.client.errors import Unreachable as Unreachable
    from ddpq.client.library import Client as Client

__version__ = "0.1.0"
__all__ = ["Client", "DdpqError", "Unreachable", "__version__"]


def __getattr__(name: str) -> Any:
    """The client's names, imported when first asked for."""
    if name == "Client":
        from ddpq.client.library import Client

        return Client
    if name in ("DdpqError", "Unreachable"):
        from ddpq.client import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'ddpq' has no attribute {name!r}")

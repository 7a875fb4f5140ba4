"""The C library through ctypes, loaded once per process.

Standard library only, for the shim and the fork server. Loading it (``ctypes.CDLL``: a
class made for its functions, then each function looked up) cost a forked shim ~0.15 ms
each time it was asked for, twice on every job's start path (its title, becoming a
subreaper). The fork server loads it and the functions the shims call before it forks
(``preload``), so each shim finds them loaded.
"""

from __future__ import annotations

import functools  # already loaded by what the shim imports (subprocess)

TYPE_CHECKING = False  # typing would cost milliseconds on every job's start path
if TYPE_CHECKING:
    import ctypes

# What a forked shim calls: its title (prctl), a subreaper (prctl), a reserved signal's
# action (syscall), its own /dev/shm (unshare, mount: shim_shm).
SHIMS_CALL = ("prctl", "syscall", "unshare", "mount")


@functools.cache
def libc() -> ctypes.CDLL:
    """This process's C library, errno kept (``ctypes.get_errno``). Raises OSError where
    it cannot be loaded."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def preload() -> None:
    """Load it and look up what the shims call, where they can be."""
    try:
        loaded = libc()
        for name in SHIMS_CALL:
            getattr(loaded, name)
    except (OSError, AttributeError):
        pass  # each caller meets the same error, and handles it

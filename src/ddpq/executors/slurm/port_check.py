"""``python -S port_check.py PORT CMD...``: test-bind PORT on this node, then become CMD.

Run by a Slurm job's shim on the job's first node, before torchrun: ddpq leased PORT from
its own table, so no other ddpq job holds it, but a program outside ddpq may. The port is
bound as TCPStore binds it (the wildcard addresses, ``SO_REUSEADDR``) and closed again; if
it is taken, the line printed into the job's log names the port and EADDRINUSE, which is
how the worker tells a port clash from a failure (``core.disposition``) and requeues the
job on another port. Standard library only, started with ``-S``: it is on the start path.
"""

from __future__ import annotations

import errno
import os
import socket
import sys


def port_taken(port: int) -> str | None:
    """Why ``port`` cannot be bound here (the OS's words); None if it can."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this node: TCPStore will not bind there either
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return exc.strerror or "Address already in use"
        finally:
            sock.close()
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: port_check.py PORT CMD...\n")
        return 2
    port = int(argv[0])
    why = port_taken(port)
    if why is not None:
        host = socket.gethostname()
        print(f"[ddpq] rendezvous port {port} is taken on {host}: {why} (EADDRINUSE)", flush=True)
        return 1
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as exc:
        sys.stderr.write(f"ddpq: cannot run {argv[1]!r}: {exc.strerror}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

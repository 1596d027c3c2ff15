"""Where the agents' gateway is reachable from: loopback or not, and the address
to hand agents for a server bound to every interface. Standard library only (the
command line reads it without the ``agents`` extra)."""

from __future__ import annotations

import socket

#: hosts that bind every interface, which a client cannot connect to by that name
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (reachable from this machine only)."""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def this_machines_address() -> str:
    """This machine's address as other hosts reach it: Ray's node address, else the
    address of the host name, else 127.0.0.1."""
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - no Ray, or no network: fall back
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

"""Where a notification may not go, judged from the address alone (pure).

A notification's URL is a user's, and the daemon that sends it may be root: it must not
reach this host (its API, other users' servers listening here), the cloud's metadata
services (credentials) or addresses that are no single host's. Private networks are
allowed: a lab's Mattermost lives there. Whether an address is one of this host's own is a
question for the host (``ddpq.notify_target``); everything else is decided here.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata and platform services: they hand out credentials to whoever asks from this
# host. Most are link-local (refused as such anyway); these are listed so that no other
# rule has to hold them.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean, …
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "169.254.0.23",  # Tencent Cloud
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
        "fd20:ce::254",  # GCP metadata over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer
        "192.0.0.192",  # Oracle Cloud Classic
    )
)
# Names of metadata services, refused whatever they resolve to (here, or on another cloud).
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
        "metadata.azure.internal",
    }
)

# "This network" (RFC 791): 0.x.y.z is no host anywhere; Linux even connects 0.0.0.0 to
# this host.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# NAT64 (RFC 6052's well-known prefix): the IPv4 address is the last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

LOOPBACK = "it is a loopback address, this host's own"
METADATA = "it is a cloud metadata service"
NOT_A_HOST = "it is an unspecified, link-local, multicast, broadcast or reserved address"


def parse(ip: str) -> IPAddress:
    """An address as ``getaddrinfo`` or a URL gives it (an IPv6 zone ``%eth0`` dropped)."""
    return ipaddress.ip_address(ip.split("%", 1)[0])


def embedded_ipv4(addr: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one leads to: mapped, 6to4, Teredo (server and client)
    and NAT64 forms; none for a plain IPv6 address or an IPv4 one."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    if addr.ipv4_mapped is not None:
        return [addr.ipv4_mapped]
    if addr.sixtofour is not None:
        return [addr.sixtofour]
    if addr.teredo is not None:
        return list(addr.teredo)
    if addr in _NAT64:
        return [ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)]
    return []


def refused_by_class(addr: IPAddress, allow_loopback: bool) -> str | None:
    """Why a notification may not go to ``addr`` by what kind of address it is (and any
    IPv4 address it embeds), or None. This host's other addresses are not known here."""
    inner = embedded_ipv4(addr)
    if inner:  # judged by where it leads (``::ffff:0:0/96`` itself counts as reserved)
        refusals = (refused_by_class(v4, allow_loopback) for v4 in inner)
        return next((why for why in refusals if why is not None), None)
    if addr in METADATA_ADDRESSES:
        return METADATA
    if addr.is_loopback:
        return None if allow_loopback else LOOPBACK
    if (
        addr.is_unspecified
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved  # IPv4's 240/4 with the broadcast address; IPv6's ::/8, …
        or addr in _THIS_NETWORK
        or (isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local)
    ):
        return NOT_A_HOST
    return None


def refused_name(host: str, allow_loopback: bool) -> str | None:
    """Why a notification may not go to the host name ``host`` whatever it resolves to."""
    name = host.rstrip(".").lower()
    if name in METADATA_NAMES:
        return METADATA
    if not allow_loopback and (name == "localhost" or name.endswith(".localhost")):
        return LOOPBACK
    return None

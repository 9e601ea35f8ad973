"""An address already numeric is read at once: gevent's resolver for this process, except that a host
written as an IP address (127.0.0.1, ::1) becomes its socket address in the calling greenlet.

gevent's default resolver hands every `getaddrinfo` to a thread of its threadpool and waits for the
answer, even for an address with nothing to look up, and each user's first connection makes one:
when 100 users start at once their first requests queue for the pool's threads before they connect.
With AI_NUMERICHOST the C library only parses the text (it never asks DNS or reads a file), so the
call cannot block the loop; any other name still goes to the threadpool, as before.
"""

import ipaddress
import socket

import gevent
import gevent.monkey

GETADDRINFO = gevent.monkey.get_original("socket", "getaddrinfo")  # the operating system's, not gevent's


def is_ip_address(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class NumericFirstResolver:
    """gevent's resolver interface; numeric hosts answered here, everything else by `fallback`."""

    def __init__(self, fallback) -> None:
        self.fallback = fallback

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 (socket's names)
        if is_ip_address(host):
            return GETADDRINFO(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        return self.fallback.getaddrinfo(host, port, family, type, proto, flags)

    def gethostbyname(self, *args):
        return self.fallback.gethostbyname(*args)

    def gethostbyname_ex(self, *args):
        return self.fallback.gethostbyname_ex(*args)

    def gethostbyaddr(self, *args, **kwargs):
        return self.fallback.gethostbyaddr(*args, **kwargs)

    def getnameinfo(self, *args, **kwargs):
        return self.fallback.getnameinfo(*args, **kwargs)

    def close(self) -> None:
        self.fallback.close()


def install() -> None:
    """This thread's gevent hub resolves numeric hosts at once (idempotent)."""
    hub = gevent.get_hub()
    if not isinstance(hub.resolver, NumericFirstResolver):
        hub.resolver = NumericFirstResolver(hub.resolver)

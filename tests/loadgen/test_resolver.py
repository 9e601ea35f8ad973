"""The resolver loadgen installs: numeric hosts read in the calling greenlet, names through gevent's own."""

import socket

import gevent
import pytest

from loadgen.resolver import GETADDRINFO, NumericFirstResolver, install, is_ip_address


@pytest.fixture
def hub_resolver():
    """The hub's resolver as it was, restored after the test."""
    hub = gevent.get_hub()
    before = hub.resolver
    yield before
    hub.resolver = before


def _yielded(call) -> bool:
    """Whether `call` let another greenlet run (gave the loop up) before it returned."""
    ran = []
    gevent.spawn(ran.append, 1)
    call()
    return bool(ran)


@pytest.mark.parametrize(("host", "numeric"), [("127.0.0.1", True), ("::1", True), (b"10.0.0.7", True),
                                                ("localhost", False), ("example.invalid", False), (None, False)])
def test_is_ip_address(host, numeric):
    assert is_ip_address(host) is numeric


def test_a_numeric_host_is_answered_without_giving_up_the_loop(hub_resolver):
    resolver = NumericFirstResolver(hub_resolver)
    answer = []
    assert not _yielded(lambda: answer.extend(resolver.getaddrinfo("127.0.0.1", 8000, 0, socket.SOCK_STREAM)))
    assert answer == GETADDRINFO("127.0.0.1", 8000, 0, socket.SOCK_STREAM)
    assert [info[4] for info in answer] == [("127.0.0.1", 8000)]


def test_a_name_still_goes_to_gevents_resolver(hub_resolver):
    resolver = NumericFirstResolver(hub_resolver)
    answer = []
    assert _yielded(lambda: answer.extend(resolver.getaddrinfo("localhost", 8000, 0, socket.SOCK_STREAM)))
    assert answer == hub_resolver.getaddrinfo("localhost", 8000, 0, socket.SOCK_STREAM)


def test_install_wraps_the_hubs_resolver_once(hub_resolver):
    install()
    install()
    hub = gevent.get_hub()
    assert isinstance(hub.resolver, NumericFirstResolver)
    assert hub.resolver.fallback is hub_resolver

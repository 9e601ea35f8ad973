"""Locust's HttpSession.post for the load generator's own requests, at a fraction of its CPU cost.

Every request the generator sends to one URL differs from the last only in its JSON body and its
x-request-id. requests nevertheless rebuilds each one from scratch (merging the session's headers,
hooks, cookie jars and settings, parsing the URL, checking each setting against a runtime Protocol),
which cost about 1.2 ms of CPU a request on the development VM (of 2.75 ms for the whole streamed
request), and on a client with hundreds of streams that CPU is time other streams' tokens wait for. `post()` prepares
the request once per session and URL and sends a copy with the new body and id through the session's
own `send` (its adapters and connection pools, TLS settings, redirects, response hooks and cookie
extraction), then reports it to Locust as `HttpSession.request` does.

The copy is exactly what requests would prepare only while the session holds nothing that changes a
request between sends: no cookies, no params, no response hooks, no auth but a fixed basic one, no
lookups in the environment (`trust_env`: `settle_environment` does those once). Otherwise, or when
its headers have changed, `post()` is `session.post`.
"""

import os
import select
import time

import requests
import urllib3.connection
from gevent import monkey
from requests.auth import HTTPBasicAuth
from requests.compat import json as complexjson
from requests.utils import get_environ_proxies, get_netrc_auth

_OS_POLL = monkey.get_original("select", "poll")  # the system call, whatever gevent has patched
_WAIT_FOR_READ = urllib3.connection.wait_for_read


def _wait_for_read(sock, timeout: float | None = None) -> bool:
    """urllib3's wait_for_read, without a greenlet switch when it must not wait.

    Before reusing a pooled connection urllib3 asks whether the server closed it: a poll with timeout
    0. Under gevent's monkey-patching that poll switches to the hub, which runs every other greenlet
    that has something to do; the request is then sent only after them, late by however much the
    other streams had pending, and that wait lands inside its TTFT. The system call answers at once."""
    if timeout != 0:
        return _WAIT_FOR_READ(sock, timeout=timeout)
    poller = _OS_POLL()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


urllib3.connection.wait_for_read = _wait_for_read

TEMPLATE_ATTR = "_loadgen_templates"  # on the session: {(url, header names and values): _Template}


class _Template:
    __slots__ = ("prepared", "session_headers", "auth")

    def __init__(self, prepared: requests.PreparedRequest, session: requests.Session) -> None:
        self.prepared = prepared
        self.session_headers = session.headers.copy()
        self.auth = session.auth


def settle_environment(session: requests.Session, url: str) -> None:
    """Resolve once what requests looks up in the environment on every request (proxy variables,
    ~/.netrc, a CA bundle variable), keep it in the session, and stop the lookups (`trust_env`)."""
    if not session.trust_env:
        return
    for scheme, proxy in get_environ_proxies(url, no_proxy=session.proxies.get("no_proxy")).items():
        session.proxies.setdefault(scheme, proxy)
    if session.auth is None:
        session.auth = get_netrc_auth(url)
    if session.verify is True:
        session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    session.trust_env = False


def _reusable(session: requests.Session) -> bool:
    auth = session.auth
    return (not session.trust_env and not session.params and not any(session.hooks.values())
            and (auth is None or type(auth) in (tuple, HTTPBasicAuth)) and not session.cookies)


def _prepared(session, url: str, body: dict, headers: dict) -> requests.PreparedRequest | None:
    """A copy of the session's template for (url, headers) with this body; None where no copy can
    stand for what requests would prepare now."""
    if not _reusable(session):
        return None
    templates = session.__dict__.setdefault(TEMPLATE_ATTR, {})
    request_id = headers.get("x-request-id")
    key = (url, tuple((k, v) for k, v in headers.items() if k != "x-request-id"))
    template = templates.get(key)
    if template is None or template.auth is not session.auth or template.session_headers != session.headers:
        prepared = requests.Session.prepare_request(session, requests.Request("POST", url, headers=headers,
                                                                              json=body))
        template = templates[key] = _Template(prepared, session)
    data = complexjson.dumps(body, allow_nan=False)  # as PreparedRequest.prepare_body encodes json=
    data = data.encode("utf-8") if isinstance(data, str) else data
    prepared = template.prepared.copy()
    prepared.body = data
    prepared.headers["Content-Length"] = str(len(data))
    if request_id is not None:
        prepared.headers["x-request-id"] = request_id
    return prepared


def post(session, path: str, body: dict, headers: dict, name: str, stream: bool,
         timeout: tuple[float, float]):
    """`session.post(path, json=body, headers=headers, name=name, stream=stream, timeout=timeout,
    catch_response=True)`, for Locust's HttpSession: the same request, response (a ResponseContextManager)
    and Locust event."""
    from locust.clients import ResponseContextManager  # (locust imported first monkey-patches; here it is)

    url = session._build_url(path)
    prepared = _prepared(session, url, body, headers)
    if prepared is None:
        return session.post(path, json=body, stream=stream, catch_response=True, name=name, headers=headers,
                            timeout=timeout)
    prepared._explicit_name = name  # Locust's OpenTelemetry span name, as its prepare_request sets it
    start_time = time.time()
    start = time.perf_counter()
    try:
        response = session.send(prepared, stream=stream, timeout=timeout, allow_redirects=True)
    except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema, requests.exceptions.InvalidURL):
        raise
    except requests.exceptions.RequestException as exc:  # HttpSession's "safe mode"
        response = ResponseContextManager(exc)
    response_time = (time.perf_counter() - start) * 1000
    first = (response.history and response.history[0]) or response
    complete_url = str(first.request.url) if first.request is not None else url
    context = {**session.user.context()} if session.user else {}
    if stream:
        length = int(response.headers.get("content-length") or 0)
    else:
        length = len(response.content or b"")
    request_meta = {"request_type": "POST", "response_time": response_time, "name": name, "context": context,
                    "response": response, "exception": None, "start_time": start_time, "url": complete_url,
                    "response_length": length}
    return ResponseContextManager.wrap_response(response, request_event=session.request_event,
                                                request_meta=request_meta, catch_response=True)

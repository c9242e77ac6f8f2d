"""The one streaming client: POST an OpenAI-style request with stream=true, time every token.

gevent-based (imports gevent; never import it from the analysis). One TCP connection per
request: a stream abandoned on timeout can never poison a pooled connection, and the cost
(one loopback/VPC handshake) is part of what a real client pays. Each new connection goes to
the next address of the host's last lookup in turn: an NLB's name answers one node address per
Availability Zone and leaves it to the client to pick, each node taking the share of clients
that picked it (ELB user guide, "How Elastic Load Balancing works": Request routing and
Cross-zone load balancing; awsdocs/elb-user-guide doc_source/how-elastic-load-balancing-works.md),
so a client that always took the first address loaded one AZ's node at a time. The HTTP/1.1 response is
parsed by `loadgen.http1`, fed straight from each read, which is timestamped with the
kernel's receive time of its newest byte where Linux gives it (see `Stream`), so a token is
timed when it reached this host however late the event loop reads it; the parser costs a
fraction of a general-purpose one's per-chunk callbacks, which matters at tens of thousands of
chunks per second (bench/loadgen_ceiling.py). A host name is looked up through a `Resolver`:
the system's (getaddrinfo, as on AWS, where the name is the fleet NLB's DNS name) or, offline,
an answer source on loopback that stands in for that DNS (`http_resolver`, loadgen/resolver.py).
"""

from __future__ import annotations

import _socket
import errno
import ipaddress
import json
import logging
import os
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from gevent import get_hub
from gevent import socket as gsocket
from gevent.event import Event
from gevent.monkey import get_original

from loadgen.http1 import ResponseParser
from loadgen.openai_request import PATHS
from loadgen.prompts import Api
from loadgen.resolver import check_resolver_url, decode_answer, query_target
from loadgen.sse import SSEParser, StreamState, Transport, feed_events

_ERR_BODY_MAX = 2048
# A token frame is ~200-400 bytes; a small buffer is cheaper to allocate on every recv (about
# 1 us less than 64 KiB here), and a level-triggered watcher calls again if more is waiting.
_RECV_BYTES = 4096
_READ, _WRITE = 1, 2  # libev event masks
# libev runs the pending callbacks of one loop iteration highest priority first: the replayer's
# send timer runs at 2, a stream still waiting for its connection or its first token at 1, one
# already streaming at 0, so under load a first token is read before the iteration's other reads.
_URGENT = 1
# ... and a loop iteration can be long: a saturated client reads hundreds of streams in one, and
# a first token that arrives meanwhile would wait for the next (past its stream's second token,
# whose arrival would then stamp it). So while reads go on, the streams still waiting for their
# first token are polled on their own (one epoll set, without blocking) every _URGENT_POLL_S.
_URGENT_POLL_S = 0.002
# The kernel's receive time of each read (Linux SO_TIMESTAMPNS, on CLOCK_REALTIME): the moment
# the newest byte in it reached this host, however long the event loop took to get to it.
_SO_TIMESTAMPNS: int = getattr(_socket, "SO_TIMESTAMPNS", 35)  # Python leaves out the name; 35 on Linux
_CMSG_SPACE = _socket.CMSG_SPACE(16) if sys.platform == "linux" else 0
_timespec = struct.Struct("qq").unpack_from
_stamp_keeper: _socket.socket | None = None  # keeps the kernel stamping from the first packet on

log = logging.getLogger("loadgen.client")

Address = tuple[int, tuple[Any, ...]]  # (address family, socket address), as connect_ex takes them
Resolver = Callable[[str, int], list[Address]]  # (host name, port) -> its addresses; blocks its greenlet only
_RESOLVER_ANSWER_MAX = 64 * 1024


def system_resolver(host: str, port: int) -> list[Address]:
    """The system's answer (getaddrinfo, through gevent's resolver)."""
    return [(fam, addr) for fam, _, _, _, addr in gsocket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM)]


def http_resolver(url: str, timeout_s: float = 5.0) -> Resolver:
    """A resolver that asks the answer source at `url` (loopback only: loadgen/resolver.py says
    what it answers) over one short HTTP/1.1 exchange on gevent's sockets."""
    check_resolver_url(url)
    u = urlsplit(url)
    source = (u.hostname, u.port)

    def lookup(host: str, port: int) -> list[Address]:
        body = _http_get(source, u.netloc, query_target(url, host), timeout_s, url)
        return [_address(ip, port) for ip in decode_answer(body, host, url)]

    return lookup


def resolver_for(url: str | None) -> Resolver:
    """The resolver a replay's `--resolver` setting names: none, the system's."""
    return http_resolver(url) if url else system_resolver


def _address(ip: str, port: int) -> Address:
    if ipaddress.ip_address(ip).version == 6:
        return _socket.AF_INET6, (ip, port, 0, 0)
    return _socket.AF_INET, (ip, port)


def _http_get(addr: tuple[Any, ...], netloc: str, target: str, timeout_s: float, url: str) -> bytes:
    body = bytearray()
    resp = ResponseParser(body.extend)
    with gsocket.create_connection(addr, timeout=timeout_s) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode())
        while not resp.message_complete and len(body) <= _RESOLVER_ANSWER_MAX:
            data = s.recv(_RECV_BYTES)
            if not data:
                resp.feed_eof()
                break
            resp.feed(data)
    if not resp.message_complete:
        raise OSError(f"resolver {url}: the answer ended early or is over {_RESOLVER_ANSWER_MAX} bytes")
    if resp.status_code != 200:
        raise OSError(f"resolver {url}: HTTP {resp.status_code}: {bytes(body[:200])!r}")
    return bytes(body)


@dataclass(frozen=True)
class Exchange:
    state: StreamState
    transport: Transport
    sent_t: float
    end_t: float


class DueHook(Protocol):
    """What a stream calls after each read: the replayer, which sends whatever came due."""

    next_due: float  # monotonic time of the next scheduled send (inf: none)

    def launch_due(self, now: float) -> None: ...


class StreamingClient:
    def __init__(
        self,
        base_url: str,
        *,
        api: Api,
        timeout_s: float,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        resolver: Resolver = system_resolver,
    ):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"need an http://host:port URL, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.api: Api = api
        self.path = (u.path.rstrip("/") + PATHS[api]) if u.path not in ("", "/") else PATHS[api]
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.hook: DueHook | None = None
        self.resolver = resolver
        self.kernel_stamps = kernel_stamps()
        self._waiting: dict[int, Stream] = {}  # fd -> a stream waiting for its first token
        self._waiting_ep: Any = None  # their epoll set (the real one: gevent's monkey-patching removes select.epoll)
        self._waiting_polled = 0.0
        self._polling = False
        self._turn = 0  # connections begun: the next one starts at address _turn mod their number
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:  # a name (an NLB's DNS name): resolved by resolve(), again and again
            self._literal = False
            self._addresses: list[Address] = []
        else:
            self._literal = True
            self._addresses = [(_socket.AF_INET6 if ip.version == 6 else _socket.AF_INET, (self.host, self.port))]
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n{auth}"
        ).encode()

    def encode(self, body: dict[str, Any], request_id: str | None = None) -> bytes:
        """The request's bytes. `request_id` goes out as X-Request-Id (vLLM logs it and, with
        --enable-request-id-headers, echoes it), so server logs can be joined to records."""
        data = json.dumps(body, separators=(",", ":")).encode()
        rid = f"X-Request-Id: {request_id}\r\n" if request_id else ""
        return self._head + f"{rid}Content-Length: {len(data)}\r\n\r\n".encode() + data

    @property
    def addresses(self) -> list[Address]:
        """The literal IP, or the host name's addresses as of the last `resolve()`."""
        return self._addresses

    def next_addresses(self) -> list[Address]:
        """The addresses a new connection tries, in order: from the next one in turn (round robin
        over the last lookup's whole answer), then the others as fallbacks. An address a lookup
        dropped gets no new connection; streams already on it keep theirs."""
        addrs = self._addresses
        n = len(addrs)
        if n < 2:
            return list(addrs)
        k = self._turn % n
        self._turn += 1
        return addrs[k:] + addrs[:k]

    def resolve(self) -> None:
        """Look the host name up again through the client's resolver (blocks this greenlet only;
        never call it from a hub callback). A name is an NLB's DNS name, whose addresses change."""
        if self._literal:
            return
        addresses = self.resolver(self.host, self.port)
        if not addresses:
            raise OSError(f"no address for {self.host}")
        self._addresses = addresses

    def wait_first_token(self, st: Stream, fd: int) -> bool:
        """Add a stream to the set polled between reads (False where there is no epoll)."""
        if self._waiting_ep is None:
            try:
                self._waiting_ep = get_original("select", "epoll")()
            except (AttributeError, OSError):  # not Linux
                return False
        self._waiting_ep.register(fd, _READ)  # EPOLLIN
        self._waiting[fd] = st
        return True

    def stop_waiting(self, fd: int) -> None:
        self._waiting.pop(fd, None)
        self._waiting_ep.unregister(fd)

    def poll_waiting(self, now: float) -> None:
        """Read the streams whose first token has arrived, if _URGENT_POLL_S has passed since the
        last time; called after every read (a read callback of theirs that libev queues in the
        same iteration then finds nothing and returns)."""
        if self._polling or now - self._waiting_polled < _URGENT_POLL_S or not self._waiting:
            return
        self._waiting_polled = now
        self._polling = True
        try:
            for fd, _ev in self._waiting_ep.poll(0):
                st = self._waiting.get(fd)
                if st is not None:
                    st.read()
        finally:
            self._polling = False

    def open(self, wire: bytes, on_done: Callable[[Exchange], None], timeout_s: float | None = None) -> Stream:
        """A request for pre-encoded bytes (see `encode`), sent by `Stream.begin()`; `on_done`
        gets the Exchange once the response ended, failed or timed out. Neither blocks, so both
        may run in a hub callback: this is how the replayer sends on time while hundreds of
        streams are being read (no greenlet per request, no switch per token)."""
        return Stream(self, wire, self.timeout_s if timeout_s is None else timeout_s, on_done)

    def stream(self, wire: bytes, timeout_s: float | None = None) -> Exchange:
        """Blocking form of `open` + `begin` for one greenlet: resolves a host name first (the lookup
        counts in TTFT, as it does for any real client), then waits for the Exchange."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        sent_t = time.monotonic()
        try:
            self.resolve()
        except Exception as exc:
            return Exchange(StreamState(), Transport(None, False, _describe(exc), False), sent_t, time.monotonic())
        done = Event()
        box: list[Exchange] = []

        def on_done(ex: Exchange) -> None:
            box.append(ex)
            done.set()

        st = Stream(self, wire, limit, on_done, sent_t)
        st.begin()
        try:
            done.wait()
        except BaseException:  # GreenletExit, KeyboardInterrupt: never leave watchers behind
            st.abort("aborted: the waiting greenlet was killed")
            raise
        return box[0]


def kernel_stamps() -> bool:
    """Whether reads get the kernel's receive time (once per process: a socket with the option
    set is kept open, so the kernel stamps packets from the first stream's first one on)."""
    global _stamp_keeper
    if _stamp_keeper is not None:
        return True
    if not _CMSG_SPACE:
        return False
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.setsockopt(_socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        s.close()
        return False
    _stamp_keeper = s
    return True


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _connect_error(addr: tuple[Any, ...], err: int) -> str:
    return _describe(OSError(err, f"connect to {addr[0]}:{addr[1]}: {os.strerror(err)}"))


def close_watcher(w: Any) -> None:
    """Stop a libev watcher or timer, then close it (None is fine). Stop first: a level-
    triggered watcher on a socket at EOF would otherwise call back on every loop iteration."""
    if w is not None:
        w.stop()
        w.close()


class Stream:
    """One request's whole life, driven by callbacks in gevent's hub: connect (the client's next
    address in turn, the others as fallbacks), send, read until the response ends, then
    `on_done` exactly once.

    Each read callback takes what the kernel holds and stamps it: with the kernel's receive time
    of the newest byte read where the kernel gives it (`kernel_stamps`; never before the request
    was started nor after the read), else the monotonic clock at the read. A frame's stamp is
    then when it reached this host, not when a busy event loop got to it, and never early: the
    bytes of one read share the stamp of its newest byte, as they shared the read's time. The
    bytes feed the HTTP/1.1 parser (chunked framing), then the SSE events (`feed_events`).
    Until its first token a stream's watchers run at a higher priority than streaming ones'
    (`_URGENT`), and the request is written as soon as the non-blocking connect returns when the
    connection is already up (always, on loopback) instead of one loop iteration later. Timers
    bound the connect (connect_timeout_s per address) and the whole exchange (the deadline).
    After reading, a callback gives the client's `hook` (the replayer) a chance to send requests
    that came due, so a send never waits behind a whole loop iteration of other streams' tokens."""

    __slots__ = (
        "_addr",
        "_addrs",
        "_connect_timer",
        "_deadline_timer",
        "_events",
        "_last_error",
        "_polled",
        "_urgent",
        "_view",
        "_watcher",
        "client",
        "deadline",
        "err_body",
        "finished",
        "limit",
        "now",
        "on_done",
        "parser",
        "resp",
        "sent_t",
        "sock",
        "state",
        "timed_out",
    )

    def __init__(
        self,
        client: StreamingClient,
        wire: bytes,
        limit: float,
        on_done: Callable[[Exchange], None],
        sent_t: float | None = None,
    ):
        self.client = client
        self.limit = limit
        self.sent_t = time.monotonic() if sent_t is None else sent_t
        self.deadline = self.sent_t + limit
        self.on_done = on_done
        self.state = StreamState()
        self.parser = SSEParser()
        self.err_body = bytearray()
        self.resp = ResponseParser(self._on_body)
        self.now = 0.0
        self.timed_out = False
        self.finished = False
        self.sock: _socket.socket | None = None
        self._view = memoryview(wire)
        self._addrs: list[Address] = []
        self._addr: tuple[Any, ...] = ()
        self._last_error: str | None = None
        self._watcher: Any = None
        self._events = 0
        self._urgent = False
        self._polled = False  # in the client's set of streams waiting for their first token
        self._connect_timer: Any = None
        self._deadline_timer: Any = None

    # -- lifecycle ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Connect to the client's next address in turn, falling back on the others; the clock
        (sent_t) started when this Stream was made."""
        self._addrs = self.client.next_addresses()
        loop = get_hub().loop
        loop.update_now()  # libev timers count from the loop's cached time, stale mid-iteration
        self._deadline_timer = loop.timer(max(0.0, self.deadline - time.monotonic()))
        self._deadline_timer.start(self._on_deadline)
        self._connect_next()

    def abort(self, reason: str) -> None:
        """End now (the run is stopping): on_done gets what was read so far."""
        self._finish(reason)

    def _connect_next(self) -> None:
        """Try the next address; with none left, fail with the last address's error."""
        while self._addrs:
            family, addr = self._addrs.pop(0)
            self._addr = addr
            try:
                s = _socket.socket(family, _socket.SOCK_STREAM)
            except OSError as exc:  # EMFILE: out of descriptors
                self._last_error = _describe(exc)
                continue
            s.setblocking(False)
            if self.client.kernel_stamps:
                s.setsockopt(_socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            err = s.connect_ex(addr)
            self.sock = s
            if err == 0:
                self._send()
                return
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                try:  # the handshake may be done already: then write now, not an iteration later
                    self._view = self._view[s.send(self._view) :]
                except BlockingIOError:
                    pass  # not yet connected: wait until writable
                except OSError as exc:  # refused, unreachable: this address failed
                    self._drop_socket(_connect_error(addr, exc.errno or 0))
                    continue
                else:
                    self._send()
                    return
                self._watch(_WRITE, self._on_connected, _URGENT)
                left = self.deadline - time.monotonic()
                if self.client.connect_timeout_s < left:  # else the deadline comes first
                    loop = get_hub().loop
                    loop.update_now()
                    self._connect_timer = loop.timer(self.client.connect_timeout_s)
                    self._connect_timer.start(self._on_connect_timeout)
                return
            self._drop_socket(_connect_error(addr, err))
        self._finish(self._last_error or f"OSError: no address for {self.client.host}")

    def _drop_socket(self, why: str) -> None:
        self._last_error = why
        self._unwatch()
        self._stop_connect_timer()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _on_connected(self) -> None:
        assert self.sock is not None
        self._stop_connect_timer()
        err = self.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
        if err:
            self._drop_socket(_connect_error(self._addr, err))
            self._connect_next()
            return
        self._send()

    def _on_connect_timeout(self) -> None:
        addr = self._addr
        self._drop_socket(
            f"TimeoutError: connect to {addr[0]}:{addr[1]} timed out after {self.client.connect_timeout_s:g} s"
        )
        self._connect_next()

    def _send(self) -> None:
        """Write what is left of the request; on a full buffer, wait until writable."""
        assert self.sock is not None
        try:
            while self._view:
                self._view = self._view[self.sock.send(self._view) :]
        except BlockingIOError:
            if self._events != _WRITE or self._watcher.callback != self._send:
                self._watch(_WRITE, self._send, _URGENT)
            return
        except OSError as exc:
            self._finish(_describe(exc))
            return
        self._watch(_READ, self._on_stamped if self.client.kernel_stamps else self._on_readable, _URGENT)

    def _on_stamped(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(_RECV_BYTES, _CMSG_SPACE)  # type: ignore[union-attr]
        except BlockingIOError:
            return  # spurious readiness
        except Exception as exc:  # a reset: this stream fails, the hub goes on
            self._finish(_describe(exc))
            return
        now = time.monotonic()
        stamp = now
        if anc:
            level, kind, ts = anc[0]
            if kind == _SO_TIMESTAMPNS and level == _socket.SOL_SOCKET and len(ts) >= 16:
                sec, ns = _timespec(ts)
                k = sec + ns * 1e-9 - (time.time() - now)  # CLOCK_REALTIME -> CLOCK_MONOTONIC, now
                if self.sent_t <= k < now:  # else a clock step came between the packet and the read
                    stamp = k
        self._consume(data, stamp, now)

    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(_RECV_BYTES)  # type: ignore[union-attr]
        except BlockingIOError:
            return  # spurious readiness
        except Exception as exc:  # a reset: this stream fails, the hub goes on
            self._finish(_describe(exc))
            return
        now = time.monotonic()
        self._consume(data, now, now)

    def _consume(self, data: bytes, stamp: float, now: float) -> None:
        """Parse one read whose bytes arrived by `stamp` (their timestamp), read at `now`."""
        resp = self.resp
        self.now = stamp
        try:
            if data:
                resp.feed(data)
                if resp.message_complete:
                    self._finish(None)
            else:
                resp.feed_eof()  # completes a close-delimited body
                self._finish(None if resp.message_complete else "connection closed before the response ended")
        except Exception as exc:  # bytes the parser rejects: this stream fails, the hub goes on
            self._finish(_describe(exc))
            return
        if self._urgent and self.state.chunk_times and not self.finished:
            self._watch(_READ, self._watcher.callback)  # streaming now: back to the default priority
        client = self.client
        hook = client.hook
        if hook is not None and now >= hook.next_due:
            hook.launch_due(now)
        if client._waiting:
            client.poll_waiting(now)

    def read(self) -> None:
        """Read what the socket holds now (the watcher's callback)."""
        if self.client.kernel_stamps:
            self._on_stamped()
        else:
            self._on_readable()

    def _on_body(self, data: bytes) -> None:
        if self.resp.status_code == 200:
            feed_events(self.parser, self.state, data, self.now)
        elif len(self.err_body) < _ERR_BODY_MAX:
            self.err_body.extend(data[: _ERR_BODY_MAX - len(self.err_body)])

    def _on_deadline(self) -> None:
        self.timed_out = True
        self._finish(f"no complete response within {self.limit:g} s")

    def _finish(self, error: str | None) -> None:
        if self.finished:
            return
        self.finished = True
        end_t = time.monotonic()
        self._unwatch()
        self._stop_connect_timer()
        close_watcher(self._deadline_timer)
        if self.sock is not None:
            self.sock.close()
        resp = self.resp
        headers = bool(resp.headers_complete)
        status = resp.status_code if headers else None
        if headers and status != 200 and error is None:
            error = f"HTTP {status}: {self.err_body.decode('utf-8', errors='replace').strip()[:300]}"
        ex = Exchange(self.state, Transport(status, self.timed_out, error, headers), self.sent_t, end_t)
        try:
            self.on_done(ex)
        except Exception:
            log.exception("on_done of a stream failed")

    # -- watchers ----------------------------------------------------------------------------

    def _watch(self, events: int, callback: Callable[[], None], priority: int = 0) -> None:
        """Level-triggered readiness watcher on the socket (one at a time)."""
        assert self.sock is not None
        self._unwatch()
        fd = self.sock.fileno()
        self._watcher = get_hub().loop.io(fd, events, True, priority)
        self._events = events
        self._urgent = priority > 0
        self._watcher.start(callback)
        if self._urgent and events == _READ:
            self._polled = self.client.wait_first_token(self, fd)

    def _unwatch(self) -> None:
        if self._polled:
            self._polled = False
            self.client.stop_waiting(self.sock.fileno())  # type: ignore[union-attr]
        close_watcher(self._watcher)
        self._watcher = None
        self._events = 0
        self._urgent = False

    def _stop_connect_timer(self) -> None:
        close_watcher(self._connect_timer)
        self._connect_timer = None

"""Incremental parser for one HTTP/1.1 response (pure: no I/O).

The streaming client feeds it every `recv` as it happens, once per streamed token, so the
common case (one whole chunk of chunked transfer coding per `recv`) is a handful of bytes
operations. It handles what a streaming LLM server can send: an optional 1xx interim
response, chunked / Content-Length / close-delimited bodies (RFC 9112 section 6.3), chunk
extensions and trailers, and bytes split anywhere. Anything else is an `HTTPParseError`
naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_HEAD = 64 * 1024  # status line + headers
MAX_SIZE_LINE = 1024  # chunk-size line with extensions

_HEX = b"0123456789abcdefABCDEF"
_HEAD, _SIZE, _DATA, _DATA_END, _TRAILER, _LENGTH, _CLOSE, _DONE = range(8)


class HTTPParseError(ValueError):
    pass


class ResponseParser:
    """Feed bytes with `feed`, and `feed_eof` when the peer closed. Body bytes (transfer
    coding removed) go to `on_body` as soon as they are parsed."""

    __slots__ = (
        "_buf",
        "_left",
        "_on_body",
        "_state",
        "headers",
        "headers_complete",
        "message_complete",
        "status_code",
    )

    def __init__(self, on_body: Callable[[bytes], None]) -> None:
        self._on_body = on_body
        self._buf = b""
        self._state = _HEAD
        self._left = 0  # bytes left in the current chunk or Content-Length body
        self.status_code: int | None = None
        self.headers: dict[str, str] = {}  # lower-case names; repeated fields joined by ", "
        self.headers_complete = False
        self.message_complete = False

    def feed(self, data: bytes) -> None:
        if self._state == _SIZE and not self._buf:
            # Fast path: exactly one whole chunk, e.g. b"8f\r\n<143 bytes>\r\n".
            i = data.find(b"\r\n")
            if 0 < i <= 8 and not data[:i].strip(_HEX):
                size = int(data[:i], 16)
                if size > 0 and len(data) == i + 4 + size and data.endswith(b"\r\n"):
                    self._on_body(data[i + 2 : i + 2 + size])
                    return
        self._buf = self._buf + data if self._buf else data
        self._run()

    def feed_eof(self) -> None:
        """The peer closed: completes a close-delimited body, anything else stays incomplete."""
        if self._state == _CLOSE:
            self._state = _DONE
            self.message_complete = True

    def _run(self) -> None:
        """Parse what `_buf` holds, in one pass: a position moves through it (nothing is copied
        but the pieces of body), so a read holding many chunks, which a client that fell behind
        gets, costs in proportion to its length. The body bytes found go to `on_body` in one
        call, before any error is raised."""
        buf, pos, n = self._buf, 0, len(self._buf)
        parts: list[bytes] = []
        try:
            while pos < n:
                state = self._state
                if state == _SIZE:
                    pos = self._whole_chunks(buf, pos, n, parts)
                    if pos == n:
                        break
                    i = buf.find(b"\r\n", pos)
                    if i < 0:
                        if n - pos > MAX_SIZE_LINE:
                            raise HTTPParseError("chunk-size line too long")
                        break
                    line, pos = buf[pos:i], i + 2
                    digits = line.split(b";", 1)[0].rstrip(b" \t")  # chunk extensions are ignored
                    if not digits or digits.strip(_HEX) or len(digits) > 16:
                        raise HTTPParseError(f"bad chunk size {line[:40]!r}")
                    size = int(digits, 16)
                    if size == 0:
                        self._state = _TRAILER
                    else:
                        self._left = size
                        self._state = _DATA
                elif state in (_DATA, _LENGTH):
                    take = min(self._left, n - pos)
                    parts.append(buf[pos : pos + take])
                    pos += take
                    self._left -= take
                    if self._left == 0:
                        if state == _DATA:
                            self._state = _DATA_END
                        else:
                            self._done()
                elif state == _DATA_END:
                    if n - pos < 2:
                        break
                    if buf[pos : pos + 2] != b"\r\n":
                        raise HTTPParseError("chunk data not followed by CRLF (chunk size wrong?)")
                    pos += 2
                    self._state = _SIZE
                elif state == _TRAILER:
                    i = buf.find(b"\r\n", pos)
                    if i < 0:
                        if n - pos > MAX_HEAD:
                            raise HTTPParseError("trailer section too long")
                        break
                    empty, pos = i == pos, i + 2
                    if empty:
                        self._done()
                elif state == _CLOSE:
                    parts.append(buf[pos:])
                    pos = n
                elif state == _HEAD:
                    end = buf.find(b"\r\n\r\n", pos)
                    if end < 0:
                        if n - pos > MAX_HEAD:
                            raise HTTPParseError(f"response head longer than {MAX_HEAD} bytes")
                        break
                    self._head(buf[pos:end])
                    pos = end + 4
                else:  # _DONE
                    raise HTTPParseError("bytes after the end of the response")
        finally:
            self._buf = buf[pos:] if pos < n else b""
            if parts:
                self._on_body(parts[0] if len(parts) == 1 else b"".join(parts))

    @staticmethod
    def _whole_chunks(buf: bytes, pos: int, n: int, parts: list[bytes]) -> int:
        """Whole non-empty chunks from `pos` on (the usual case), their data appended to `parts`;
        returns where the first one that is not whole, or not plain, begins."""
        while pos < n:
            i = buf.find(b"\r\n", pos, pos + 18)  # a size line of up to 16 hex digits
            if i <= pos or buf[pos:i].strip(_HEX):
                return pos
            size = int(buf[pos:i], 16)
            end = i + 2 + size
            if size == 0 or end + 2 > n or buf[end : end + 2] != b"\r\n":
                return pos
            parts.append(buf[i + 2 : end])
            pos = end + 2
        return pos

    def _head(self, head_bytes: bytes) -> None:
        lines = head_bytes.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (parts[1].isdigit() and len(parts[1]) == 3):
            raise HTTPParseError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HTTPParseError(f"bad header line {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if 100 <= status < 200 and status != 101:
            return  # interim response (100 Continue, 103 Early Hints): the real one follows
        self.status_code = status
        self.headers = headers
        self.headers_complete = True
        te = headers.get("transfer-encoding", "")
        if status in (204, 304):
            self._done()
        elif te:
            if te.rsplit(",", 1)[-1].strip().lower() != "chunked":
                raise HTTPParseError(f"unsupported Transfer-Encoding {te!r}")
            self._state = _SIZE
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit():
                raise HTTPParseError(f"bad Content-Length {cl[:40]!r}")
            self._left = int(cl)
            self._state = _LENGTH
            if self._left == 0:
                self._done()
        else:
            self._state = _CLOSE

    def _done(self) -> None:
        self._state = _DONE
        self.message_complete = True

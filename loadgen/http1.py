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

    __slots__ = ("_buf", "_left", "_on_body", "_state", "headers", "headers_complete", "message_complete", "status_code")

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
        state = self._state
        if state == _SIZE and not self._buf:
            # Fast path: exactly one whole chunk, e.g. b"8f\r\n<143 bytes>\r\n".
            i = data.find(b"\r\n")
            if 0 < i <= 8 and not data[:i].strip(_HEX):
                size = int(data[:i], 16)
                if size > 0 and len(data) == i + 4 + size and data.endswith(b"\r\n"):
                    self._on_body(data[i + 2 : i + 2 + size])
                    return
        elif state == _DONE:
            if data:
                raise HTTPParseError("bytes after the end of the response")
            return
        self._buf = self._buf + data if self._buf else data
        self._run()

    def feed_eof(self) -> None:
        """The peer closed: completes a close-delimited body, anything else stays incomplete."""
        if self._state == _CLOSE:
            self._state = _DONE
            self.message_complete = True

    def _take_counted(self) -> bool:
        """Pass on up to the `_left` bytes still due (a chunk's or a Content-Length body's);
        True once they all have been."""
        take = self._buf[: self._left]
        self._buf = self._buf[len(take) :]
        self._left -= len(take)
        if take:
            self._on_body(take)
        return self._left == 0

    def _run(self) -> None:
        while self._buf:
            before = (self._state, len(self._buf))
            state = self._state
            if state == _HEAD:
                self._head()
            elif state == _SIZE:
                self._size()
            elif state == _DATA:
                if self._take_counted():
                    self._state = _DATA_END
            elif state == _DATA_END:
                if len(self._buf) < 2:
                    return
                if self._buf[:2] != b"\r\n":
                    raise HTTPParseError("chunk data not followed by CRLF (chunk size wrong?)")
                self._buf = self._buf[2:]
                self._state = _SIZE
            elif state == _TRAILER:
                self._trailer()
            elif state == _LENGTH:
                if self._take_counted():
                    self._done()
            elif state == _CLOSE:
                body, self._buf = self._buf, b""
                self._on_body(body)
            else:  # _DONE
                raise HTTPParseError("bytes after the end of the response")
            if (self._state, len(self._buf)) == before:
                return  # waiting for more bytes

    def _head(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                raise HTTPParseError(f"response head longer than {MAX_HEAD} bytes")
            return
        head, self._buf = self._buf[:end], self._buf[end + 4 :]
        lines = head.decode("latin-1").split("\r\n")
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

    def _size(self) -> None:
        i = self._buf.find(b"\r\n")
        if i < 0:
            if len(self._buf) > MAX_SIZE_LINE:
                raise HTTPParseError("chunk-size line too long")
            return
        line, self._buf = self._buf[:i], self._buf[i + 2 :]
        digits = line.split(b";", 1)[0].rstrip(b" \t")  # chunk extensions are ignored
        if not digits or digits.strip(_HEX) or len(digits) > 16:
            raise HTTPParseError(f"bad chunk size {line[:40]!r}")
        size = int(digits, 16)
        if size == 0:
            self._state = _TRAILER
        else:
            self._left = size
            self._state = _DATA

    def _trailer(self) -> None:
        i = self._buf.find(b"\r\n")
        if i < 0:
            if len(self._buf) > MAX_HEAD:
                raise HTTPParseError("trailer section too long")
            return
        line, self._buf = self._buf[:i], self._buf[i + 2 :]
        if not line:
            self._done()

    def _done(self) -> None:
        self._state = _DONE
        self.message_complete = True

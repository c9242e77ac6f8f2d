"""A container registry on loopback that answers the OCI distribution API's manifest HEAD
(`HEAD /v2/<name>/manifests/<reference>`: 200 with Docker-Content-Digest when it holds the
manifest, 404 when not; opencontainers/distribution-spec, spec.md, "Checking if content exists in
the registry"), for the rehearsal's image check offline (campaign/pin/image_check.py's mirrors).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar


class _Handler(BaseHTTPRequestHandler):
    held: ClassVar[dict[str, str]] = {}  # "<name>/manifests/<reference>" -> digest (one dict per server)

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        digest = self.held.get(self.path.removeprefix("/v2/"))
        self.send_response(200 if digest else 404)
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.send_header("Content-Length", "0")
        self.end_headers()


def held_manifests(images: Iterable[str]) -> dict[str, str]:
    """What a registry holding `images` (each pinned by digest) answers: every image's manifest
    by its digest and by its tag."""
    from campaign.pin.image_check import image_parts

    held = {}
    for image in images:
        _, repository, tag, digest = image_parts(image)
        if digest:
            held[f"{repository}/manifests/{digest}"] = digest
            if tag:
                held[f"{repository}/manifests/{tag}"] = digest
    return held


@contextmanager
def registry_stand_in(held: dict[str, str]) -> Iterator[str]:
    """The registry serving `held` (held_manifests) on a free loopback port; yields its host:port."""
    handler = type("Registry", (_Handler,), {"held": held})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

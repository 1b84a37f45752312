"""ASGI middleware that must act before FastAPI parses anything."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import error_response


class BodySizeLimit:
    """Answer 413 ``payload_too_large`` for a body over ``max_bytes``, before it is parsed.

    A declared Content-Length is checked at once; a body without one (chunked) is read up to the limit
    and then handed on.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await error_response(400, "bad_request", "invalid Content-Length header")(scope, receive, send)
                return
            if size > self.max_bytes:
                await self._reject(size, scope, receive, send)
                return
            await self.app(scope, receive, send)
            return

        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._reject(None, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, size: int | None, scope: Scope, receive: Receive, send: Send) -> None:
        what = f"{size:,} bytes" if size is not None else "more than that"
        response = error_response(
            413, "payload_too_large", f"request body is {what}; the limit is {self.max_bytes:,} bytes"
        )
        await response(scope, receive, send)

"""A request whose client has gone is not computed: its handler stops waiting for the answer,
which cancels the request's place in its batcher's queue (a batch already running finishes for
the others in it), and the access log and metrics record 499, not 200."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's status for a request whose client closed the connection first


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def _disconnected(http: Request) -> None:
    # the body has been read: the server's next message is the disconnect
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def unless_client_gone(http: Request, answer: Awaitable[T]) -> T:
    """``answer``'s result, or ClientGone (``answer`` cancelled) once the client has disconnected."""
    work, gone = asyncio.ensure_future(answer), asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientGone
    finally:
        gone.cancel()
        work.cancel()

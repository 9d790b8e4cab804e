"""One websocket carrying several replica sessions (SPEC 14, `{shared: true}`): `/v1/mux`.

The tabs of one browser share one socket to the hub (`client/web/lib/shared.js`): each tab's
replica is a session of its own (its own client id, token, seq and presence), and each runs
over a *channel* of the shared socket. On the hub a channel is a `Channel`, which quacks like
the websocket connection `server.sockets` serves, so a session over a channel goes through
exactly the code a session over its own socket does: the same checks, limits and rules.

The frames (text, but a binary state frame stays binary): the first character says what it is,
the channel's number follows, then one space and the rest.

    o<n> <path>           replica -> hub: open channel n for `/v1/conversations/{id}`
    m<n> <message>        either way: a protocol message of channel n's session
    c<n> <code> <reason>  either way: channel n is closed (code and reason as a websocket's)

Channel numbers are the replica's, below 2^31; a closed channel's number is not used again on
that socket. A frame that does not parse closes the whole socket (`error bad_message`, 1008): it is
a bug of the peer's. A message for a channel that is not open is dropped (the hub may have
just closed it). At most `MAX_CHANNELS` are open at once. Tokens come in each session's hello
(a browser's socket carries no header): the shared socket's own `Authorization` header, if
any, is given to no channel, so a read-only tab never acts with another tab's token.

Async API: asyncio, as `server.subscriber` (the channel stands for a websockets connection).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import ServerConnection, broadcast
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.protocol import State

from sync.errors import CODES
from sync.frames import Binary
from sync.protocol import Error, encode_message

__all__ = ["MAX_CHANNELS", "MUX_PATH", "Channel", "is_mux_path", "serve_mux"]

MUX_PATH = "/v1/mux"
MAX_CHANNELS = 64
"""Channels open at once on one shared socket: a browser has as many tabs' conversations."""
INBOX = 2
"""Messages a channel holds before its session reads them (as `server.sockets.MAX_QUEUE`):
past it the shared socket is read no further until the session takes one."""

_FRAME = re.compile(rb"([omc])(\d{1,10}) ")
_BAD = CODES["bad_message"].close


def is_mux_path(path: str) -> bool:
    """Whether a websocket request's path is the shared socket's."""
    return path.split("?", 1)[0] == MUX_PATH


class _Request:
    __slots__ = ("headers", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.headers = Headers()  # no channel gets the shared socket's headers


class _Protocol:
    """What `Subscriber` reads of a connection's protocol: its state and extensions."""

    __slots__ = ("extensions", "state")

    def __init__(self) -> None:
        self.state = State.OPEN
        self.extensions = ("mux",)  # never framed as a plain socket's bytes (`Subscriber`)


class _Transport:
    """What a channel's writer asks of a transport: the shared socket's backlog, and a cut,
    which closes this channel only."""

    __slots__ = ("_channel",)

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def get_write_buffer_size(self) -> int:
        return int(self._channel.ws.transport.get_write_buffer_size())

    def abort(self) -> None:
        self._channel.ended(1006, "")


class Channel:
    """One session's side of a shared socket, standing for a websocket connection: `recv`,
    `send`, `close`, and `relay` (the write that does not wait, `Subscriber._write`)."""

    def __init__(self, ws: ServerConnection, number: int, path: str, socket: int) -> None:
        self.ws = ws
        self.number = number
        self.shared_socket = socket  # its id, shown in its sessions' presence entries
        self.request = _Request(path)
        self.remote_address = ws.remote_address
        self.protocol = _Protocol()
        self.transport = _Transport(self)
        self.connection_lost_waiter: asyncio.Future[None] = (
            asyncio.get_running_loop().create_future()
        )
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue(INBOX)
        self._prefix = b"m%d " % number
        self._sent_close = False

    @property
    def open(self) -> bool:
        return self.protocol.state is State.OPEN

    async def feed(self, data: bytes) -> None:
        """A message for this channel's session; waits while its inbox is full."""
        if self.open:
            await self._inbox.put(data)

    async def recv(self, decode: bool | None = None) -> bytes:
        if not self.open:
            raise ConnectionClosedOK(None, None)
        data = await self._inbox.get()
        if data is None:
            raise ConnectionClosedOK(None, None)
        return data

    def relay(self, frame: bytes) -> None:
        """Write `frame` to the shared socket now (no wait for the peer)."""
        if self.open:
            broadcast((self.ws,), self._prefix + frame, text=type(frame) is not Binary)

    async def send(self, frame: bytes, text: bool = True) -> None:
        if not self.open:
            raise ConnectionClosedOK(None, None)
        await self.ws.send(self._prefix + frame, text=text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close this channel: its peer is told (`c<n>`), the shared socket stays."""
        if self.open and not self._sent_close:
            self._sent_close = True
            frame = b"c%d %d %s" % (self.number, code, reason.encode())
            try:
                await self.ws.send(frame, text=True)
            except ConnectionClosed:
                pass
        self.ended(code, reason)

    async def ping(self) -> None:
        """Nothing: the shared socket is read by `serve_mux`, which holds no frame."""

    def ended(self, code: int, reason: str) -> None:
        """This channel is closed (by either side, or its socket ended)."""
        if not self.open:
            return
        self.protocol.state = State.CLOSED
        if not self.connection_lost_waiter.done():
            self.connection_lost_waiter.set_result(None)
        # What its session will not read goes: that wakes `serve_mux` if it waits to `feed`
        # a full inbox (else the shared socket would be read no more, its other channels
        # frozen), and the `None` ends a `recv` waiting.
        while not self._inbox.empty():
            self._inbox.get_nowait()
        self._inbox.put_nowait(None)


async def serve_mux(
    ws: ServerConnection, session: Callable[[Channel], Awaitable[None]], spawn: Any
) -> None:
    """Read the shared socket `ws` until it closes: open channels (each one's session run by
    `spawn(session, channel)` in a task of the caller's), hand each its messages, close them.
    Every channel still open when the socket ends is closed."""
    channels: dict[int, Channel] = {}
    used = -1  # channel numbers only grow
    # The id its sessions' presence entries show (`PresenceEntry.socket`): random, as entries
    # from other hubs' sockets are shown beside them (SPEC 9).
    socket = secrets.randbits(48)
    try:
        while True:
            try:
                data = await ws.recv(decode=False)
            except ConnectionClosed:
                break
            found = _FRAME.match(data)
            if found is None:
                await _refuse(ws, "a frame of /v1/mux starts o<n>, m<n> or c<n> and a space")
                break
            kind, number = found.group(1), int(found.group(2))
            body = data[found.end() :]
            if kind == b"m":
                channel = channels.get(number)
                if channel is not None:  # (closed ones are dropped at the next open)
                    await channel.feed(body)
                continue
            if kind == b"c":
                channel = channels.pop(number, None)
                if channel is not None:
                    code, _, reason = body.partition(b" ")
                    channel.ended(
                        int(code) if code.isdigit() else 1005, reason.decode("utf-8", "replace")
                    )
                continue
            if number <= used:
                await _refuse(ws, f"channel {number} was opened already on this socket")
                break
            for gone in [n for n, c in channels.items() if not c.open]:
                del channels[gone]
            if len(channels) >= MAX_CHANNELS:
                refused = b"c%d %d too many channels on this socket" % (
                    number,
                    CODES["rate_limited"].close,
                )
                await ws.send(refused, text=True)
                used = number
                continue
            used = number
            channel = channels[number] = Channel(
                ws, number, body.decode("utf-8", "replace"), socket
            )
            spawn(session, channel)
    finally:
        for channel in channels.values():
            channel.ended(1006, "")


async def _refuse(ws: ServerConnection, detail: str) -> None:
    """Close the shared socket on a frame that breaks the rules above (a bug of the peer's)."""
    try:
        await ws.send(encode_message(Error("bad_message", detail)), text=True)
        await ws.close(_BAD, "bad_message")
    except ConnectionClosed:
        pass

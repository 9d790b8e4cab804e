"""A websocket relay between replicas and a hub that injects faults on demand.

Frames cross unchanged unless a policy says otherwise: drop a frame to the replica (a lost
ack), duplicate a frame to the hub (a resent push), delay frames, or cut every connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from sync.protocol import SUBPROTOCOL

Frame = bytes
Policy = Callable[[Frame], bool]


def never(frame: Frame) -> bool:
    return False


def once(marker: bytes) -> tuple[Policy, list[bytes]]:
    """A policy true for the first frame containing `marker`, and the list it records it in."""
    hit: list[bytes] = []

    def policy(frame: Frame) -> bool:
        if not hit and marker in frame:
            hit.append(frame)
            return True
        return False

    return policy, hit


class FaultProxy:
    """Listens on 127.0.0.1 (port 0) and relays each connection to `upstream` (ws://host:port)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.drop_to_replica: Policy = never
        self.drop_to_hub: Policy = never
        self.duplicate_to_hub: Policy = never
        self.corrupt_to_replica: Policy = never
        self.cut_after_drop = True
        self.delay = 0.0
        self._server: Server | None = None
        self._pairs: set[tuple[ServerConnection, ClientConnection]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    async def __aenter__(self) -> Self:
        self._server = await serve(
            self._relay,
            "127.0.0.1",
            0,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            max_size=None,
            compression=None,
            ping_interval=None,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def heal(self) -> None:
        """Stop injecting faults (connections already cut stay cut)."""
        self.drop_to_replica = never
        self.drop_to_hub = never
        self.duplicate_to_hub = never
        self.corrupt_to_replica = never
        self.delay = 0.0

    def drop_next(self, marker: bytes) -> list[bytes]:
        """Drop the next frame to the replica that contains `marker` (then cut, as a lost
        frame on a real network comes with a lost connection). Returns the list the dropped
        frame will be put in."""
        policy, hit = once(marker)
        self.drop_to_replica = policy
        return hit

    def corrupt_next(self, marker: bytes) -> list[bytes]:
        """Replace the next frame to the replica that contains `marker` with garbage."""
        policy, hit = once(marker)
        self.corrupt_to_replica = policy
        return hit

    def cut(self) -> None:
        """Abort every relayed connection at once (both sides see a dropped socket)."""
        for replica_side, hub_side in list(self._pairs):
            replica_side.transport.abort()
            hub_side.transport.abort()

    async def _relay(self, replica_side: ServerConnection) -> None:
        path = replica_side.request.path if replica_side.request else "/"
        try:
            upstream = await connect(
                self.upstream + path,
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                max_size=None,
                compression=None,
                ping_interval=None,
            )
        except (OSError, TimeoutError, InvalidHandshake):
            await replica_side.close(1013, "hub unreachable")  # the hub is down: try again
            return
        async with upstream as hub_side:
            pair = (replica_side, hub_side)
            self._pairs.add(pair)
            try:
                await asyncio.gather(
                    self._pump(replica_side, hub_side, self._to_hub),
                    self._pump(hub_side, replica_side, self._to_replica),
                )
            finally:
                self._pairs.discard(pair)

    async def _to_hub(self, frame: Frame, out: ClientConnection | ServerConnection) -> None:
        if self.drop_to_hub(frame):
            return
        await out.send(frame, text=True)
        if self.duplicate_to_hub(frame):
            await out.send(frame, text=True)

    async def _to_replica(self, frame: Frame, out: ClientConnection | ServerConnection) -> None:
        if self.drop_to_replica(frame):
            if self.cut_after_drop:
                self.cut()
            return
        if self.corrupt_to_replica(frame):
            frame = b'{"type":"records","from":"garbage"}'
        await out.send(frame, text=True)

    async def _pump(
        self,
        source: ClientConnection | ServerConnection,
        sink: ClientConnection | ServerConnection,
        forward: Callable[[Frame, ClientConnection | ServerConnection], object],
    ) -> None:
        try:
            while True:
                frame = await source.recv(decode=False)
                if self.delay:
                    await asyncio.sleep(self.delay)
                await forward(frame, sink)  # type: ignore[misc]
        except ConnectionClosed:
            sink.transport.abort()

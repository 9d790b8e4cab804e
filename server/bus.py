"""The bus between hubs that share a store: drafts and presence of other hubs (SPEC 9), the I/O.

How this works: a `Relay` runs in the hub's task group when the store is shared. Three loops:
the listener hands every bus message to the pure `Mirror` and shows its changes in loaded
rooms (answering asks from this hub's own rooms); the publisher takes, at most once per
`bus_interval`, what each room that said it had news wants other hubs to know
(`server.remote.relay_ops`) and publishes it as one message per conversation (several when a
payload would not fit the bus); the heartbeat writes this hub's heartbeat with its TTL, reads
the hubs alive, and has the mirror end what dead hubs held. A room that loads starts from the
mirror. Two buses: `RedisBus` (pub/sub on one channel, heartbeats as keys with a TTL) and
`PostgresBus` (`NOTIFY` through the store, a heartbeat table). Every failure is logged and
retried with capped, jittered backoff; it never stops the hub.
"""

from __future__ import annotations

import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from anyio.abc import TaskStatus

from sync.errors import UsageError
from sync.ids import now_ms

from .mirror import BusAsk, BusMessage, Change, Mirror, decode_bus, pack
from .remote import answer_ask, relay_ops
from .store.postgres_bus import NOTIFY_LIMIT, PostgresBus

if TYPE_CHECKING:
    from .config import HubConfig
    from .room import Room

__all__ = ["NOTIFY_LIMIT", "Bus", "PostgresBus", "RedisBus", "Relay", "open_bus"]

log = logging.getLogger("convsync.bus")

REDIS_LIMIT = 512 * 1024
"""Bytes per Redis message (Redis takes far more; this keeps one message one frame's worth)."""
_MAX_UNSENT = 10_000  # bus messages kept while the bus is down


class Bus(Protocol):
    """What a `Relay` needs of a bus."""

    limit: int

    async def publish(self, payloads: list[bytes]) -> None: ...

    def listen(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes | str]]: ...

    async def beat(self, hub: str, ttl: float) -> set[str]: ...

    async def forget(self, hub: str) -> None: ...

    async def aclose(self) -> None: ...


class RedisBus:
    """Redis pub/sub on one channel, heartbeats as keys that expire.

    Args:
        url: a `redis://` URL.
        namespace: prefix of the channel and keys (the store's channel: hubs on one store
            share it, hubs on another store never hear it).
    """

    limit = REDIS_LIMIT

    def __init__(self, url: str, namespace: str) -> None:
        try:
            import redis.asyncio as redis
        except ImportError as exc:  # the optional extra
            raise UsageError(
                "missing_extra",
                "--bus redis:// needs the redis package: pip install 'convsync[redis]'",
            ) from exc
        self._redis: Any = redis.from_url(url)
        self._channel = f"{namespace}:bus"
        self._keys = f"{namespace}:hub:"

    async def publish(self, payloads: list[bytes]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for payload in payloads:
                pipe.publish(self._channel, payload)
            await pipe.execute()

    @contextlib.asynccontextmanager
    async def _listen(self) -> AsyncIterator[AsyncIterator[bytes | str]]:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self._channel)

        async def payloads() -> AsyncIterator[bytes | str]:
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    yield message["data"]

        try:
            yield payloads()
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def listen(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes | str]]:
        return self._listen()

    async def beat(self, hub: str, ttl: float) -> set[str]:
        await self._redis.set(self._keys + hub, b"1", px=max(1, round(ttl * 1000)))
        alive: set[str] = set()
        async for key in self._redis.scan_iter(match=self._keys + "*", count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            alive.add(name[len(self._keys) :])
        return alive

    async def forget(self, hub: str) -> None:
        await self._redis.delete(self._keys + hub)

    async def aclose(self) -> None:
        await self._redis.aclose()


def open_bus(config: HubConfig, store: object) -> Bus:
    """The bus `config` asks for: Redis at `config.bus`, else `NOTIFY` through `store`."""
    namespace = str(getattr(store, "channel", "convsync"))
    if config.bus is not None:
        return RedisBus(config.bus, namespace)
    from .store.postgres import PostgresStore

    if not isinstance(store, PostgresStore):
        raise UsageError("bad_setting", "without --bus, drafts and presence need PostgreSQL")
    return PostgresBus(store)


class Relay:
    """This hub's side of the bus (see the module docs).

    Args:
        bus: the bus.
        config: the hub's settings (`bus_interval`, heartbeats).
        rooms: the hub's loaded rooms, by conversation id (read, never changed).
    """

    def __init__(self, bus: Bus, config: HubConfig, rooms: Mapping[str, Room]) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.bus = bus
        self.config = config
        self.mirror = Mirror(self.id, ask_again=max(200, round(config.heartbeat_interval * 1000)))
        self._rooms = rooms
        self._dirty: dict[str, Room] = {}  # rooms with news, published at the next flush
        self._outbox: list[BusMessage] = []  # answers and asks, sent at the next flush
        self._alive: set[str] | None = None  # the hubs alive at the last heartbeat
        self._wake = anyio.Event()

    # ------------------------------------------------------------------ rooms

    def attach(self, room: Room) -> None:
        """A room just loaded: it reports its news here, and starts with what the mirror
        holds for its conversation (called before the room is served)."""
        room.on_relay = self._news
        changes = self.mirror.changes_for(room.id)
        if changes:
            room.show_remote(changes)

    def _news(self, room: Room) -> None:
        self._dirty[room.id] = room
        self._wake.set()

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat, listen, publish; `task_status.started()` once listening (or after the
        first failure to, so a hub starts while its bus is down)."""
        try:
            async with anyio.create_task_group() as group:
                await self._beat_once()
                await group.start(self._listen)
                group.start_soon(self._heartbeats)
                group.start_soon(self._publish_loop)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                with contextlib.suppress(Exception):
                    await self.bus.forget(self.id)
                with contextlib.suppress(Exception):
                    await self.bus.aclose()

    async def _listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        failures = 0
        started = False
        while True:
            try:
                async with self.bus.listen() as payloads:
                    failures = 0
                    # Whatever was said while nobody here listened: every hub sends all again.
                    await self._send([BusMessage(self.id, "", [BusAsk()])])
                    if not started:
                        started = True
                        task_status.started()
                    async for payload in payloads:
                        self._heard(payload)
            except Exception as exc:
                failures += 1
                log.warning("the bus failed (%s); listening again", exc)
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** max(failures - 1, 0))))

    def _heard(self, payload: bytes | str) -> None:
        message = decode_bus(payload)
        if message is None:
            return
        heard = self.mirror.receive(message, now_ms())
        self._show(heard.changes)
        for conversation, draft_id in heard.asked:
            self._answer(message.hub, conversation, draft_id)
        if heard.send:
            self._later(heard.send)

    def _show(self, changes: list[Change]) -> None:
        by_room: dict[str, list[Change]] = {}
        for change in changes:
            by_room.setdefault(change.conversation, []).append(change)
        for conversation, batch in by_room.items():
            room = self._rooms.get(conversation)
            if room is not None and room.on_relay is not None:
                room.show_remote(batch)

    def _answer(self, asker: str, conversation: str, draft_id: str | None) -> None:
        rooms = [self._rooms.get(conversation)] if conversation else list(self._rooms.values())
        messages = []
        for room in rooms:
            if room is None or room.on_relay is None:
                continue
            ops = answer_ask(room.core, draft_id)
            if ops:
                messages.append(BusMessage(self.id, room.id, ops))
        if messages:
            self._later(messages)

    def _later(self, messages: list[BusMessage]) -> None:
        self._outbox.extend(messages)
        self._wake.set()

    async def _send(self, messages: list[BusMessage]) -> None:
        payloads: list[bytes] = []
        for message in messages:
            payloads += pack(
                message.hub, message.conversation, message.ops, self.bus.limit, message.to
            )
        if payloads:
            await self.bus.publish(payloads)

    async def _publish_loop(self) -> None:
        interval = self.config.bus_interval
        failures = 0
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            messages, self._outbox = self._outbox, []
            dirty, self._dirty = self._dirty, {}
            for room in dirty.values():
                ops = relay_ops(room.core)
                if ops:
                    messages.append(BusMessage(self.id, room.id, ops))
            try:
                await self._send(messages)
                failures = 0
            except Exception as exc:
                # Kept, in order, for the next try (up to a bound; past it other hubs see
                # gaps and ask, and silent drafts are asked for).
                failures += 1
                log.warning("publishing on the bus failed: %s", exc)
                if len(messages) + len(self._outbox) <= _MAX_UNSENT:
                    self._outbox[:0] = messages
                self._wake.set()
                await anyio.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** (failures - 1))))
            if interval > 0:
                await anyio.sleep(interval)  # coalesce: one message per room per interval

    async def _beat_once(self) -> None:
        try:
            # The heartbeat expires one interval early: the others check once an interval,
            # so they act within `heartbeat_ttl` of this hub's death, not an interval later.
            config = self.config
            alive = await self.bus.beat(self.id, config.heartbeat_ttl - config.heartbeat_interval)
        except Exception as exc:
            log.warning("the heartbeat failed: %s", exc)
            return
        self._show(self.mirror.expire(alive | {self.id}))
        silent = self.mirror.silent(now_ms(), round(self.config.draft_timeout * 1000))
        if silent:
            self._later(silent)
        if self._alive is not None:
            # A hub that is back (or new) may hold what this mirror dropped: ask it.
            for hub in sorted(alive - self._alive - {self.id}):
                self._later([BusMessage(self.id, "", [BusAsk()], hub)])
        self._alive = alive

    async def _heartbeats(self) -> None:
        while True:
            await anyio.sleep(self.config.heartbeat_interval)
            await self._beat_once()

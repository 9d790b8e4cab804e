"""Summary sockets showing the same window share it (issue 34's CPU bar): the diff is worked out
and encoded once per tick for all of them, each sends the same frames, and a socket that fell
behind what the window keeps gets a snapshot instead of a gap."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from conftest import bound
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

import server.web
from client import connect
from server import Hub
from server.auth import ANONYMOUS
from server.web import Page, _Touched, _Window
from sync import Message
from sync.protocol import SUBPROTOCOL

FEEDS = 5
PUSHES = 12


async def summary(hub: Hub, **hello: Any) -> ClientConnection:
    ws = await ws_connect(f"ws://127.0.0.1:{hub.port}/v1/summary", subprotocols=[SUBPROTOCOL])
    await ws.send(json.dumps({"type": "hello", "token": None, **hello}))
    return ws


async def until_left(ws: ClientConnection, got: list[str]) -> None:
    """Read `ws`'s frames into `got` until share.a holds every push and the agent left."""
    row: dict[str, Any] = {"revision": 0, "online": []}
    while row["revision"] != PUSHES or row["online"]:
        got.append(str(await ws.recv()))
        row = {r["id"]: r for r in json.loads(got[-1])["rows"]}.get("share.a", row)


async def test_feeds_on_one_window_share_one_diff_per_tick(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five sockets on one window: every one gets the same frames, in the same order, and the
    window's diffs are worked out about once per frame, not once per socket; a socket on
    another window keeps its own."""
    diffs: dict[str, int] = {}
    real = _Window.diff

    async def counted(self: _Window) -> dict[str, Any] | None:
        diffs[self.page.prefix] = diffs.get(self.page.prefix, 0) + 1
        return await real(self)

    monkeypatch.setattr(_Window, "diff", counted)
    feeds = [await summary(hub, prefix="share.") for _ in range(FEEDS)]
    other = await summary(hub, prefix="share.a")
    frames: list[list[str]] = [[] for _ in feeds]
    with anyio.fail_after(bound(30)):
        for ws in [*feeds, other]:
            assert json.loads(await ws.recv())["type"] == "summary"
        async with connect(f"ws://127.0.0.1:{hub.port}", "share.a", client="agent") as py:
            for n in range(PUSHES):
                py.conversation.push(Message.user(f"step {n}"))
                await py.flush()
                await anyio.sleep(0.1)  # over several ticks
        for got, ws in zip(frames, feeds, strict=True):
            await until_left(ws, got)
        await until_left(other, [])
    for ws in [*feeds, other]:
        await ws.close()
    assert all(got == frames[0] for got in frames)
    assert all(json.loads(frame)["type"] == "summary_diff" for frame in frames[0])
    assert len(frames[0]) >= 3  # several ticks
    # Once per frame (a tick whose rooms changed nothing shows no frame), give or take the
    # ticks around the last frame: not FEEDS times.
    assert diffs["share."] <= len(frames[0]) + 3, (diffs, len(frames[0]))
    assert diffs["share.a"] >= 3


async def test_a_socket_behind_the_kept_frames_gets_a_snapshot(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket that did not tick for several diffs gets them all, in order, while they are
    kept; once they are not (past `KEPT_FRAMES`), one snapshot of the window as it is now."""
    web = hub._web
    page = Page(prefix="lag.")
    quick, slow, late = _Touched(), _Touched(), _Touched()
    window, first = await web._join(page, ANONYMOUS, quick)
    assert (await web._join(page, ANONYMOUS, slow))[0] is window
    assert first["rows"] == []

    async def step(text: str) -> list[tuple[bytes, bytes | None]]:
        async with connect(f"ws://127.0.0.1:{hub.port}", "lag.1", client="agent") as py:
            py.conversation.push(Message.user(text))
            await py.flush()
        await window.step()  # as the window's tick does (no socket runs it here)
        while window.rooms:  # one under an append, or the agent's leave
            await anyio.sleep(0.05)
            await window.step()
        return window.frames_for(quick)

    with anyio.fail_after(bound(30)):
        sent = [frame for n in range(3) for frame in await step(f"kept {n}")]
        assert [json.loads(data)["type"] for data, _ in sent] == ["summary_diff"] * len(sent)
        assert all(wire is not None and wire.endswith(data) for data, wire in sent)
        assert window.frames_for(slow) == sent  # all kept: the same frames, in order
        monkeypatch.setattr(server.web, "KEPT_FRAMES", 1)
        for n in range(3):
            await step(f"dropped {n}")
        ((caught_up, wire),) = window.frames_for(slow)
        assert wire is None  # framed for that socket alone
        snapshot = json.loads(caught_up)
        assert snapshot["type"] == "summary"
        assert [(r["id"], r["last"]["text"]) for r in snapshot["rows"]] == [("lag.1", "dropped 2")]
        # A socket joining a shown window starts from it, at its latest diff.
        assert (await web._join(page, ANONYMOUS, late))[1]["rows"] == snapshot["rows"]
        assert late.epoch == window.epoch
    for watcher in (quick, slow, late):
        web._leave(window, watcher)
    assert web._windows == {}


async def test_when_the_ticking_socket_leaves_another_takes_the_window_over(hub: Hub) -> None:
    """The window's diffs are worked out in the task of one of its sockets; once that socket
    closes, the others still get every change."""
    first = await summary(hub, prefix="hand.")
    with anyio.fail_after(bound(10)):
        assert json.loads(await first.recv())["type"] == "summary"
        (window,) = hub._web._windows.values()
        assert window.ticker is not None
        ticking = window.ticker[0]
        second = await summary(hub, prefix="hand.")
        assert json.loads(await second.recv())["type"] == "summary"
        await first.close()
        for _ in range(1000):  # the hub sees the close (bounded by the fail_after)
            if window.ticker is None or window.ticker[0] is not ticking:
                break
            await anyio.sleep(0.01)
        async with connect(f"ws://127.0.0.1:{hub.port}", "hand.1", client="agent") as py:
            py.conversation.push(Message.user("after the handover"))
            await py.flush()
            row: dict[str, Any] = {}
            while row.get("revision") != 1:
                diff = json.loads(await second.recv())
                row = {r["id"]: r for r in diff["rows"]}.get("hand.1", row)
    await second.close()


async def test_the_tick_writes_each_frame_to_parked_sockets_without_waking_them(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sockets of one window that sent everything get each next frame from the window's tick
    itself: their own tasks are not woken once per frame (20 dashboards woke 20 tasks a tick),
    and every socket still gets the same frames in order."""
    woken: list[int] = []
    real = _Window.frames_for

    def counted(self: _Window, watcher: _Touched) -> list[tuple[bytes, bytes | None]]:
        woken.append(1)
        return real(self, watcher)

    monkeypatch.setattr(_Window, "frames_for", counted)
    feeds = [await summary(hub, prefix="park.") for _ in range(FEEDS)]
    frames: list[list[str]] = [[] for _ in feeds]
    with anyio.fail_after(bound(30)):
        for ws in feeds:
            assert json.loads(await ws.recv())["type"] == "summary"
        async with connect(f"ws://127.0.0.1:{hub.port}", "park.a", client="agent") as py:
            for n in range(PUSHES):
                py.conversation.push(Message.user(f"step {n}"))
                await py.flush()
                await anyio.sleep(0.1)
        for got, ws in zip(frames, feeds, strict=True):
            row: dict[str, Any] = {"revision": 0, "online": []}
            while row["revision"] != PUSHES or row["online"]:
                got.append(str(await ws.recv()))
                row = {r["id"]: r for r in json.loads(got[-1])["rows"]}.get("park.a", row)
    for ws in feeds:
        await ws.close()
    assert all(got == frames[0] for got in frames) and len(frames[0]) >= 3
    # Woken only around the snapshot and the window's start, not once per frame per socket.
    assert len(woken) < len(frames[0]) * FEEDS / 2, (len(woken), len(frames[0]))

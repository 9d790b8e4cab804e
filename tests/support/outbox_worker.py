"""A worker process with an outbox, for the kill tests (`tests/net/test_outbox.py`).

`python outbox_worker.py URL CONVERSATION OUTBOX TEXT MODE`:
- `die`: push a user message `TEXT` and a note after it (replayed by a rebase, so a resend
  under a new seq would land it twice), then SIGKILL itself at once, before anything is sent;
- `hold`: push them, print `edited`, then wait (to be killed);
- `flush`: no edit; flush what the outbox holds and print `flushed`;
- `own`: print `holding` while it holds the outbox, then wait (to be killed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from client import connect
from sync import Aside, Message


async def main(url: str, conversation_id: str, outbox: str, text: str, mode: str) -> None:
    async with connect(
        url, conversation_id, outbox=outbox, connect_timeout=30, backoff=0.02, max_backoff=0.2
    ) as replica:
        if mode == "own":
            print("holding", flush=True)
            await asyncio.Event().wait()
        if mode == "flush":
            await replica.flush()
            print("flushed", flush=True)
            return
        made = replica.conversation.push(Message.user(text))
        replica.conversation.add_aside(Aside.note("note", text, made))
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)  # before the loop runs again: nothing sent
        print("edited", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))

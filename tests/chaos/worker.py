"""One chaos replica, in a process of its own: random edits from a seed, every step logged.

Run by the chaos harness as `python tests/chaos/worker.py URLS CONVERSATION CLIENT SEED OPS DIR
[OUTBOX]` (URLS: one hub url, or several separated by commas, tried in turn). With OUTBOX the
replica keeps an outbox there, and a worker started again after a kill -9 goes on from it: it
makes the edits its history file does not hold yet (drawn from a seed of that restart).
It writes `DIR/CLIENT.jsonl` (one line per operation, landed batch and conflict), then talks
with the harness on stdin/stdout: after its edits it prints `edited`; on `settle` it flushes
and prints `flushed`; on `final R` it waits until it has seen revision R, writes
`DIR/CLIENT.final.json` (its value's state and pending count) and prints `done`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import anyio

from client import Conflict, Replica
from sync import ChangeRecord, Message, approvals, encode
from sync.errors import UsageError

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "support"), str(HERE.parent)]  # helpers; conftest

from strategies import Run, draw_op  # noqa: E402

TOKEN = re.compile(r"<[\w-]+\.\d+>")
"""A token an edit inserted (client and step): unique in a run."""


def digest(record: ChangeRecord) -> str:
    """What identifies a record in the log: its change and author (the hub stamps `at`)."""
    return hashlib.sha1(encode(ChangeRecord(record.change, record.by, None))).hexdigest()


async def main(
    url: str, conversation_id: str, client: str, seed: int, ops: int, out: Path, outbox: str | None
) -> None:
    path = out / f"{client}.jsonl"
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):
        # Killed in the middle of writing a line (a long one goes in several writes): that
        # step's edit, if made, is in the outbox; its line is cut, and the step made again.
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    lines = [json.loads(line) for line in text.splitlines()]
    done = sum(line["kind"] == "op" for line in lines)
    history = path.open("a", buffering=1)

    def log(**line: Any) -> None:
        history.write(json.dumps({"client": client, **line}) + "\n")

    replica = LoggingReplica(
        url.split(","),
        conversation_id,
        client=client,
        max_backoff=0.2,
        connect_timeout=60,
        backoff=0.02,
        outbox=outbox,
    )
    # Some replicas let `local` alone stand for the log after a record or a few
    # (`client/session.py`), so their edits often set the log's value apart again; drawn
    # from a seed of its own, so the edits stay those of `seed`.
    replica.session.lag_floor = random.Random(f"lag {seed}").choice((0, 3, 64))
    replica.session.on_landed = lambda seq, records: log(
        kind="landed", seq=seq, records=[digest(r) for r in records]
    )
    # A restarted worker's edits come from a seed of their own (the first run's draws are
    # spent); the edits it made before the kill are in the history and the outbox.
    rng = random.Random(seed if not done else f"{seed} after {done}")

    def conflicted(event: Conflict) -> None:
        log(
            kind="conflict",
            reason=event.reason,
            detail=event.detail,
            record=json.loads(encode(event.record)),
        )

    # Logged as the replica emits them, not when a task reads them: a kill in between would
    # lose the line while the outbox already holds the rebase without the record.
    replica.on_conflict = conflicted
    async with replica:
        run = Run(conversation=replica.conversation)
        # The approvals this replica asked and went on after, as a worker keeps them: in its
        # history (another replica may have removed or rewritten an answer since it landed,
        # so the log alone cannot tell), and in its value, for an answer pushed just before
        # a kill and not yet logged (the outbox holds it).
        resumed = {id_ for line in lines for id_ in line.get("answered", ())}
        resumed |= set(ANSWER.findall(encode(replica.conversation).decode()))

        async def watch() -> None:
            async for _ in replica.events():
                pass

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            for step in range(done, ops):
                # A third of the edits insert a token of their own into a shared entry's or
                # note's text: concurrent edits of the same content, which must merge or
                # conflict (SPEC 16); the checker follows every token through the log.
                roll = rng.random()
                if roll < 0.33:
                    kind = "insert_token" if roll < 0.22 else "note_token"
                    op = (kind, f"<{client}.{step}>", rng.randrange(12), rng.randrange(40))
                elif roll < 0.5:
                    op = ("approval", rng.random(), rng.randrange(4))
                else:
                    op = draw_op(rng)
                before = len(run.minted)
                # What this edit was made on (a rewrite of a token it saw is deliberate), and
                # the token it put in.
                saw = set(TOKEN.findall(encode(replica.conversation).decode()))
                if op[0] == "approval":
                    approval_op(replica, client, op[1], op[2])
                else:
                    run.do(op)
                answered = resume(replica, client, resumed)
                made = run.made_since(before) + list(answered.values())
                saw = sorted(saw | set(TOKEN.findall(encode(replica.conversation).decode())))
                log(kind="op", step=step, op=op[0], made=made, saw=saw, answered=list(answered))
                await anyio.sleep(rng.random() * 0.015)
            print("edited", flush=True)
            await _expect("settle")
            with anyio.fail_after(120):
                await replica.flush()
            print("flushed", flush=True)
            revision = int((await _expect("final")).split()[1])
            with anyio.fail_after(120):
                await replica.wait_for(revision)
                await replica.flush()
            await anyio.sleep(0.05)  # let the events task log the last conflicts
            final = {
                "state": json.loads(encode(replica.conversation)),
                "pending": replica.pending,
                "revision": replica.session.confirmed.revision,
                "connects": replica.connects,
            }
            (out / f"{client}.final.json").write_text(json.dumps(final))
            group.cancel_scope.cancel()
    history.close()
    print("done", flush=True)


class LoggingReplica(Replica):
    """A replica that hands each `Conflict` to `on_conflict` as it is emitted."""

    on_conflict: Any = None

    def _emit(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, Conflict) and self.on_conflict is not None:
                self.on_conflict(event)
        super()._emit(events)


ANSWER = re.compile(r"after (\S+): \w+")
"""A worker's answer after an approval (`answer_text`): the id it answers."""


def approval_op(replica: Replica, client: str, roll: float, pick: int) -> None:
    """An approving UI or an asking worker (SPEC 12): ask in the open turn (the hub refuses
    it unless this replica opened the turn; with no turn open, it opens one of its own first,
    as a worker does), or decide another's open approval, approve or deny (refused when
    another decided first)."""
    conversation = replica.conversation
    opened = [(id_, a) for id_, a in approvals.approvals(conversation) if a.is_open]
    try:
        if roll < 0.4 or not opened:
            turns = conversation.turns()
            if not turns or turns[-1][1].end is not None:
                replica.open_turn()
            approvals.ask(
                conversation,
                key=f"k{pick}",
                prompt="may I?",
                asked_by="anonymous",
                asked_client=client,
            )
        else:
            # Another's approval (a UI deciding), never its own: the hub refuses that
            # (`forbidden`, tests/server/test_approvals.py), and the refusal takes with it every
            # edit pending in the same batch, which after a hub restart is often all of them.
            others = [(id_, a) for id_, a in opened if a.asked_client != client]
            if not others:
                return
            id_, _ = others[pick % len(others)]
            approvals.decide(conversation, id_, approve=roll < 0.8, decided_by="anonymous", at=1)
    except UsageError:
        pass  # no open turn, or decided here already: nothing to do


def resume(replica: Replica, client: str, resumed: set[str]) -> dict[str, str]:
    """The asking worker goes on once a person decided (SPEC 12): for each approval this
    replica asked that it now sees decided, its answer, pushed once (`after ID: STATE`, a text
    of its own, so the checker finds any copy of it: "no assistant message duplicated after an
    approval"). It goes on a decision in the log (`session.confirmed`), not on one made in
    its own local value, which the hub refuses (the asker never decides its own approval).
    Returns the entries it pushed, by the approval each answers."""
    made = {}
    for id_, approval in approvals.approvals(replica.session.confirmed):
        if approval.asked_client != client or approval.is_open or id_ in resumed:
            continue
        resumed.add(id_)
        made[id_] = replica.conversation.push(Message.assistant(answer_text(id_, approval)))
    return made


def answer_text(id_: str, approval: approvals.Approval) -> str:
    """The text of the worker's answer after approval `id_` was decided."""
    return f"after {id_}: {approval.state}"


async def _expect(word: str) -> str:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if not line.startswith(word):
        raise SystemExit(f"expected {word!r} from the harness, got {line!r}")
    return line


if __name__ == "__main__":
    url, conversation_id, client, seed, ops, out = sys.argv[1:7]
    outbox = sys.argv[7] if len(sys.argv) > 7 else None
    asyncio.run(main(url, conversation_id, client, int(seed), int(ops), Path(out), outbox))

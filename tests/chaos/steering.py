"""Steering chaos (SPEC 10, 12): UIs that type, press Stop and approve at random moments
against a worker that runs turns with tool calls and asks before some of them, over real
sockets with cut and delayed links, from a seed.

How a run goes: one hub (strict pairing on) in this process; a worker replica runs the
pattern of the README (a turn it owns, steps marked, a tool run under `cancel_on_stop`,
`finish_stopped` on a stop, answers streamed as drafts); K UI replicas type messages and press
Stop at random, and approve or deny the worker's open approvals (it asks, `replica.ask`,
before half of its tool calls, and runs the tool only when approved); a nemesis cuts and
delays the links through `FaultProxy`s. When the UIs are done, the worker answers what is
still owed (a UI decides what it still asks), and the checker folds the hub's log record by
record: strict pairing holds at every revision, `validate()` holds at every revision where no
call is pending (so no request ever landed between a call and its result), every message a UI
typed landed exactly once, no assistant message (each call and answer is made with a text of
its own) landed twice, no approval was decided twice (`checker._check_approvals`), every turn
ended, and every replica equals the hub.

Run many seeds with `python tests/chaos/steering.py --seeds 1:201` (`--write`: the totals go
to `docs/reliability.md`, section "Steering chaos").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "support"), str(HERE.parent)]  # helpers; conftest

import checker  # noqa: E402
from conftest import bound, hub_config  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

from client import Conflict, Replica  # noqa: E402
from server import Hub, MemoryStore  # noqa: E402
from sync import (  # noqa: E402
    AsideChange,
    Assistant,
    ChangeRecord,
    Conversation,
    Message,
    PairingError,
    Push,
    Text,
    ToolCall,
    TurnEnd,
    decode_record,
)
from sync.steer import QUEUED_KIND, finish_stopped, mid_step  # noqa: E402
from sync.strict import strict_violation  # noqa: E402

CONVERSATION = "steer"


@dataclass
class Report:
    seed: int
    typed: int = 0
    stops: int = 0
    revisions: int = 0
    calls: int = 0  # tool calls landed
    asked: int = 0  # approvals the worker asked (landed)
    decided: int = 0  # approvals decided (approved, denied or cancelled by a stop)
    decided_twice: int = 0
    lost: int = 0  # typed messages missing from the log
    duplicated: int = 0  # typed messages, or assistant messages, landed more than once
    unpairable: int = 0  # revisions failing strict pairing or validate()
    conflicts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    trail: list[str] = field(default_factory=list)  # the records before the first problem


async def run(seed: int, uis: int = 2, ops: int = 12) -> Report:
    """One seed; the report lists every problem found (none: the run passed)."""
    rng = random.Random(seed)
    report = Report(seed)
    typed: dict[str, str] = {}  # entry id -> text, every message a UI typed
    config = hub_config(turn_grace=30.0)
    async with Hub(MemoryStore(), port=0, config=config) as hub:
        proxies = [FaultProxy(hub.url) for _ in range(uis + 1)]
        for proxy in proxies:
            await proxy.__aenter__()
        try:
            replicas = [
                Replica(proxy.url, CONVERSATION, client=f"c{k}", backoff=0.02, max_backoff=0.1,
                        draft_interval=0.005, connect_timeout=bound(20))
                for k, proxy in enumerate(proxies)
            ]  # fmt: skip
            for replica in replicas:
                await replica.__aenter__()
            worker, people = replicas[0], replicas[1:]
            done = anyio.Event()
            with anyio.fail_after(bound(120)):
                async with anyio.create_task_group() as group:
                    group.start_soon(_work, worker, random.Random(rng.random()), done)
                    group.start_soon(_nemesis, proxies, random.Random(rng.random()), done)
                    group.start_soon(_decide_rest, people[0], random.Random(rng.random()), done)
                    async with anyio.create_task_group() as typing:
                        for ui in people:
                            typing.start_soon(
                                _type, ui, random.Random(rng.random()), ops, typed, report
                            )
                    for ui in people:
                        await ui.flush()
                    for proxy in proxies:
                        proxy.heal()
                    # The worker answers what is still owed, then stops.
                    await _idle(worker)
                    done.set()
                for replica in replicas:
                    await replica.flush()
                loaded = await hub.store.load(CONVERSATION)
                assert loaded is not None
                for replica in replicas:
                    await replica.wait_for(loaded.revision)
            for replica in replicas:
                for event in replica.events_nowait():
                    if isinstance(event, Conflict):
                        report.conflicts[event.reason] = report.conflicts.get(event.reason, 0) + 1
            _check(loaded.records, typed, replicas, report)
            for replica in replicas:
                await replica.aclose()
        finally:
            for proxy in proxies:
                await proxy.__aexit__(None, None, None)
    return report


async def _type(
    ui: Replica, rng: random.Random, ops: int, typed: dict[str, str], report: Report
) -> None:
    for step in range(ops):
        await anyio.sleep(rng.random() * 0.08)
        roll = rng.random()
        if roll < 0.25 and _decide(ui, rng):
            continue
        if roll < 0.8:
            text = f"{ui.client} says {step}"
            typed[ui.conversation.push(Message.user(text))] = text
            report.typed += 1
        else:
            ui.stop()
            report.stops += 1


def _decide(ui: Replica, rng: random.Random) -> bool:
    """Approve or deny an open approval, when this UI sees one; whether it did. Two UIs may
    decide one at once: one decision stands, the other is a `Conflict(decided)`."""
    opened = [id_ for id_, approval in ui.approvals.items() if approval.is_open]
    if not opened:
        return False
    ui.decide(rng.choice(opened), approve=rng.random() < 0.7, reason="chaos")
    return True


async def _decide_rest(ui: Replica, rng: random.Random, done: anyio.Event) -> None:
    """Once the UIs stop typing, this one decides whatever the worker still asks."""
    while not done.is_set():
        await anyio.sleep(0.02 + rng.random() * 0.05)
        _decide(ui, rng)


async def _nemesis(proxies: list[FaultProxy], rng: random.Random, done: anyio.Event) -> None:
    while not done.is_set():
        await anyio.sleep(0.05 + rng.random() * 0.2)
        proxy = rng.choice(proxies)
        if rng.random() < 0.5:
            proxy.cut()
        else:
            proxy.delay = 0.002 + rng.random() * 0.02
            await anyio.sleep(rng.random() * 0.2)
            proxy.delay = 0.0


def _owed(worker: Replica) -> bool:
    conversation = worker.conversation
    return conversation.awaits_model() or any(
        aside.kind == QUEUED_KIND for _, aside in conversation.asides()
    )


async def _idle(worker: Replica) -> None:
    """Until the worker holds nothing to answer, no turn open and no step under way."""
    while True:
        await worker.flush()
        conversation = worker.conversation
        turns = conversation.turns()
        running = bool(turns) and turns[-1][1].end is None
        if not _owed(worker) and not running and not mid_step(conversation):
            return
        await anyio.sleep(0.02)


async def _work(worker: Replica, rng: random.Random, done: anyio.Event) -> None:
    """The README's worker pattern: a loop with tools, stop and steer handled."""
    turn = 0
    while not done.is_set():
        await worker.flush()
        conversation = worker.conversation
        if worker.stop_requested():  # a stop of a turn that ended, or mid-step
            finish_stopped(conversation)
            continue
        if not conversation.awaits_model():
            await anyio.sleep(0.01)
            continue
        worker.open_turn()
        await worker.flush()  # the turn record alone: never superseded
        turn += 1
        if not await _steps(worker, rng, turn):
            finish_stopped(conversation)
        await worker.flush()


async def _steps(worker: Replica, rng: random.Random, turn: int) -> bool:
    """The turn's steps: tool calls, then a streamed answer; False when it was stopped. A
    step the hub refused `superseded` (a request landed after its base) is made again, as a
    worker calls its model again with the new input."""
    conversation = worker.conversation
    calls = rng.randrange(3)
    step = 0
    while True:
        step += 1
        if worker.stop_requested():
            return False
        if calls > 0:
            call_id = f"t{turn}s{step}"
            worker.begin_step()
            said = Text(f"searching ({call_id})")
            made = conversation.push(Assistant([said, ToolCall(call_id, "search", {"n": step})]))
            worker.end_step()
            await worker.flush()
            if not conversation.holds(made):
                continue  # superseded: call the model again
            result = "found"
            if rng.random() < 0.5:  # ask a person first (SPEC 12); a stop cancels the ask
                approval = await worker.ask(call=call_id)
                if approval.state == "cancelled" or worker.stop_requested():
                    return False
                result = "found" if approval.approved else "denied by a person"
            if result == "found":
                with worker.cancel_on_stop() as scope:
                    await anyio.sleep(rng.random() * 0.05)  # the tool runs
                if scope.cancelled_caught or worker.stop_requested():
                    return False
            conversation.push(Message.tool_result(call_id, "search", result))
            await worker.flush()  # input queued meanwhile lands with the result
            calls -= 1
            continue
        async with worker.draft() as draft:
            with draft.cancel_on_end():
                for word in ("the", "answer", "is", "here"):
                    draft.append(word + " ")
                    await anyio.sleep(rng.random() * 0.01)
            if draft.status is not None:
                return False  # stopping: the stop is finished with the turn
            # A text of its own (turn and step), so the checker finds any copy of it.
            text = f"the answer to turn {turn} (step {step})"
            answer_id = await draft.commit(Message.assistant(text))
        await worker.flush()
        if not conversation.holds(answer_id):
            continue  # superseded
        if worker.stop_requested():
            return False
        conversation.end_turn(TurnEnd.answered(answer_id))
        return True


def _check(
    records: list[bytes], typed: dict[str, str], replicas: list[Replica], report: Report
) -> None:
    problems = report.problems
    conversation = Conversation()
    for revision, data in enumerate(records, 1):
        conversation.apply(decode_record(data))
        violation = strict_violation(conversation, 0)
        if violation is not None:
            report.unpairable += 1
            problems.append(f"revision {revision}: strict pairing: {violation.message}")
        elif not conversation.pending_calls():
            try:
                conversation.validate()
            except PairingError as error:
                report.unpairable += 1
                problems.append(f"revision {revision}: validate: {error}")
        if report.unpairable and not report.trail:
            report.trail = [
                _brief(decode_record(d)) for d in records[max(0, revision - 8) : revision]
            ]
    report.revisions = len(records)
    decoded = [decode_record(data) for data in records]
    seen = checker.Report()
    checker._check_approvals(seen, decoded)
    report.asked, report.decided = seen.approvals_asked, seen.approvals_decided
    report.decided_twice = seen.decided_twice
    problems += seen.problems
    # Every assistant message the worker made, a call or an answer, holds a text or call id
    # of its own (a stopped partial, kept aborted, is the draft's text): none may be in the
    # log twice, after an approval above all.
    said: dict[str, int] = {}
    for entry in conversation.entries():
        message = entry.message
        if isinstance(message, Assistant):
            for part in message.content:
                if isinstance(part, ToolCall):
                    report.calls += 1
                    mark: str | None = part.id
                elif isinstance(part, Text) and not (message.stop and message.stop.is_failure()):
                    mark = part.text
                else:
                    mark = None
                if mark:
                    said[mark] = said.get(mark, 0) + 1
    for mark, count in said.items():
        if count > 1:
            report.duplicated += count - 1
            problems.append(f"duplicated: the assistant's {mark!r} landed {count} times")
    held = [entry.id for entry in conversation.entries()]
    texts = [
        "".join(p.text for p in entry.message.content if isinstance(p, Text))
        for entry in conversation.entries()
    ]
    for id_, text in typed.items():
        if id_ not in held:
            report.lost += 1
            problems.append(f"lost: {text!r}")
        elif texts.count(text) != 1:
            report.duplicated += 1
            problems.append(f"duplicated: {text!r}")
    turns = conversation.turns()
    if turns and turns[-1][1].end is None:
        problems.append("a turn is still open")
    for replica in replicas:
        if replica.conversation != conversation:
            problems.append(f"{replica.client} differs from the log")


def _brief(record: ChangeRecord) -> str:
    """A record in a few words (for a failed seed's trail)."""
    change = record.change
    if isinstance(change, Push):
        return "push " + " | ".join(
            f"{type(e.message).__name__}:{str(e.message.content)[:60]}" for e in change.entries
        )
    if isinstance(change, AsideChange):
        kind = change.aside.kind if change.aside is not None else "removed"
        value = change.aside.value if change.aside is not None else None
        return f"aside {change.id[-6:]} {kind} {str(value)[:80]}"
    return f"{type(change).__name__} {str(change)[:80]}"


COUNTS = ("typed", "stops", "revisions", "calls", "asked", "decided", "decided_twice", "lost",
          "duplicated", "unpairable")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1:21", help="a range START:STOP")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once")
    parser.add_argument("--write", action="store_true", help="write docs/reliability.md")
    args = parser.parse_args()
    start, stop = (int(x) for x in args.seeds.split(":"))
    began = time.monotonic()
    reports = asyncio.run(_seeds(range(start, stop), args.jobs))
    failed = [report.seed for report in reports if report.problems]
    totals = {key: sum(getattr(report, key) for report in reports) for key in COUNTS}
    conflicts: dict[str, int] = {}
    for report in reports:
        for reason, count in report.conflicts.items():
            conflicts[reason] = conflicts.get(reason, 0) + count
    seconds = round(time.monotonic() - began)
    print(f"{stop - start} seeds, {len(failed)} failed {failed}, {totals}, {conflicts}, {seconds}s")
    if args.write:
        _write(args, totals, conflicts, failed, seconds)
    sys.exit(1 if failed else 0)


async def _seeds(seeds: range, jobs: int) -> list[Report]:
    gate = asyncio.Semaphore(jobs)
    reports: list[Report] = []

    async def one(seed: int) -> None:
        async with gate:
            try:
                report = await run(seed)
            except Exception as exc:  # a hang or a crash fails that seed too
                report = Report(seed, problems=[f"harness: {type(exc).__name__}: {exc}"])
        reports.append(report)
        status = "ok" if not report.problems else f"FAIL {report.problems[:3]} {report.trail}"
        counts = ", ".join(f"{getattr(report, key)} {key}" for key in COUNTS)
        print(f"seed {seed}: {counts}, conflicts {report.conflicts}: {status}", flush=True)

    await asyncio.gather(*(one(seed) for seed in seeds))
    return sorted(reports, key=lambda report: report.seed)


def _write(
    args: argparse.Namespace,
    totals: dict[str, int],
    conflicts: dict[str, int],
    failed: list[int],
    seconds: int,
) -> None:
    root = HERE.parents[1]
    sys.path.insert(0, str(root))
    from bench._report import machine, now

    command = " ".join(["python", "tests/chaos/steering.py", *sys.argv[1:]])
    title = "## Steering chaos"
    seeds = len(range(*(int(x) for x in args.seeds.split(":"))))
    lines = [
        title,
        "",
        f"Command: `{command}` ({now()}, {machine()}).",
        "",
        "One hub (memory store, strict pairing on) in the harness's process; a worker with tool",
        "calls (it asks a person before half of them), 2 UIs typing, pressing Stop and deciding",
        "approvals at random, every link through a relay that cuts and delays (SPEC 10, 12).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| seeds run | {seeds} |",
        f"| messages typed / stops pressed | {totals['typed']} / {totals['stops']} |",
        f"| revisions checked (strict pairing at each; `validate()` at each with no call "
        f"pending) | {totals['revisions']} |",
        f"| tool calls landed | {totals['calls']} |",
        f"| approvals asked / decided | {totals['asked']} / {totals['decided']} |",
        f"| approvals decided twice | {totals['decided_twice']} |",
        f"| typed messages lost | {totals['lost']} |",
        f"| duplicated (typed or assistant messages) | {totals['duplicated']} |",
        f"| unpairable revisions | {totals['unpairable']} |",
        "| conflicts surfaced | "
        + (", ".join(f"`{k}` {v}" for k, v in sorted(conflicts.items())) or "0")
        + " |",
        f"| failed seeds | {len(failed)} {failed if failed else ''} |",
        f"| wall time | {seconds} s |",
        "",
    ]
    path = root / "docs" / "reliability.md"
    text = path.read_text()
    head, sep, rest = text.partition(title + "\n")
    tail = rest[rest.find("\n## ") + 1 :] if sep and "\n## " in rest else ""
    path.write_text(head.rstrip() + "\n\n" + "\n".join(lines) + ("\n" + tail if tail else ""))


if __name__ == "__main__":
    main()

"""The history checker: reads a chaos run's history and final state, names every violation.

It fails a run on:
- an acknowledged record missing from the log (`lost`);
- a record in the log more often than it was acknowledged (`duplicate`), the records the hub
  makes to land a queue (SPEC 10) excepted: each once, for a queued aside acknowledged;
- a replica not equal to the hub after quiescence (`diverged`);
- an entry a replica made that is neither in the log (held or retired) nor in a record reported
  by a `Conflict` event (`vanished`);
- the log refolded from scratch differing from the hub's state (`fold`);
- an acknowledged edit's change silently overwritten (`overwritten`): edits insert tokens of
  their own into shared entries' and notes' texts; walking the log, a record that puts an entry
  (or note) back under its id without a token it held before must come from a replica that had
  seen that token when it landed the record (a deliberate rewrite); one that never saw it
  overwrote an edit it did not know of, which the rebase must have merged or reported as a
  `Conflict` instead of landing;
- an approval decided twice, changed or removed after its decision, or a `(turn, key)` asked
  twice (SPEC 12: approving UIs and asking workers run among the edits);
- an assistant message duplicated after an approval (`after approval`): the worker that asked
  pushes one answer (`after ID: STATE`) once it sees the decision in the log; each must land
  once, after the decision it names, and name the state that stands.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sync import (
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Push,
    Reset,
    Splice,
    Text,
    approvals,
    decode_record,
    decode_state,
    encode,
)
from sync.entries import is_stopped_note
from sync.steer import QUEUED_KIND, queued_id

TOKEN = re.compile(r"<[\w-]+\.\d+>")
ANSWER = re.compile(r"after (\S+): (\w+)")
"""A worker's answer after an approval (`worker.answer_text`)."""


@dataclass
class Report:
    """What a run did and what went wrong (nothing, when `problems` is empty)."""

    problems: list[str] = field(default_factory=list)
    operations: int = 0
    acknowledged: int = 0
    log_records: int = 0
    conflicts: int = 0
    lost: int = 0
    duplicates: int = 0
    overwritten: int = 0
    edit_conflicts: int = 0
    approvals_asked: int = 0
    approvals_decided: int = 0
    decided_twice: int = 0
    answers: int = 0  # the workers' answers after a decision, landed
    answers_duplicated: int = 0  # copies of such an answer beyond its first
    tokens: int = 0
    faults: list[str] = field(default_factory=list)


def digest(record: ChangeRecord) -> str:
    return hashlib.sha1(encode(ChangeRecord(record.change, record.by, None))).hexdigest()


def _lands_queue(record: ChangeRecord, queued: set[str]) -> bool:
    """Whether `record` is one the hub makes to land a queue of asides `queued`."""
    change = record.change
    if isinstance(change, AsideChange):
        return change.aside is None and change.id in queued and record.by == Author.rig()
    if isinstance(change, Push) and len(change.entries) == 1:
        entry = change.entries[0]
        if record.by == Author.rig() and is_stopped_note(entry.message, entry.author):
            return True
        return entry.id is not None and queued_id(entry.id) in queued
    return False


def check(run_dir: Path, log: list[bytes], hub_state: bytes) -> Report:
    """Check the run in `run_dir` against the hub's `log` (encoded records) and state."""
    report = Report()
    landed: dict[tuple[str, int], list[str]] = {}
    made: dict[str, list[str]] = {}
    conflicted: set[str] = set()
    # digest of a landed record -> what its replica had seen (tokens) when it landed it.
    seen_at_landing: dict[str, set[str]] = {}
    for path in sorted(run_dir.glob("*.jsonl")):
        seen: set[str] = set()
        for line in path.read_text().splitlines():
            event: dict[str, Any] = json.loads(line)
            match event["kind"]:
                case "op":
                    report.operations += 1
                    made.setdefault(event["client"], []).extend(event["made"])
                    seen.update(event.get("saw", []))
                case "landed":
                    landed[(event["client"], event["seq"])] = event["records"]
                    for d in event["records"]:
                        seen_at_landing.setdefault(d, set()).update(seen)
                case "conflict":
                    report.conflicts += 1
                    report.edit_conflicts += event.get("reason") == "edited"
                    change = event["record"]["change"]
                    conflicted.update(entry["id"] for entry in change.get("entries", []))
                    aside = change.get("aside") if change.get("type") == "aside" else None
                    if isinstance(aside, dict) and aside.get("kind") == QUEUED_KIND:
                        conflicted.add(aside["value"]["id"])  # a queued entry's put refused

    acknowledged = Counter(d for records in landed.values() for d in records)
    records = [decode_record(data) for data in log]
    in_log = Counter(digest(record) for record in records)
    report.acknowledged = sum(acknowledged.values())
    report.log_records = len(records)
    missing = acknowledged - in_log
    extra = in_log - acknowledged
    # The hub lands a queue (SPEC 10) in records of its own, acknowledged by no client: a push
    # of a queued entry, its aside's removal, a STOPPED note before them. Each is expected
    # once, and only for a queued aside some client's acknowledged record put.
    queued = {
        record.change.id
        for record in records
        if isinstance(record.change, AsideChange)
        and record.change.aside is not None
        and record.change.aside.kind == QUEUED_KIND
        and digest(record) in acknowledged
    }
    for record in records:
        key = digest(record)
        if extra.get(key, 0) == 1 and _lands_queue(record, queued):
            del extra[key]
    report.lost = sum(missing.values())
    report.duplicates = sum(extra.values())
    if missing:
        report.problems.append(f"lost: {report.lost} acknowledged records missing from the log")
    if extra:
        report.problems.append(
            f"duplicate: {report.duplicates} records in the log beyond what was acknowledged"
        )

    _check_intent(report, records, seen_at_landing)
    _check_approvals(report, records)

    hub = decode_state(hub_state)
    refolded = Conversation()
    for record in records:
        refolded.apply(record)
    if refolded != hub:
        report.problems.append("fold: the log refolded from scratch differs from the hub")

    for path in sorted(run_dir.glob("*.final.json")):
        final = json.loads(path.read_text())
        client = path.name.removesuffix(".final.json")
        if final["pending"]:
            report.problems.append(f"diverged: {client} still has {final['pending']} pending")
        if decode_state(json.dumps(final["state"])) != hub:
            report.problems.append(f"diverged: {client} differs from the hub after quiescence")
        for id_ in made.get(client, []):
            if not (
                hub.holds(id_)
                or hub.is_retired(id_)
                or id_ in conflicted
                or hub.aside(queued_id(id_)) is not None  # queued, waiting for the step's end
            ):
                report.problems.append(f"vanished: {client} made {id_}, now nowhere")
                break
    return report


def _check_approvals(report: Report, records: list[ChangeRecord]) -> None:
    """SPEC 12: walking the log, an approval's value never changes once decided (decided
    twice, flipped, reopened or removed), and one `(turn, key)` is asked once."""
    decided: dict[str, approvals.Approval] = {}
    keys: dict[tuple[int, str], str] = {}
    answered: set[str] = set()
    for record in records:
        change = record.change
        if isinstance(change, Push):
            _check_answers(report, change, decided, answered)
            continue
        if not isinstance(change, AsideChange):
            if not isinstance(change, Reset):
                continue
            puts = [(saved.id, saved.aside) for saved in change.state.asides]
            gone = [id_ for id_ in decided if id_ not in dict(puts)]
        else:
            puts, gone = [(change.id, change.aside)], []
        for id_ in gone:
            report.problems.append(f"approval {id_} was decided, then removed")
        for id_, aside in puts:
            if aside is None:
                if id_ in decided:
                    report.problems.append(f"approval {id_} was decided, then removed")
                continue
            approval = approvals.approval_of(aside)
            if approval is None:
                continue
            first = keys.setdefault((approval.turn, approval.key), id_)
            if first != id_:
                report.problems.append(f"approval ({approval.turn}, {approval.key}) asked twice")
            held = decided.get(id_)
            if held is not None and held != approval:
                report.decided_twice += 1
                report.problems.append(
                    f"approval {id_} decided twice: {held.state} then {approval.state}"
                )
            elif held is None and not approval.is_open:
                decided[id_] = approval
                report.approvals_decided += 1
    report.approvals_asked = len(keys)


def _check_answers(
    report: Report, push: Push, decided: dict[str, approvals.Approval], answered: set[str]
) -> None:
    """A push holding workers' answers after approvals (`after ID: STATE`): each approval
    is answered once (a second push of it is an assistant message duplicated after an
    approval), after its decision landed, naming the state that stands."""
    for entry in push.entries:
        message = entry.message
        if not isinstance(message, Assistant):
            continue
        for part in message.content:
            found = ANSWER.fullmatch(part.text) if isinstance(part, Text) else None
            if found is None:
                continue
            id_, state = found.groups()
            if id_ in answered:
                report.answers_duplicated += 1
                report.problems.append(f"after approval: the answer after {id_} landed twice")
                continue
            answered.add(id_)
            report.answers += 1
            decision = decided.get(id_)
            if decision is None:
                report.problems.append(f"after approval: {id_} answered before its decision")
            elif decision.state != state:
                report.problems.append(
                    f"after approval: {id_} answered as {state}, decided {decision.state}"
                )


def _tokens(value: object) -> set[str]:
    return set(TOKEN.findall(encode(value).decode()))


def _check_intent(
    report: Report, records: list[ChangeRecord], seen_at_landing: dict[str, set[str]]
) -> None:
    """Follow every token through the log: each one a record drops from an entry or note it
    puts back under the same id must be one its replica had seen (see the module)."""
    held: dict[str, set[str]] = {}  # entry or aside id -> the tokens it holds now
    every: set[str] = set()
    for record in records:
        change = record.change
        replaced: list[tuple[str, set[str]]] = []
        if isinstance(change, Splice):
            kept = {entry.id: entry for entry in change.entries}
            for id_ in change.removed:
                if id_ in kept:
                    replaced.append((id_, _tokens(kept[id_].message)))  # type: ignore[arg-type]
                else:
                    held.pop(id_, None)  # removed: a removal is its own intent
            for entry in change.entries:
                if entry.id not in change.removed:
                    held[entry.id] = _tokens(entry.message)  # type: ignore[index]
        elif isinstance(change, AsideChange):
            if change.aside is None:
                held.pop(change.id, None)
            else:
                replaced.append((change.id, _tokens(change.aside.value)))
        elif hasattr(change, "entries"):  # a push
            for entry in change.entries:  # type: ignore[attr-defined]
                held[entry.id] = _tokens(entry.message)
        else:
            if hasattr(change, "state"):  # a reset: everything replaced by intent
                held.clear()
            continue
        seen = seen_at_landing.get(digest(record), set())
        for id_, now in replaced:
            dropped = held.get(id_, set()) - now - seen
            if dropped:
                report.overwritten += len(dropped)
                report.problems.append(
                    f"overwritten: a record replaced {id_} without {sorted(dropped)[0]},"
                    " an acknowledged edit its replica never saw"
                )
            held[id_] = now
            every |= now
    report.tokens = len(every)

"""Write `tests/vectors/*.json`: the behaviour the Python model and `client/web/convsync.js` share.

Run `PYTHONPATH=. python tests/support/gen_vectors.py` after changing the model, and commit the
result; `tests/sync/test_vectors.py` fails while the committed files differ from what this writes.

Three files:
- `ids.json`: strings that are (or are not) message and aside ids, with the time they carry.
- `fold.json`: record streams folded onto an empty conversation, each with the state,
  revision, halt and `awaits_model` expected afterwards, or the reason the record at `error.at`
  does not fit (`malformed` when the record does not even decode) and the value left before it,
  with the turn records read from the asides.
- `codes.json` (once `sync.errors` has the table): the error codes of SPEC 5 with their close
  codes and retry rules, and which code a close stands for.
- `session.json`: scripts for the replica session (`client/session.py`): each step's input
  (`hello`, an `edit` as the records it made, a hub message to `receive`, `next_push`,
  `disconnected`) with what came out (the message, frame, events, or a protocol error's reason),
  and what the session holds at the end.
- `rebase.json`: a base (records from empty), the log's records after it, the pending records
  made on the base, and the expected local value (state, revision, records left to push) and
  conflicts (index into `pending` and reason). `no_base` cases rebase without the base.
- `merge.json`: the three-way merge (`sync/merge.py`): `diffs` (a base, another text and the
  hunks between them, `[start, stop, text]` in code points), `texts` and `messages` (a base,
  ours, theirs and the merge, `null` for a conflict).

Everything is deterministic: ids come from a minter with a fixed clock and seed.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from client.session import ReplicaSession
from sync import (
    Aside,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Entry,
    IdMinter,
    Image,
    Message,
    Origin,
    Reasoning,
    Stop,
    Text,
    ToolCall,
    TurnEnd,
    Usage,
    User,
    approvals,
    compact,
    encode,
    errors,
    steer,
)
from sync.changes import AsideChange, ConversationState, HaltChange, Push, Reset
from sync.codec import decode_record
from sync.errors import ApplyError, DecodeError, ProtocolError
from sync.merge import diff, merge_message, merge_text
from sync.protocol import decode_hub_message
from sync.rebase import Conflict, rebase

VECTORS = Path(__file__).resolve().parents[1] / "vectors"

Json = Any


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


def _minter(seed: int) -> IdMinter:
    return IdMinter(clock=_Clock(), rng=random.Random(seed))


def _json(value: object) -> Json:
    return json.loads(encode(value))


def _fresh(seed: int) -> Conversation:
    return Conversation(ids=_minter(seed))


# ---------------------------------------------------------------- ids


def _ids() -> Json:
    minter = _minter(1)
    good = [minter.message_id() for _ in range(3)] + [minter.message_id(at=5)]
    aside = minter.aside_id()
    hex_ = good[0][4:]
    bad = [
        "msg_" + hex_.upper(),
        "msg_" + hex_[:12] + "4" + hex_[13:],  # version 4
        "msg_" + hex_[:16] + "c" + hex_[17:],  # variant not 10
        "msg_" + hex_[:-1],
        "msg_" + hex_ + "0",
        "msg-" + hex_,
        "aside_" + hex_,
        "",
        "msg_" + hex_[:-1] + "\u00e9",
    ]
    return {
        "message_ids": [{"id": id_, "valid": True, "made": int(id_[4:16], 16)} for id_ in good]
        + [{"id": id_, "valid": False} for id_ in bad],
        "aside_ids": [
            {"id": aside, "valid": True, "made": int(aside[6:18], 16)},
            {"id": good[0], "valid": False},
            {"id": "aside_" + hex_.replace("7", "6", 1), "valid": False},
        ],
    }


# ---------------------------------------------------------------- fold


def _fold_case(name: str, records: list[Json]) -> Json:
    """Fold `records` (JSON) as Python does, and write down what came out."""
    conversation = Conversation()
    error = None
    for at, data in enumerate(records):
        try:
            record = decode_record(json.dumps(data))
            conversation.apply(record)
        except (ApplyError, DecodeError) as exc:
            error = {"at": at, "reason": exc.reason}
            break
    expect: Json = {
        "state": _json(conversation.state()),
        "revision": conversation.revision,
        "halt": conversation.halted(),
        "awaits_model": conversation.awaits_model(),
        "turns": [[id_, _json(turn.value())] for id_, turn in conversation.turns()],
    }
    if error is not None:
        expect["error"] = error
    return {"name": name, "records": records, "expect": expect}


def _outbox(build: Callable[[Conversation], object], seed: int) -> list[Json]:
    conversation = _fresh(seed)
    build(conversation)
    return [_json(record) for record in conversation.unsaved()]


def _rec(change: object, by: Author | None = None, at: int | None = None) -> Json:
    return _json(ChangeRecord(change, by, at))  # type: ignore[arg-type]


def _fold_cases() -> list[Json]:
    cases: list[Json] = []
    minter = _minter(2)
    ids = [minter.message_id() for _ in range(6)]

    def chat(c: Conversation) -> None:
        c.push(Message.system("be brief"))
        with c.dated(1_800_000_100_000):
            c.extend([Message.user("weather?"), Message.user("in Paris")])
        c.push(Assistant([Text("checking"), ToolCall("c1", "weather", {"city": "Paris"})]))
        c.push(Entry(Message.tool_result("c1", "weather", "sunny"), author=Author.agent("w")))
        c.push(Message.assistant("sunny", Stop("stop")))

    base = _outbox(chat, 10)
    cases.append(_fold_case("pushes of every message kind", base))

    def halts(c: Conversation) -> None:
        c.push(Message.user("go"))
        c.halt("stopped")
        c.push(Message.user("again"))  # after a STOPPED note, in the same record
        c.halt("kept")
        c.resume()
        c.halt("kept")

    cases.append(_fold_case("halts, a STOPPED note and a clear", _outbox(halts, 11)))

    def failed(c: Conversation) -> None:
        c.push(Message.user("q"))
        c.push(Message.assistant("cut", Stop("error", "overloaded")))

    cases.append(_fold_case("a failed reply leaves the model owing", _outbox(failed, 12)))

    def splices(c: Conversation) -> None:
        c.extend([Message.user(str(n)) for n in range(5)])
        c.halt("kept")
        c.splice(slice(1, 3), [c.entry(2), Message.user("new")], Author.plugin("edit"))  # type: ignore[list-item]
        c.splice(slice(0, 0), [Message.system("first")], None)
        c.splice(slice(6, 6), [Message.user("last")], Author.user("me"))  # reaches the end
        c.splice(slice(2, 4), [], Author.plugin("cut"))

    spliced = _outbox(splices, 13)
    cases.append(_fold_case("splices: keep, insert, append, remove", spliced))

    def restores(c: Conversation) -> None:
        c.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])
        originals = [c.entry(0), c.entry(1)]
        c.splice(slice(0, 2), [Message.system("summary")], Author.plugin("compact"))
        c.restore(slice(0, 1), originals, Author.plugin("compact"))  # type: ignore[arg-type]

    cases.append(_fold_case("a restore unretires ids", _outbox(restores, 14)))

    def asides(c: Conversation) -> None:
        c.push(Message.user("hi"))
        turn = c.open_turn()
        first = c.add_aside(Aside.note("n1", "text", c.id(0)))
        second = c.add_aside(Aside("plugin.data", None, Author.plugin("p"), {"k": [1, 2.5, None]}))
        c.push(Message.assistant("hello"))
        c.end_turn(TurnEnd.answered(c.id(1)))
        c.replace_aside(first, Aside.note("n1", "edited", c.id(1)))
        c.remove_aside(second)
        assert turn.index == 0

    cases.append(_fold_case("asides: notes, turn records, replace, remove", _outbox(asides, 15)))

    def reset(c: Conversation) -> None:
        c.extend([Message.user("a"), Message.assistant("b")])
        c.add_aside(Aside.note("t", "x", c.id(1)))
        other = _fresh(99)
        other.push(Message.user("z"))
        other.splice(slice(0, 1), [Message.user("y")], None)
        other.halt("kept")
        c.reset(other, Author.plugin("rewrite"))
        c.push(Message.assistant("after"))

    cases.append(_fold_case("a reset replaces everything", _outbox(reset, 16)))

    def stamped(c: Conversation) -> None:
        with c.dated(1_700_000_000_000):
            c.push(Entry(Message.user("imported"), source_id="corpus:7"))

    cases.append(_fold_case("dated records and source ids", _outbox(stamped, 17)))

    def provider_fields(c: Conversation) -> None:
        c.push(Message.user("q"))
        c.push(
            Assistant(
                [
                    Reasoning("think", signature="sig=="),
                    Reasoning("", redacted=True, data="opaque"),
                    Reasoning("sum", provider_data={"id": "rs_1", "encrypted_content": "e"}),
                    Text("a"),
                    ToolCall("c1", "f", {"x": 1}, provider_data={"id": "fc_1"}),
                ],
                stop=Stop("tool_use"),
                origin=Origin("anthropic", "claude", "msg_1"),
                usage=Usage(10, 5, 3, None, 2),
            )
        )

    cases.append(
        _fold_case("provider fields: signatures, data, usage", _outbox(provider_fields, 18))
    )
    # A log written before the provider fields: the reply and its parts lack them.
    old_reply = {
        "role": "assistant",
        "content": [
            {"type": "reasoning", "text": "hmm"},
            {"type": "tool_call", "id": "c1", "name": "f", "arguments": {}},
        ],
    }
    old_entry = {"message": old_reply, "id": ids[5]}
    cases.append(
        _fold_case(
            "an old log reads with the provider defaults",
            [{"change": {"type": "push", "entries": [old_entry]}}],
        )
    )

    # Misfits: each fit rule broken once, after a valid prefix.
    head = base[:2]  # a system entry and two user entries
    held = [base[0]["change"]["entries"][0]]
    sys_id = held[0]["id"]
    user_ids = [e["id"] for e in base[1]["change"]["entries"]]

    def entry(id_: object, text: str = "x") -> Json:
        return {"message": {"role": "user", "content": [{"type": "text", "text": text}]}, "id": id_}

    def push(*entries: Json) -> Json:
        return {"change": {"type": "push", "entries": list(entries)}}

    def splice(start: object, stop: object, removed: list[Any], *entries: Json) -> Json:
        change = {"type": "splice", "start": start, "stop": stop, "removed": removed}
        return {"change": change | {"entries": list(entries)}}

    def aside_put(id_: str, **fields: Any) -> Json:
        aside = {"kind": "note", "after": None, "author": {"kind": "user"}, "value": 1} | fields
        return {"change": {"type": "aside", "id": id_, "aside": aside}}

    aside_ids = [minter.aside_id() for _ in range(2)]
    rig = {"author": {"kind": "rig"}, "value": None}
    removed_first = splice(0, 1, [sys_id])  # retires the system entry
    misfits: list[tuple[str, list[Json]]] = [
        ("push held", [*head, push(entry(ids[0]), entry(user_ids[1]))]),
        ("push held single", [*head, push(entry(sys_id))]),
        ("push retired", [*head, removed_first, push(entry(sys_id))]),
        ("push bad_id null", [*head, push(entry(None))]),
        ("push bad_id missing", [*head, push({"message": {"role": "system", "content": "s"}})]),
        ("push bad_id form", [*head, push(entry(ids[0]), entry("msg_" + "0" * 32))]),
        ("push repeated", [*head, push(entry(ids[0]), entry(ids[1]), entry(ids[0]))]),
        ("splice range stop past end", [*head, splice(1, 4, [])]),
        ("splice range start after stop", [*head, splice(2, 1, [])]),
        ("splice range negative", [*head, splice(-1, 1, [sys_id])]),
        ("splice removed wrong ids", [*head, splice(0, 1, [user_ids[0]])]),
        ("splice removed wrong order", [*head, splice(1, 3, list(reversed(user_ids)))]),
        ("splice removed too few", [*head, splice(0, 2, [sys_id])]),
        ("splice held outside", [*head, splice(0, 1, [sys_id], entry(user_ids[0]))]),
        ("splice repeated", [*head, splice(0, 1, [sys_id], entry(ids[0]), entry(ids[0]))]),
        ("splice bad_id", [*head, splice(0, 0, [], entry("nope"))]),
        (
            "splice keeps and restores",
            [*head, removed_first, splice(0, 1, [user_ids[0]], entry(sys_id), entry(user_ids[0]))],
        ),
        ("aside bad_id", [*head, aside_put("aside_x")]),
        ("aside message id", [*head, aside_put(ids[0])]),
        (
            "aside remove missing",
            [*head, {"change": {"type": "aside", "id": aside_ids[0], "aside": None}}],
        ),
        (
            "malformed aside field missing",
            [*head, {"change": {"type": "aside", "id": aside_ids[0]}}],
        ),
        ("malformed user content", [*head, push({"message": {"role": "user", "content": "x"}})]),
        (
            "aside remove twice",
            [
                *head,
                aside_put(aside_ids[0]),
                {"change": {"type": "aside", "id": aside_ids[0], "aside": None}},
                {"change": {"type": "aside", "id": aside_ids[0], "aside": None}},
            ],
        ),
        ("aside unsaved", [*head, aside_put(aside_ids[0], saved=False)]),
        (
            "aside put replaces in place",
            [
                *head,
                aside_put(aside_ids[0], value="a"),
                aside_put(aside_ids[1], value="b"),
                aside_put(aside_ids[0], value="c", kind="x.y"),
            ],
        ),
        ("reset bad_id", [*head, _rec(Reset(ConversationState([Entry(Message.user("x"))])))]),
        (
            "reset repeated",
            [*head, {"change": {"type": "reset", "state": {"entries": [entry(ids[0])] * 2}}}],
        ),
        (
            "reset held and retired",
            [
                *head,
                {
                    "change": {
                        "type": "reset",
                        "state": {"entries": [entry(ids[0])], "retired": [ids[0]]},
                    }
                },
            ],
        ),
        (
            "reset aside repeated",
            [
                *head,
                {
                    "change": {
                        "type": "reset",
                        "state": {
                            "asides": [
                                {"id": aside_ids[0], "kind": "k", "after": None, **rig},
                                {"id": aside_ids[0], "kind": "k", "after": None, **rig},
                            ]
                        },
                    }
                },
            ],
        ),
        (
            "reset aside unsaved",
            [
                *head,
                {
                    "change": {
                        "type": "reset",
                        "state": {
                            "asides": [
                                {
                                    "id": aside_ids[0],
                                    "kind": "k",
                                    "after": None,
                                    "author": {"kind": "rig"},
                                    "value": None,
                                    "saved": False,
                                }
                            ]
                        },
                    }
                },
            ],
        ),
        (
            "reset minimal state",
            [*head, {"change": {"type": "reset", "state": {"halt": "stopped"}}}],
        ),
        ("halt clear", [*head, _rec(HaltChange("kept")), _rec(HaltChange(None))]),
        # Records that do not decode at all.
        ("malformed unknown change", [*head, {"change": {"type": "move", "entries": []}}]),
        ("malformed no change", [*head, {"by": None}]),
        ("malformed entries not a list", [*head, {"change": {"type": "push", "entries": {}}}]),
        ("malformed entry id a number", [*head, push(entry(7))]),
        ("malformed role", [*head, push({"message": {"role": "tool", "content": []}, "id": None})]),
        ("malformed splice start", [*head, splice("0", 0, [])]),
        ("malformed splice bool stop", [*head, splice(0, True, [])]),
        ("malformed removed not ids", [*head, splice(0, 1, [1])]),
        ("malformed halt", [*head, {"change": {"type": "halt", "halt": "paused"}}]),
        ("malformed aside author", [*head, aside_put(aside_ids[0], author={"kind": "robot"})]),
        ("malformed aside no kind", [*head, aside_put(aside_ids[0], kind=None)]),
        ("malformed record at", [*head, {**push(entry(ids[0])), "at": "now"}]),
        ("malformed record by", [*head, {**push(entry(ids[0])), "by": "me"}]),
        ("malformed reset state", [*head, {"change": {"type": "reset", "state": []}}]),
        ("malformed record not an object", [*head, []]),
    ]
    for name, records in misfits:
        cases.append(_fold_case(name, records))
    # A record may carry fields this version does not know (a hub's `via`): they are ignored.
    extra = [dict(record, via={"sub": "s", "client": "c"}) for record in base]
    cases.append(_fold_case("unknown record fields are ignored", extra))
    return cases


# ---------------------------------------------------------------- rebase


def _rebase_case(
    name: str,
    seed: int,
    make_base: Callable[[Conversation], object],
    make_log: Callable[[Conversation], object],
    make_pending: Callable[[Conversation], object],
    *,
    no_base: bool = False,
) -> Json:
    start = _fresh(seed)
    make_base(start)
    base_records = start.take_unsaved()
    base = Conversation()
    for record in base_records:
        base.apply(record)
    onto = base.copy()
    log_side = base.copy()
    log_side._ids = _minter(seed + 1000)  # another replica mints its own ids
    make_log(log_side)
    log_records = log_side.take_unsaved()
    for record in log_records:
        onto.apply(record)
    local = base.copy()
    local._ids = _minter(seed + 2000)
    make_pending(local)
    pending = local.take_unsaved()
    conflicts = rebase(local, onto, pending, None if no_base else base)
    return {
        "name": name,
        "base": [_json(r) for r in base_records],
        "log": [_json(r) for r in log_records],
        "pending": [_json(r) for r in pending],
        "no_base": no_base,
        "expect": {
            "state": _json(local.state()),
            "revision": local.revision,
            "unsaved": [_json(r) for r in local.unsaved()],
            "conflicts": [
                {"at": next(i for i, r in enumerate(pending) if r is c.record), "reason": c.reason}
                for c in conflicts
            ],
        },
    }


def _rebase_cases() -> list[Json]:
    def three(c: Conversation) -> None:
        c.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])

    def nothing(c: Conversation) -> None:
        pass

    def push_d(c: Conversation) -> None:
        c.push(Message.assistant("d"))

    def insert_x_first(c: Conversation) -> None:
        c.splice(slice(0, 0), [Message.system("x")], None)

    def edit_b(c: Conversation) -> None:
        c.splice(slice(1, 2), [Message.assistant("B")], Author.user("me"))

    def remove_b(c: Conversation) -> None:
        c.splice(slice(1, 2), [], None)

    def cut_between_b_c(c: Conversation) -> None:
        c.splice(slice(2, 2), [Message.system("between")], None)

    def insert_after_a(c: Conversation) -> None:
        c.splice(slice(1, 1), [Message.system("after a")], None)

    def insert_first(c: Conversation) -> None:
        c.splice(slice(0, 0), [Message.system("first")], None)

    def remove_a(c: Conversation) -> None:
        c.splice(slice(0, 1), [], None)

    def halt(c: Conversation) -> None:
        c.halt("stopped")

    def clear(c: Conversation) -> None:
        c.resume()

    cases = [
        _rebase_case("push on a log that moved", 1, three, push_d, push_d),
        _rebase_case("push after an insertion", 2, three, insert_x_first, push_d),
    ]

    # A push that already landed (the same records in the log) is dropped without a conflict.
    shared = _fresh(3)
    three(shared)
    shared_base = shared.take_unsaved()
    shared.push(Message.assistant("d"))
    shared.push(Message.user("e"))
    landed = shared.take_unsaved()

    def with_base(c: Conversation) -> None:
        for record in shared_base:
            c.replay(record)

    def first_landed(c: Conversation) -> None:
        c.replay(landed[0])

    def both(c: Conversation) -> None:
        for record in landed:
            c.replay(record)

    def both_in_one(c: Conversation) -> None:
        c.replay(ChangeRecord(Push(landed[0].change.entries + landed[1].change.entries)))  # type: ignore[union-attr]

    cases += [
        _rebase_case("pushes that landed are dropped", 3, with_base, both, both),
        _rebase_case(
            "a push partly landed keeps the rest", 3, with_base, first_landed, both_in_one
        ),
        _rebase_case(
            "a pushed id retired by the log",
            3,
            with_base,
            lambda c: (c.replay(landed[0]), c.splice(slice(3, 4), [], None)),
            both,
        ),
        _rebase_case("splice re-targeted by its ids", 4, three, insert_x_first, edit_b),
        _rebase_case("splice whose entries were removed", 5, three, remove_b, edit_b),
        _rebase_case(
            "splice whose run was broken",
            6,
            three,
            cut_between_b_c,
            lambda c: c.splice(slice(1, 3), [Message.assistant("bc")], None),
        ),
        _rebase_case("pure insertion follows its entry", 7, three, insert_x_first, insert_after_a),
        _rebase_case("pure insertion at the start", 8, three, push_d, insert_first),
        _rebase_case("pure insertion whose entry is gone", 9, three, remove_a, insert_after_a),
        _rebase_case(
            "pure insertion without a base", 10, three, push_d, insert_after_a, no_base=True
        ),
        _rebase_case("splice at the same place unchanged", 11, three, nothing, edit_b),
        _rebase_case("halt replayed while the model owes", 12, three, insert_x_first, halt),
        _rebase_case("halt after an answer is a conflict", 13, three, push_d, halt),
        _rebase_case(
            "clear with nothing to clear is dropped",
            14,
            lambda c: (three(c), c.halt("kept")),
            clear,
            clear,
        ),
        _rebase_case(
            "clear replayed while halted",
            15,
            lambda c: (three(c), c.halt("kept")),
            insert_x_first,
            clear,
        ),
        _rebase_case(
            "reset replayed",
            16,
            three,
            push_d,
            lambda c: c.reset(
                ConversationState([Entry(Message.user("only"), c._ids.message_id())]), None
            ),
        ),
    ]

    def add_note(c: Conversation) -> None:
        c.add_aside(Aside.note("t", "n", c.id(0)))

    noted = _fresh(17)
    three(noted)
    note_id = noted.add_aside(Aside.note("t", "n", noted.id(0)))
    noted_base = noted.take_unsaved()

    def with_note(c: Conversation) -> None:
        for record in noted_base:
            c.replay(record)

    def drop_note(c: Conversation) -> None:
        c.remove_aside(note_id)

    def edit_note(c: Conversation) -> None:
        c.replace_aside(note_id, Aside.note("t", "edited", None))

    cases += [
        _rebase_case("aside put replayed", 17, three, push_d, add_note),
        _rebase_case("removal of a gone aside is dropped", 18, with_note, drop_note, drop_note),
        _rebase_case("removal replayed while the aside is there", 19, with_note, push_d, drop_note),
        _rebase_case("aside edit replayed over a removal", 20, with_note, drop_note, edit_note),
    ]

    # A replayed splice whose new entry's id the log now holds (another replica pushed it).
    clash = _fresh(21)
    three(clash)
    clash_base = clash.take_unsaved()
    clash.splice(slice(1, 2), [Message.assistant("B"), Message.user("mid")], None)
    spliced = clash.take_unsaved()
    new_id = spliced[0].change.entries[1].id  # type: ignore[union-attr]

    def clash_base_(c: Conversation) -> None:
        for record in clash_base:
            c.replay(record)

    def log_pushes_it(c: Conversation) -> None:
        c.push(Entry(Message.user("mid"), new_id))

    def pending_splice(c: Conversation) -> None:
        c.replay(spliced[0])

    cases.append(
        _rebase_case("a replay that no longer fits", 21, clash_base_, log_pushes_it, pending_splice)
    )

    def several(c: Conversation) -> None:
        c.push(Message.assistant("d"))
        c.splice(slice(3, 4), [Message.assistant("D")], None)  # edits its own pending push
        c.splice(slice(0, 0), [Message.system("top")], None)
        c.halt("kept")  # nothing owed: not recorded
        c.push(Message.user("e"))
        c.halt("kept")

    cases.append(_rebase_case("a run of pending records", 22, three, insert_x_first, several))
    cases.append(
        _rebase_case(
            "a run of pending records on a log that answered",
            23,
            three,
            lambda c: c.push(Message.user("log")),
            several,
        )
    )

    # Concurrent edits of one entry or note (SPEC 16): merged, or a conflict `edited`.
    def fox(c: Conversation) -> None:
        c.extend([Message.user(FOX), Message.assistant("ok")])

    def word(old: str, new: str, at: int = 0) -> Callable[[Conversation], object]:
        def edit(c: Conversation) -> None:
            c.edit_each(
                Author.user(),
                lambda ref: Message.user(FOX.replace(old, new)) if ref.index == at else None,
            )

        return edit

    def replaced(old: str, new: str) -> Callable[[Conversation], object]:
        def edit(c: Conversation) -> None:  # a new entry (new id) in the old one's place
            c.splice(slice(0, 1), [Message.user(FOX.replace(old, new))], Author.user("b"))

        return edit

    def summarised(c: Conversation) -> None:
        c.splice(slice(0, 2), [Message.user("summary")], Author.plugin("compact"))

    fox_noted = _fresh(40)
    fox(fox_noted)
    fox_note = fox_noted.add_aside(Aside.note("plan", FOX, None))
    fox_note_base = fox_noted.take_unsaved()

    def with_fox_note(c: Conversation) -> None:
        for record in fox_note_base:
            c.replay(record)

    def note_word(old: str, new: str) -> Callable[[Conversation], object]:
        def edit(c: Conversation) -> None:
            c.replace_aside(fox_note, Aside.note("plan", FOX.replace(old, new), None))

        return edit

    cases += [
        _rebase_case(
            "edits of one entry merge", 41, fox, word("brown", "RED"), word("lazy", "SLEEPY")
        ),
        _rebase_case(
            "edits of one word conflict", 42, fox, word("brown", "RED"), word("brown", "BLUE")
        ),
        _rebase_case("the same edit twice", 43, fox, word("brown", "RED"), word("brown", "RED")),
        _rebase_case(
            "an entry replaced one to one merges",
            44,
            fox,
            word("brown", "RED"),
            replaced("lazy", "SLEEPY"),
        ),
        _rebase_case("a splice over an edited entry", 45, fox, word("brown", "RED"), summarised),
        _rebase_case("a removal of an edited entry", 46, fox, word("brown", "RED"), remove_a),
        _rebase_case("an edit on unchanged content", 47, fox, push_d, word("lazy", "SLEEPY")),
        _rebase_case(
            "an edit without a base",
            48,
            fox,
            word("brown", "RED"),
            word("lazy", "SLEEPY"),
            no_base=True,
        ),
        _rebase_case(
            "edits of one note merge",
            49,
            with_fox_note,
            note_word("brown", "RED"),
            note_word("lazy", "SLEEPY"),
        ),
        _rebase_case(
            "edits of one note conflict",
            50,
            with_fox_note,
            note_word("brown", "RED"),
            note_word("brown", "BLUE"),
        ),
        _rebase_case(
            "a note put again on both sides",
            51,
            fox,
            lambda c: c.replay(ChangeRecord(AsideChange(_AGAIN, Aside.note("plan", "log", None)))),
            lambda c: c.replay(ChangeRecord(AsideChange(_AGAIN, Aside.note("plan", "ours", None)))),
        ),
        *_approval_rebase_cases(),
    ]
    return cases


def _asked_turn(c: Conversation) -> None:
    """A request, an open turn, a call, and an open approval about it (SPEC 12)."""
    c.push(Message.user("clean up"))
    c.open_turn()
    c.push(Assistant([Text("may I?"), ToolCall("c1", "delete", {})]))
    approvals.ask(c, key="c1", call="c1", asked_by="worker", asked_client="w")


def _decided(approve: bool, by: str) -> Callable[[Conversation], object]:
    def decide(c: Conversation) -> None:
        (id_,) = [id_ for id_, a in approvals.approvals(c)]
        approvals.decide(c, id_, approve=approve, decided_by=by, at=1_700_000_000_000)

    return decide


def _approval_rebase_cases() -> list[Json]:
    """A decision replayed on a log that decided the approval meanwhile is a
    `Conflict(decided)`, whatever the two said; on an untouched one it replays."""

    def nothing(c: Conversation) -> None:
        pass

    return [
        _rebase_case(
            "a denial over an approval decided meanwhile",
            61,
            _asked_turn,
            _decided(True, "alice"),
            _decided(False, "bob"),
        ),
        _rebase_case(
            "the same decision made twice",
            62,
            _asked_turn,
            _decided(True, "alice"),
            _decided(True, "bob"),
        ),
        _rebase_case(
            "a decision on an open approval", 63, _asked_turn, nothing, _decided(True, "bob")
        ),
    ]


def _approval_cases() -> Json:
    """The JSON Schema subset an answer is checked with, for both replicas (SPEC 12)."""
    schemas: list[Json] = [
        {"type": "string", "minLength": 2, "maxLength": 3},
        {"type": "integer", "minimum": 1, "exclusiveMaximum": 10},
        {"type": ["number", "null"]},
        {"enum": [1, "a", None, True]},
        {"const": {"a": [1, 2]}},
        {
            "type": "object",
            "properties": {"n": {"type": "boolean"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        True,
        False,
    ]
    values: list[Json] = [
        "é",
        "ab",
        "😀😀",
        "abcd",
        1,
        1.0,
        2.5,
        10,
        True,
        None,
        {"a": [1, 2]},
        {"a": [1.0, 2]},
        {"n": True},
        {"n": 1},
        {"n": False, "x": 1},
        [],
        ["a"],
        ["a", 1],
    ]
    answers = [
        {"schema": schema, "value": value, "problem": approvals.answer_problem(schema, value)}
        for schema in schemas
        for value in values
    ]
    bad: list[Json] = [
        {"pattern": "^a"},
        {"type": "date"},
        {"minLength": -1},
        {"properties": {"a": {"$ref": "#"}}},
        {"enum": []},
        {"title": "annotations pass", "description": "x", "type": "string"},
        "string",
    ]
    return {
        "answers": answers,
        "schemas": [{"schema": b_, "problem": approvals.schema_problem(b_)} for b_ in bad],
        "kind": approvals.APPROVAL_KIND,
    }


def _codes() -> Json | None:
    """The error-code table (SPEC 5) and how closes map to codes, once `sync.errors` has it."""
    table = getattr(errors, "CODES", None)
    if table is None:
        return None
    closes = [(4000, ""), (4001, ""), (1008, ""), (1008, "bad_client"), (1011, "unavailable")]
    closes += [(1006, ""), (4999, "whatever"), (1000, ""), (1009, "over size limit")]
    closes += [(4410, "")]  # a conversation deleted (SPEC 15): a bare close still means it
    return {
        "codes": {code: {"close": info.close, "retry": info.retry} for code, info in table.items()},
        "unknown_retry": errors.retry_of("some_newer_code"),  # type: ignore[attr-defined]
        "closes": [
            {"close": close, "reason": reason, "code": errors.code_of_close(close, reason)}  # type: ignore[attr-defined]
            for close, reason in closes
        ],
    }


# ---------------------------------------------------------------- the replica session


def _event(event: object) -> Json:
    """A session event as the JS session spells it (a conflict without its free-text detail)."""
    if isinstance(event, Conflict):
        return {"type": "conflict", "reason": event.reason, "record": _json(event.record)}
    fields = msgspec.structs.asdict(event)  # type: ignore[call-overload]
    return {"type": type(event).__name__.lower(), **fields}


def observe(session: ReplicaSession, step: Json) -> Json:
    """Play one step's input on `session`; return what came out (frames, events or an error)."""
    op = step["op"]
    try:
        if op == "hello":  # defaulted fields left out (the wire may omit them)
            hello = _json(session.hello(step.get("token")))
            return {key: value for key, value in hello.items() if value not in (None, [])}
        if op == "edit":
            for record in step["records"]:
                session.local.replay(decode_record(json.dumps(record)))
            return None
        if op == "receive":
            message = decode_hub_message(json.dumps(step["message"]))
            return [_event(event) for event in session.receive(message)]
        if op == "next_push":
            frame, conflicts = session.next_push()
            return {
                "frame": None if frame is None else json.loads(frame),
                "conflicts": [_event(c) for c in conflicts],
            }
        if op == "disconnected":
            return [_event(event) for event in session.disconnected(step["reason"])]
    except ProtocolError as exc:
        return {"error": exc.reason}
    raise ValueError(f"unknown step {op}")


def final_of(session: ReplicaSession) -> Json:
    """What a session holds at the end of a script."""
    return {
        "local": _json(session.local.state()),
        "local_revision": session.local.revision,
        "unsaved": [_json(r) for r in session.local.unsaved()],
        "confirmed": _json(session.confirmed.state()),
        "confirmed_revision": session.confirmed.revision,
        "lineage": session.confirmed.lineage,
        "pending": session.pending,
        "seq": session.seq,
        "ready": session.ready,
        "settled": session.settled,
    }


def new_session(options: Json) -> ReplicaSession:
    return ReplicaSession(
        options["client"],
        max_frame=options.get("max_frame", 1 << 20),
        max_batch=options.get("max_batch", 1000),
    )


class _Script:
    """Drives a real `ReplicaSession` and writes down each step with what came out."""

    def __init__(self, name: str, seed: int, **options: Any) -> None:
        self.name = name
        self.options = {"client": "ui", **options}
        self.session = new_session(self.options)
        self.session.local._ids = _minter(seed)
        self.log = _fresh(seed + 500)  # the other replicas' edits, as the log's records
        self.sent = 0  # the log's records already delivered
        self.steps: list[Json] = []

    def _step(self, step: Json) -> Json:
        step["expect"] = observe(self.session, step)
        self.steps.append(step)
        return step["expect"]

    def hello(self, token: str | None = None) -> Json:
        return self._step({"op": "hello", "token": token})

    def receive(self, message: Json) -> Json:
        return self._step({"op": "receive", "message": message})

    def welcome(self, acked: int = 0, revision: int | None = None, lineage: int = 77) -> Json:
        revision = len(self.log.unsaved()) if revision is None else revision
        message = {"type": "welcome", "lineage": lineage, "revision": revision, "acked": acked}
        return self.receive(message)

    def records(self, origin: Json = None) -> Json:
        """Deliver the log's records not delivered yet."""
        records = [_json(r) for r in self.log.unsaved()[self.sent :]]
        message = {"type": "records", "from": self.sent, "records": records, "origin": origin}
        self.sent += len(records)
        return self.receive(message)

    def edit(self, make: Callable[[Conversation], object]) -> None:
        local = self.session.local
        before = len(local.unsaved())
        # The JS side replays these records (unmeasured), so they are made unmeasured too: a
        # record too large to push then pins the refusal at send time.
        limit, local.record_limit = local.record_limit, None
        try:
            make(local)
        finally:
            local.record_limit = limit
        records = [_json(r) for r in local.unsaved()[before:]]
        self.steps.append({"op": "edit", "records": records, "expect": None})

    def next_push(self) -> Json:
        return self._step({"op": "next_push"})

    def disconnected(self, reason: str = "network") -> Json:
        return self._step({"op": "disconnected", "reason": reason})

    def case(self) -> Json:
        return {
            "name": self.name,
            "options": self.options,
            "steps": self.steps,
            "final": final_of(self.session),
        }


def _session_cases() -> list[Json]:
    cases = []

    s = _Script("catch-up by records, then live records", 30)
    s.log.extend([Message.user("q"), Message.assistant("a")])
    s.log.push(Message.user("more"))
    s.hello("tok")
    s.welcome()
    s.records()
    s.log.push(Message.assistant("live"))
    s.records(origin={"client": "w", "seq": 4})
    cases.append(s.case())

    s = _Script("catch-up by a chunked state, then push and ack", 31)
    s.log.extend([Message.user(f"m{n}") for n in range(5)])
    s.log.add_aside(Aside.note("t", "x", s.log.id(1)))
    state = _json(s.log.state())
    s.hello()
    s.welcome(revision=9)
    first = dict(state, entries=state["entries"][:2])
    s.receive({"type": "state", "lineage": 77, "revision": 9, "state": first, "more": True})
    s.receive({"type": "entries", "entries": state["entries"][2:4], "more": True})
    s.receive({"type": "entries", "entries": state["entries"][4:], "more": False})
    s.edit(lambda c: c.push(Message.assistant("answer")))
    s.next_push()
    s.edit(lambda c: c.push(Message.user("next")))
    s.next_push()  # one batch in flight: nothing
    s.receive({"type": "ack", "seq": 1, "from": 9, "revision": 10})
    s.receive({"type": "ack", "seq": 1, "from": 9, "revision": 10})  # a duplicate: ignored
    s.next_push()
    s.receive({"type": "ack", "seq": 2, "from": 10, "revision": 11})
    cases.append(s.case())

    s = _Script(
        "batches split by count and size; a record too large is refused",
        32,
        max_batch=3,
        max_frame=1500,
    )
    s.hello()
    s.welcome()
    s.edit(lambda c: [c.push(Message.user(f"small {n}")) for n in range(4)])
    s.next_push()  # three records: the batch limit
    s.receive({"type": "ack", "seq": 1, "from": 0, "revision": 3})
    s.edit(lambda c: [c.push(Message.user("z" * 400)) for _ in range(3)])
    s.next_push()  # cut by the frame limit
    s.receive({"type": "ack", "seq": 2, "from": 3, "revision": 5})
    s.next_push()
    s.receive({"type": "ack", "seq": 3, "from": 5, "revision": 7})
    s.edit(lambda c: c.push(Message.user("x" * 2000)))
    s.edit(lambda c: c.push(Message.user("y" * 500)))
    s.next_push()  # the large one refused, the next one sent
    cases.append(s.case())

    s = _Script("resend: a landed batch (acked) is not sent again", 33)
    s.hello()
    s.welcome()
    s.edit(lambda c: c.push(Message.user("q")))
    push = s.next_push()
    s.edit(lambda c: c.splice(slice(0, 1), [Message.user("edited")], None))
    s.disconnected()
    s.hello()
    s.log.replay(decode_record(json.dumps(push["frame"]["records"][0])))
    s.welcome(acked=1)
    s.records()
    s.next_push()
    s.disconnected()
    s.hello()
    s.welcome(acked=1)  # the splice (seq 2) never reached the hub
    s.next_push()
    cases.append(s.case())

    s = _Script("one disconnected per lost connection, none per failed attempt", 41)
    s.hello()
    s.disconnected("refused at the handshake")  # never welcomed: no change of state
    s.hello()
    s.welcome()
    s.edit(lambda c: c.push(Message.user("q")))
    s.next_push()
    s.disconnected("keepalive timed out")  # the one event
    for _ in range(3):
        s.hello()
        s.disconnected("the hub is refusing connections for now (HTTP 503)")
    s.hello()
    s.welcome()
    s.next_push()
    cases.append(s.case())

    s = _Script("records while in flight: rebased, the reject ignored, sent again", 34)
    s.log.push(Message.user("q"))
    s.hello()
    s.welcome()
    s.records()
    s.edit(lambda c: c.push(Message.assistant("mine")))
    s.next_push()
    s.log.push(Message.assistant("theirs"))
    s.records(origin={"client": "w", "seq": 1})
    reject = {"type": "reject", "seq": 1, "reason": "behind", "detail": "", "lineage": 77}
    s.receive(reject | {"revision": 2})
    s.next_push()
    cases.append(s.case())

    s = _Script("reject behind before the records: sent again after them", 35)
    s.hello()
    s.welcome()
    s.edit(lambda c: c.push(Message.user("q")))
    s.next_push()
    s.receive(reject | {"revision": 0})
    s.next_push()
    cases.append(s.case())

    s = _Script("reject invalid: conflicts, and edits on top rebased", 36)
    s.log.push(Message.user("q"))
    s.hello()
    s.welcome()
    s.records()
    s.edit(lambda c: c.push(Message.assistant("bad")))
    s.next_push()
    s.edit(lambda c: c.push(Message.user("later")))
    s.receive(reject | {"reason": "invalid", "detail": "orphan", "revision": 1})
    s.next_push()
    cases.append(s.case())

    s = _Script("pending splices rebased on records; an insertion whose entry went conflicts", 37)
    s.log.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])
    s.hello()
    s.welcome()
    s.records()
    s.edit(lambda c: c.splice(slice(1, 2), [Message.assistant("B")], None))
    s.edit(lambda c: c.splice(slice(3, 3), [Message.user("d")], None))
    s.log.splice(slice(0, 0), [Message.system("top")], None)
    s.records()
    s.log.splice(slice(3, 4), [], None)
    s.records()
    s.next_push()
    cases.append(s.case())

    s = _Script("a state while edits are pending (a rewrite) rebases them", 38)
    s.hello()
    s.welcome()
    s.edit(lambda c: c.push(Message.user("mine")))
    s.next_push()
    s.log.push(Message.user("rewritten"))
    s.receive({"type": "state", "lineage": 99, "revision": 1, "state": _json(s.log.state())})
    s.receive(reject | {"reason": "lineage", "lineage": 99, "revision": 1})
    s.next_push()
    cases.append(s.case())

    s = _Script("protocol errors: a gap, a second welcome, records that do not fit", 39)
    s.log.push(Message.user("q"))
    s.hello()
    s.welcome()
    s.records()
    s.receive({"type": "records", "from": 5, "records": [], "origin": None})
    s.welcome()
    s.receive({"type": "records", "from": 0, "records": [_json(s.log.unsaved()[0])] * 2})
    cases.append(s.case())

    s = _Script("a new process on a client id continues after the hub's seq", 40)
    s.edit(lambda c: c.push(Message.user("before connecting")))
    s.hello()
    s.welcome(acked=41)
    s.next_push()
    cases.append(s.case())

    s = _Script("reject pinned: a compaction that lost to a pin conflicts, nothing moves", 42)
    s.log.extend([Message.user("a"), Message.assistant("b"), Message.user("c")])
    s.hello()
    s.welcome()
    s.records()
    s.edit(lambda c: compact.compact(c, keep=1, summary=Message.user("a, b")))
    s.next_push()
    compact.pin(s.log, s.log.entry(1).id)  # type: ignore[arg-type]
    s.records()
    s.receive(reject | {"reason": "pinned", "detail": "pinned", "revision": 2})
    s.next_push()
    cases.append(s.case())
    return cases


# ---------------------------------------------------------------- merge

_AGAIN = "aside_01a233b7f00c703895e666ff100aa8d8"  # an aside id both sides put

FOX = "The quick brown fox jumps over the lazy dog."


def _merge_cases() -> Json:
    diffs = [
        ("", ""),
        ("", "abc"),
        ("abc", ""),
        ("abcabba", "cbabac"),  # Myers' own example: pins the tie-break
        ("aaa", "aa"),
        ("ab", "ba"),
        (FOX, FOX.replace("brown", "RED")),
        ("a\U0001f98ab", "a\U0001f600b"),  # astral: one code point each
        ("e\u0301te\u0301", "ete\u0301"),  # a combining mark is its own code point
        ("שלום עולם", "שלום לכם עולם"),  # RTL
        ("x" * 40 + "y" * 40, "y" * 40 + "x" * 40),
        ("<a><b>", "<a><c><b>"),  # an insertion slid to its leftmost place
        ("<r0.302><r0.181>", "<r0.302><r0.353><r0.181>"),
        ("aaab", "ab"),  # a deletion slid likewise
    ]
    texts = [
        ("the issue's case", FOX, FOX.replace("brown", "RED"), FOX.replace("lazy", "SLEEPY")),
        ("both change one word", FOX, FOX.replace("brown", "RED"), FOX.replace("brown", "BLUE")),
        ("the same edit twice", FOX, FOX.replace("brown", "RED"), FOX.replace("brown", "RED")),
        ("one side unchanged", FOX, FOX, FOX.replace("lazy", "SLEEPY")),
        ("insertions at one point", "ab", "aXb", "aYb"),
        ("identical insertions", "ab", "aXb", "aXb"),
        ("ranges that only meet", "ab", "xb", "ay"),
        ("insertion at a replaced range's end", "abc", "aXc", "abYc"),
        ("deletions apart", "abcdef", "bcdef", "abcde"),
        ("deletions that overlap differently", "abcdef", "adef", "abef"),
        (
            "astral characters",
            "a\U0001f98a b \U0001f600c",
            "A\U0001f98a b \U0001f600c",
            "a\U0001f98a b \U0001f600C",
        ),
        ("astral conflict", "\U0001f98a", "\U0001f600", "\U0001f525"),
        ("combining marks", "cafe\u0301 noir", "cafe\u0301 NOIR", "CAFE\u0301 noir"),
        ("a combining mark added and a word changed", "cafe noir", "cafe\u0301 noir", "cafe rouge"),
        ("RTL", "שלום עולם יפה", "שלום עולם יפה מאוד", "היי עולם יפה"),
        ("RTL conflict", "שלום עולם", "שלום לכם", "שלום להם"),
        ("mixed direction", "hello עולם world", "HELLO עולם world", "hello עולם WORLD"),
        ("empty base", "", "abc", "xyz"),
        ("everything deleted on one side", "abc", "", "abC"),
        (
            "insertions at one point, found apart by each side's prefix",
            "<r0.302><r0.181>",
            "<r0.302><r0.353><r0.181>",
            "<r0.302><r1.205><r1.196><r0.181><r1.274>",
        ),
        ("insertions at two points between repeats", "<a><a>", "<a><b><a>", "<a><a><c>"),
    ]

    def call(arguments: dict[str, Any]) -> Any:
        return Assistant([Text("calling"), ToolCall("c1", "search", arguments)])

    image = [Text("look"), Image("image/png", url="a.png")]
    messages = [
        (
            "system text",
            Message.system("one two"),
            Message.system("ONE two"),
            Message.system("one TWO"),
        ),
        (
            "user text",
            Message.user(FOX),
            Message.user(FOX.replace("brown", "RED")),
            Message.user(FOX.replace("lazy", "SLEEPY")),
        ),
        (
            "tool call arguments",
            call({"query": "red fox", "limit": 10}),
            call({"query": "red fox jumps", "limit": 10}),
            call({"query": "red fox", "limit": 20}),
        ),
        (
            "tool call arguments that clash",
            call({"query": "red fox"}),
            call({"query": "red fox jumps"}),
            call({"query": "red cat"}),
        ),
        (
            "arguments merged into bad JSON",
            call({"a": "x"}),
            call({"a": "x", "b": 1}),
            call({"a": "x", "c": 2}),
        ),
        (
            "other parts unchanged on one side",
            User(image),
            User([Text("look here"), image[1]]),
            User([image[0], Image("image/png", url="b.png")]),
        ),
        (
            "other parts changed on both sides",
            User(image),
            User([image[0], Image("image/png", url="c.png")]),
            User([image[0], Image("image/png", url="b.png")]),
        ),
        (
            "another part count",
            User(image),
            User([*image, Text("more")]),
            User([Text("LOOK"), image[1]]),
        ),
        (
            "another part count, other side unchanged",
            User(image),
            User([*image, Text("more")]),
            User(image),
        ),
        ("another role", Message.user("a"), Message.assistant("a"), Message.user("b")),
        (
            "stop unchanged on one side",
            Message.assistant("one two"),
            Message.assistant("ONE two", stop=Stop("stop")),
            Message.assistant("one TWO"),
        ),
    ]
    return {
        "diffs": [
            {"base": base, "other": other, "hunks": [list(h) for h in diff(base, other)]}
            for base, other in diffs
        ],
        "texts": [
            {
                "name": name,
                "base": base,
                "ours": ours,
                "theirs": theirs,
                "merged": merge_text(base, ours, theirs),
            }
            for name, base, ours, theirs in texts
        ],
        "messages": [
            {
                "name": name,
                "base": _json(base),
                "ours": _json(ours),
                "theirs": _json(theirs),
                "merged": None if (m := merge_message(base, ours, theirs)) is None else _json(m),
            }
            for name, base, ours, theirs in messages
        ],
    }


# ---------------------------------------------------------------- steering (SPEC 10)


def _steer_cases() -> Json:
    """The queued rule (a push refused `queued` replayed as `rig.queued` asides), mid-step,
    and the reject table, for both replicas."""
    call = Assistant([Text("looking"), ToolCall("c1", "search", {"q": "x"})])
    result = Message.tool_result("c1", "search", "found")

    def log_of(build: Callable[[Conversation], object], seed: int) -> Conversation:
        conversation = _fresh(seed)
        build(conversation)
        return conversation

    queue: list[Json] = []

    def queue_case(name: str, build: Callable[[Conversation], object], seed: int) -> None:
        made = log_of(build, seed)
        records = made.unsaved()
        after = "msg_0190b0a000007000800000000000000a"
        replayed = steer.queue_records(records, after)
        queue.append(
            {
                "name": name,
                "records": [_json(r) for r in records],
                "after": after,
                "expect": None if replayed is None else [_json(r) for r in replayed],
            }
        )

    queue_case("one user message", lambda c: c.push(Message.user("also y")), 101)
    queue_case(
        "two messages in order, one by a plugin",
        lambda c: (
            c.push(Message.user("a")),
            c.push(Entry(Message.user("b"), author=Author.plugin("hints"))),
        ),
        102,
    )
    queue_case(
        "a stop request typed with a message: the request stays",
        lambda c: (
            c.add_aside(Aside(steer.STOP_KIND, None, Author.user(), steer.step_value(None, 5))),
            c.push(Message.user("next")),
        ),
        103,
    )
    queue_case("a tool result is never queued", lambda c: c.push(result), 104)
    queue_case(
        "a message typed after a stop: queued, its STOPPED note dropped (the landing puts one)",
        lambda c: (
            c.push(Message.user("x")),
            c.take_unsaved(),
            c.halt("stopped"),
            c.take_unsaved(),
            c.push(Message.user("next")),
        ),
        107,
    )
    queue_case(
        "an answer after a stop carries the STOPPED note, never queued",
        lambda c: (
            c.push(Message.user("x")),
            c.take_unsaved(),
            c.halt("stopped"),
            c.take_unsaved(),
            c.push(Message.assistant("partial")),
        ),
        106,
    )
    queue_case(
        "a halt is never queued",
        lambda c: (c.push(Message.user("x")), c.take_unsaved(), c.halt("kept")),
        105,
    )

    mid: list[Json] = []

    def mid_case(name: str, build: Callable[[Conversation], object], seed: int) -> None:
        made = log_of(build, seed)
        mid.append(
            {
                "name": name,
                "records": [_json(r) for r in made.unsaved()],
                "mid_step": steer.mid_step(made),
            }
        )

    mid_case("a request alone", lambda c: c.push(Message.user("a")), 111)
    mid_case("a call nothing answers", lambda c: c.extend([Message.user("a"), call]), 112)
    mid_case("its result answers it", lambda c: c.extend([Message.user("a"), call, result]), 113)
    mid_case(
        "a step marker stands",
        lambda c: (
            c.push(Message.user("a")),
            c.add_aside(Aside(steer.STEP_KIND, None, Author.rig(), steer.step_value(0, 5))),
        ),
        114,
    )
    mid_case(
        "a failed reply after a call owes nothing",
        lambda c: c.extend([Message.user("a"), call, Message.assistant("x", Stop("error"))]),
        115,
    )
    mid_case(
        "a failed reply's own call owes nothing",
        lambda c: c.extend(
            [Message.user("a"), Assistant([ToolCall("c2", "search")], Stop("error"))]
        ),
        116,
    )
    return {
        "queue": queue,
        "mid_step": mid,
        "rejects": dict(errors.REJECTS),
        "unknown_reject": errors.reject_rule("some_newer_reason"),
    }


def build() -> dict[str, str]:
    """The vector files by name, as text."""
    files = {
        "ids.json": _ids(),
        "fold.json": {"cases": _fold_cases()},
        "rebase.json": {"cases": _rebase_cases()},
        "session.json": {"cases": _session_cases()},
        "merge.json": _merge_cases(),
        "steer.json": _steer_cases(),
        "approvals.json": _approval_cases(),
    }
    codes = _codes()
    if codes is not None:
        files["codes.json"] = codes
    return {
        name: json.dumps(value, indent=1, ensure_ascii=False) + "\n"
        for name, value in files.items()
    }


def main() -> None:
    VECTORS.mkdir(exist_ok=True)
    for name, text in build().items():
        (VECTORS / name).write_text(text, encoding="utf-8")
        print(f"wrote {VECTORS / name} ({len(text.encode())} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()

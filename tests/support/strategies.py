"""Shared Hypothesis strategies: random edits of every kind on a `Conversation`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from sync import (
    Aside,
    Assistant,
    Author,
    Conversation,
    Entry,
    Halt,
    Message,
    Stop,
    System,
    Text,
    ToolCall,
    TurnEnd,
    User,
)
from sync.entries import is_stopped_note

MESSAGES = [
    Message.user("hi"),
    Message.user("again"),
    Message.assistant("hello"),
    Message.assistant("cut", stop=Stop("aborted")),
    Assistant([ToolCall("c1", "f", {"a": 1})], stop=Stop("tool_use")),
    Assistant([ToolCall("c1", "f", {}), ToolCall("c2", "g", {})]),
    Message.tool_result("c1", "f", "one"),
    Message.tool_result("c2", "g", "two", is_error=True),
    System("be brief"),
]
AUTHORS = [None, Author.user(), Author.plugin("p"), Author.agent("sub"), Author.rig()]

messages = st.sampled_from(MESSAGES)
authors = st.sampled_from(AUTHORS)
small = st.integers(min_value=0, max_value=12)

operations = st.one_of(
    st.tuples(st.just("push"), messages, authors),
    st.tuples(st.just("extend"), st.lists(messages, max_size=4)),
    st.tuples(st.just("splice"), small, small, st.lists(st.tuples(small, messages), max_size=4)),
    st.tuples(st.just("restore"), small, small, st.lists(small, max_size=3)),
    st.tuples(st.just("set_entries"), st.lists(small, max_size=6), messages),
    st.tuples(st.just("edit_each"), st.sets(small, max_size=3), messages),
    st.tuples(st.just("normalize")),
    st.tuples(st.just("halt"), st.sampled_from(list(Halt))),
    st.tuples(st.just("resume")),
    st.tuples(st.just("add_aside"), st.booleans(), small),
    st.tuples(st.just("replace_aside"), small, st.booleans()),
    st.tuples(st.just("remove_aside"), small),
    st.tuples(st.just("open_turn")),
    st.tuples(st.just("end_turn"), st.sampled_from(["answered", "failed", "stopped"])),
    st.tuples(st.just("reset"), st.lists(messages, max_size=3)),
    st.tuples(st.just("dated"), st.integers(min_value=1, max_value=2**44), messages),
)


@dataclass
class Run:
    """A conversation under random edits, with what the test saw along the way."""

    conversation: Conversation = field(default_factory=Conversation)
    seen: dict[str, Entry] = field(default_factory=dict)
    minted: list[str] = field(default_factory=list)

    def note_entries(self) -> None:
        for ref in self.conversation.entries():
            if ref.id not in self.seen:
                self.minted.append(ref.id)
            self.seen[ref.id] = ref.entry

    def made_since(self, before: int) -> list[str]:
        """The ids minted since `len(minted)` was `before` that name the replica's own
        entries: not a STOPPED note, which a push puts before the user's text for the rig
        (`Conversation.push`), and which a push refused `queued` drops, the hub putting its
        own when the queue lands (SPEC 10; `run.py` chaos `vanished`, issue 29)."""
        seen = self.seen
        return [
            id_
            for id_ in self.minted[before:]
            if not is_stopped_note(seen[id_].message, seen[id_].author)
        ]

    def aside_ids(self) -> list[str]:
        """The asides a person's note ops pick from: notes and the like, not the hub's
        steering asides (`rig.*`: a queued message, a step marker, a stop request), which no
        person replaces with a note, and whose withdrawal (a queued message taken back by its
        sender, on purpose) the steering tests pin on their own."""
        return [
            id_ for id_, aside in self.conversation.asides() if not aside.kind.startswith("rig.")
        ]

    def do(self, op: tuple[Any, ...]) -> None:
        c = self.conversation
        n = len(c)
        match op:
            case ("push", message, author):
                c.push(Entry(message, author=author))
            case ("extend", items):
                c.extend(items)
            case ("splice", start, stop, picks):
                entries = [
                    c.entry(at) or Entry(message) if at % 3 else Entry(message)
                    for at, message in picks
                ]
                c.splice(slice(start, stop), entries, Author.plugin("s"))
            case ("restore", start, stop, picks):
                pool = [self.seen[id_] for id_ in sorted(self.seen)]
                entries = [pool[at % len(pool)] for at in picks] if pool else []
                c.restore(slice(start, stop), entries, Author.plugin("undo"))
            case ("set_entries", order, message):
                current = [ref.entry for ref in c.entries()]
                wanted = [current[at] for at in order if at < n] + [Entry(message)]
                c.set_entries(wanted, Author.user())
            case ("edit_each", indexes, message):
                c.edit_each(
                    Author.plugin("e"), lambda ref: message if ref.index in indexes else None
                )
            case ("normalize",):
                c.normalize(Author.rig())
                c.validate()
            case ("halt", halt):
                c.halt(halt)
            case ("resume",):
                c.resume()
            case ("add_aside", saved, at):
                after = c.id(at) if at < n else None
                c.add_aside(Aside("note", after, Author.user(), {"at": at}, saved=saved))
            case ("replace_aside", pick, saved):
                ids = self.aside_ids()
                if ids:
                    id_ = ids[pick % len(ids)]
                    c.replace_aside(id_, Aside("note", None, Author.user(), [pick], saved=saved))
            case ("remove_aside", pick):
                ids = self.aside_ids()
                if ids:
                    c.remove_aside(ids[pick % len(ids)])
            case ("open_turn",):
                c.open_turn()
            case ("end_turn", how):
                ends = {
                    "answered": TurnEnd.answered(c.id(n - 1)),
                    "failed": TurnEnd.failed("boom"),
                    "stopped": TurnEnd.stopped(),
                }
                c.end_turn(ends[how])
            case ("reset", items):
                c.reset(Conversation.from_messages(items))
            case ("dated", at, message):
                with c.dated(at):
                    c.push(message)
            case ("insert_token", token, pick, at):
                # Insert `token` into the first text of one of the first texted entries:
                # concurrent edits of the same entries, to be merged (SPEC 16).
                texted = [ref.index for ref in c.entries() if _text_of(ref.message) is not None]
                if texted:
                    where = texted[pick % min(3, len(texted))]
                    c.edit_each(
                        Author.user(),
                        lambda ref: (
                            _with_token(ref.message, token, at) if ref.index == where else None
                        ),
                    )
            case ("note_token", token, pick, at):
                # The same for a note's text: one shared note, edited by every replica.
                notes = [
                    id_
                    for id_, aside in c.asides()
                    if aside.saved and isinstance(aside.value, dict) and "text" in aside.value
                ]
                if not notes:
                    c.add_aside(Aside.note("shared", token, None))
                else:
                    id_ = notes[pick % len(notes)]
                    aside = c.aside(id_)
                    assert aside is not None
                    text = insert_token(aside.value["text"], token, at)
                    c.replace_aside(id_, Aside.note("shared", text, None))
        self.note_entries()


def _text_of(message: Any) -> str | None:
    """The first text of a message (a system message's, or its first `Text` part's)."""
    if isinstance(message, System):
        return message.content
    for part in getattr(message, "content", []):
        if isinstance(part, Text):
            return part.text
    return None


def insert_token(text: str, token: str, at: int) -> str:
    """`text` with `token` inserted at `at` (modulo its length), moved past any `<...>` it
    would cut in two (a token must stay whole for a checker to find it)."""
    at %= len(text) + 1
    opened = text.rfind("<", 0, at)
    if opened > text.rfind(">", 0, at):
        at = text.index(">", opened) + 1
    return text[:at] + token + text[at:]


def _with_token(message: Any, token: str, at: int) -> Any:
    """`message` with `token` inserted into its first text at `at` (see `insert_token`)."""
    if isinstance(message, System):
        return System(insert_token(message.content, token, at))
    parts = list(message.content)
    k = next(k for k, part in enumerate(parts) if isinstance(part, Text))
    parts[k] = Text(insert_token(parts[k].text, token, at))
    if isinstance(message, User):
        return User(parts)
    return Assistant(parts, stop=message.stop, origin=message.origin)


def draw_op(rng: random.Random) -> tuple[Any, ...]:
    """One edit of every kind but reset, drawn from `rng` (for processes without Hypothesis)."""
    message = rng.choice(MESSAGES)
    small = rng.randrange(12)
    choices: list[tuple[Any, ...]] = [
        ("push", message, rng.choice([None, Author.user(), Author.plugin("p")])),
        ("extend", [rng.choice(MESSAGES) for _ in range(rng.randrange(3))]),
        ("splice", small, small + rng.randrange(3), [(rng.randrange(12), message)]),
        ("restore", small, small + 1, [rng.randrange(5)]),
        ("set_entries", [rng.randrange(8) for _ in range(rng.randrange(5))], message),
        ("edit_each", {rng.randrange(8)}, message),
        ("halt", rng.choice(["stopped", "kept"])),
        ("resume",),
        ("add_aside", rng.random() < 0.8, small),
        ("replace_aside", small, True),
        ("remove_aside", small),
        ("open_turn",),
        ("end_turn", rng.choice(["answered", "failed", "stopped"])),
        ("normalize",),
    ]
    return rng.choice(choices)

"""`sync.pairing`: when a tool call is answered, and how histories are mended so each one is."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync import pairing
from sync.entries import Author, Entry
from sync.errors import AnswerError, PairingError
from sync.messages import (
    AnyMessage,
    Assistant,
    AssistantPart,
    Message,
    Origin,
    Stop,
    System,
    Text,
    ToolCall,
    ToolResult,
    User,
    UserPart,
)
from sync.pairing import CANONICAL, NO_RESULT_PROVIDED, Pairing

STORED = Pairing(stored=True)
AS_TEXT = Pairing(answers=False)
FAILED = Stop("error")

C1 = ToolCall("c1", "search", {"q": "one"})
C2 = ToolCall("c2", "fetch", {"url": "two"})
C3 = ToolCall("c3", "search", {"q": "three"})
C1_AGAIN = ToolCall("c1", "search", {"q": "again"})


def r(call: ToolCall, text: str = "ok") -> ToolResult:
    return ToolResult(call.id, call.name, [Text(text)])


def made(call: ToolCall) -> ToolResult:
    return ToolResult(call.id, call.name, [Text(NO_RESULT_PROVIDED)], is_error=True)


def t(text: str) -> Text:
    return Text(text)


def u(*parts: UserPart | str) -> User:
    return User([Text(part) if isinstance(part, str) else part for part in parts])


def a(
    *parts: AssistantPart | str, stop: Stop | None = None, origin: Origin | None = None
) -> Assistant:
    content = [Text(part) if isinstance(part, str) else part for part in parts]
    return Assistant(content, stop=stop, origin=origin)


def s(text: str = "be brief") -> System:
    return System(text)


unanswered = PairingError.unanswered_tool_call
orphan = PairingError.orphan_tool_result
interrupted = PairingError.interrupted_tool_call
consecutive = PairingError.consecutive_assistant


# ---------------------------------------------------------------- pair, rule by rule

PAIR_CASES: list[tuple[str, Pairing, list[Message | None], list[Message], list[PairingError]]] = [
    ("plain history", CANONICAL, [u("q"), a("hi")], [u("q"), a("hi")], []),
    (
        "a result answers its call",
        CANONICAL,
        [u("q"), a(C1), u(r(C1)), a("done")],
        [u("q"), a(C1), u(r(C1)), a("done")],
        [],
    ),
    (
        "results answer in any order",
        CANONICAL,
        [a(C1, C2), u(r(C2), r(C1))],
        [a(C1, C2), u(r(C2), r(C1))],
        [],
    ),
    (
        "results split over messages are merged",
        CANONICAL,
        [a(C1, C2), u(r(C2)), u(r(C1)), a("done")],
        [a(C1, C2), u(r(C2), r(C1)), a("done")],
        [],
    ),
    (
        "a repeated call id takes one result per occurrence",
        CANONICAL,
        [a(C1, C1_AGAIN), u(r(C1, "x")), u(r(C1, "y")), u(r(C1, "z"))],
        [a(C1, C1_AGAIN), u(r(C1, "x"), r(C1, "y"))],
        [orphan(3, "c1")],
    ),
    (
        "a repeated call id answered once gets one made-up result",
        CANONICAL,
        [a(C1, C1_AGAIN), u(r(C1))],
        [a(C1, C1_AGAIN), u(r(C1), made(C1_AGAIN))],
        [unanswered(0, "c1")],
    ),
    (
        "an orphan result is dropped, the user's text stays",
        CANONICAL,
        [u("q"), a("hi"), u(r(C1), "more")],
        [u("q"), a("hi"), u("more")],
        [orphan(2, "c1")],
    ),
    (
        "a message of only orphans goes",
        CANONICAL,
        [u("q"), a(C1), u(r(C1)), u(r(C2))],
        [u("q"), a(C1), u(r(C1))],
        [orphan(3, "c2")],
    ),
    (
        "a result answers only the turn right before it",
        CANONICAL,
        [a(C1), a("next"), u(r(C1))],
        [a(C1), u(made(C1)), a("next")],
        [unanswered(0, "c1"), orphan(2, "c1")],
    ),
    (
        "the user's text closes waiting calls after the results that came",
        CANONICAL,
        [a(C1, C2), u(r(C1), "stop that")],
        [a(C1, C2), u(r(C1), made(C2), "stop that")],
        [unanswered(0, "c2")],
    ),
    (
        "a result after the user's text answers nothing",
        CANONICAL,
        [a(C1), u("wait", r(C1))],
        [a(C1), u(made(C1), "wait")],
        [unanswered(0, "c1"), orphan(1, "c1")],
    ),
    (
        "made-up results come in call order after the real ones",
        CANONICAL,
        [a(C1, C2, C3), u(r(C2))],
        [a(C1, C2, C3), u(r(C2), made(C1), made(C3))],
        [unanswered(0, "c1"), unanswered(0, "c3")],
    ),
    (
        "the next turn closes waiting calls",
        CANONICAL,
        [u("q"), a(C1), a("again")],
        [u("q"), a(C1), u(made(C1)), a("again")],
        [unanswered(1, "c1")],
    ),
    (
        "the end closes waiting calls",
        CANONICAL,
        [u("q"), a(C1)],
        [u("q"), a(C1), u(made(C1))],
        [unanswered(1, "c1")],
    ),
    (
        "a failed turn waits for nothing",
        CANONICAL,
        [u("q"), a(C1, stop=FAILED), u("retry")],
        [u("q"), a(C1, stop=FAILED), u("retry")],
        [],
    ),
    (
        "a result for a failed turn's call is an orphan",
        CANONICAL,
        [u("q"), a(C1, stop=FAILED), u(r(C1))],
        [u("q"), a(C1, stop=FAILED)],
        [orphan(2, "c1")],
    ),
    (
        "a failed turn closes the calls before it",
        CANONICAL,
        [a(C1), a(C2, stop=FAILED)],
        [a(C1), u(made(C1)), a(C2, stop=FAILED)],
        [unanswered(0, "c1")],
    ),
    ("user messages side by side merge", CANONICAL, [u("a"), u("b")], [u("a", "b")], []),
    (
        "an empty user message stays apart",
        CANONICAL,
        [u("a"), u(), u("b")],
        [u("a"), u(), u("b")],
        [],
    ),
    (
        "a system message with nothing waiting stays",
        CANONICAL,
        [s(), u("q"), a(C1), u(r(C1)), s("later")],
        [s(), u("q"), a(C1), u(r(C1)), s("later")],
        [],
    ),
    (
        "a system message is held past the result",
        CANONICAL,
        [a(C1), s(), u(r(C1))],
        [a(C1), u(r(C1)), s()],
        [interrupted(1, "c1")],
    ),
    (
        "a system message is held until the last result",
        CANONICAL,
        [a(C1, C2), u(r(C1)), s(), u(r(C2)), u("thanks")],
        [a(C1, C2), u(r(C1), r(C2)), s(), u("thanks")],
        [interrupted(2, "c2")],
    ),
    (
        "a system message is held past the user's closing message",
        CANONICAL,
        [a(C1), s(), u("never mind")],
        [a(C1), u(made(C1), "never mind"), s()],
        [interrupted(1, "c1"), unanswered(0, "c1")],
    ),
    (
        "a system message is held past made-up results at the end",
        CANONICAL,
        [a(C1), s(), s("two")],
        [a(C1), u(made(C1)), s(), s("two")],
        [unanswered(0, "c1")],
    ),
    (
        "a system message is held past made-up results before the next turn",
        CANONICAL,
        [a(C1, C2), u(r(C1)), s(), a("next")],
        [a(C1, C2), u(r(C1), made(C2)), s(), a("next")],
        [unanswered(0, "c2")],
    ),
    (
        "an orphan-only message does not overtake a held system message",
        CANONICAL,
        [a(C1), s(), u(r(C2))],
        [a(C1), u(made(C1)), s()],
        [orphan(2, "c2"), unanswered(0, "c1")],
    ),
    (
        "None closes waiting calls like a turn and goes",
        CANONICAL,
        [u("q"), a(C1), None, u(r(C1))],
        [u("q"), a(C1), u(made(C1))],
        [unanswered(1, "c1"), orphan(3, "c1")],
    ),
    (
        "None goes and the users around it merge",
        CANONICAL,
        [u("a"), None, u("b")],
        [u("a", "b")],
        [],
    ),
    (
        "None releases held system messages",
        CANONICAL,
        [a(C1), s(), None, a("next")],
        [a(C1), u(made(C1)), s(), a("next")],
        [unanswered(0, "c1")],
    ),
    (
        "canonically a result before the first turn is an orphan",
        CANONICAL,
        [s(), u(r(C1)), a("hi")],
        [s(), a("hi")],
        [orphan(1, "c1")],
    ),
    (
        "stored: results before the first turn are kept",
        STORED,
        [s(), u(r(C1)), u(r(C2), "and then"), a("hi")],
        [s(), u(r(C1), r(C2), "and then"), a("hi")],
        [],
    ),
    (
        "stored: one result per call id",
        STORED,
        [u(r(C1)), u(r(C1, "again"))],
        [u(r(C1))],
        [orphan(1, "c1")],
    ),
    (
        "stored: the user's own content ends the stored calls",
        STORED,
        [u("q"), u(r(C1))],
        [u("q")],
        [orphan(1, "c1")],
    ),
    (
        "stored: the first turn ends the stored calls",
        STORED,
        [a("hi"), u(r(C1))],
        [a("hi")],
        [orphan(1, "c1")],
    ),
    (
        "stored: None ends the stored calls",
        STORED,
        [u(r(C1)), None, u(r(C2))],
        [u(r(C1))],
        [orphan(2, "c2")],
    ),
    (
        "stored: later turns pair as usual",
        STORED,
        [u(r(C3)), a(C1), u("hm")],
        [u(r(C3)), a(C1), u(made(C1), "hm")],
        [unanswered(1, "c1")],
    ),
    (
        "as text: nothing is made up at the user's message",
        AS_TEXT,
        [a(C1, C2), u(r(C1), "go on")],
        [a(C1, C2), u(r(C1), "go on")],
        [],
    ),
    ("as text: nothing is made up at the end", AS_TEXT, [u("q"), a(C1)], [u("q"), a(C1)], []),
    (
        "as text: orphans are still dropped",
        AS_TEXT,
        [a(C1), a("next"), u(r(C1), "x")],
        [a(C1), a("next"), u("x")],
        [orphan(2, "c1")],
    ),
    (
        "as text: a system message is not held",
        AS_TEXT,
        [a(C1, C2), s(), u(r(C1)), s("two"), u(r(C2))],
        [a(C1, C2), s(), u(r(C1)), s("two"), u(r(C2))],
        [],
    ),
    (
        "as text: None still ends the wait",
        AS_TEXT,
        [a(C1), None, s(), u(r(C1), "x")],
        [a(C1), s(), u("x")],
        [orphan(3, "c1")],
    ),
]


@pytest.mark.parametrize(
    ("given_pairing", "messages", "expected", "repairs"),
    [case[1:] for case in PAIR_CASES],
    ids=[case[0] for case in PAIR_CASES],
)
def test_pair(
    given_pairing: Pairing,
    messages: list[Message | None],
    expected: list[Message],
    repairs: list[PairingError],
) -> None:
    """`pair` applies each pairing rule and reports what it mended, in the order found."""
    paired = pairing.pair(messages, given_pairing)
    assert paired.messages == expected
    assert paired.repairs == repairs


def test_pair_keeps_assistants_side_by_side() -> None:
    """`pair` leaves two assistant messages in a row apart (merging them is `repair`'s)."""
    messages: list[Message | None] = [u("q"), a("one"), a("two")]
    assert pairing.pair(messages) == pairing.Paired([u("q"), a("one"), a("two")], [])


def test_default_pairing_is_canonical() -> None:
    """The default reading neither keeps leading results nor leaves calls unanswered."""
    assert Pairing() == CANONICAL == Pairing(stored=False, answers=True)


# ---------------------------------------------------------------- repair

ORIGIN_1 = Origin("p", "m1", "r1")
ORIGIN_2 = Origin("p", "m2", "r2")

REPAIR_CASES: list[tuple[str, Pairing, list[Message | None], list[Message], list[PairingError]]] = [
    (
        "assistants in a row merge: content appended, later stop, first origin",
        CANONICAL,
        [u("q"), a("one", origin=ORIGIN_1), a("two", stop=Stop("length"), origin=ORIGIN_2)],
        [u("q"), a("one", "two", stop=Stop("length"), origin=ORIGIN_1)],
        [consecutive(2)],
    ),
    (
        "a failed turn merged into a live one: all its calls wait",
        CANONICAL,
        [u("q"), a(C1, stop=FAILED), a(C2), u(r(C1))],
        [u("q"), a(C1, C2), u(r(C1), made(C2))],
        [consecutive(2), unanswered(2, "c2")],
    ),
    (
        "a live turn merged into a failed one: no call waits",
        CANONICAL,
        [u("q"), a("thinking"), a(C2, stop=FAILED)],
        [u("q"), a("thinking", C2, stop=FAILED)],
        [consecutive(2)],
    ),
    (
        "an emptied turn between assistants leaves them in a row",
        CANONICAL,
        [u("q"), a("one"), None, a("two")],
        [u("q"), a("one", "two")],
        [consecutive(3)],
    ),
    (
        "a message of only orphans between assistants leaves them in a row",
        CANONICAL,
        [u("q"), a("one"), u(r(C1)), a("two")],
        [u("q"), a("one", "two")],
        [orphan(2, "c1"), consecutive(3)],
    ),
    (
        "as text: merged calls wait again for results",
        AS_TEXT,
        [a(C1), a("more"), u(r(C1))],
        [a(C1, "more"), u(r(C1))],
        [consecutive(1)],
    ),
]


@pytest.mark.parametrize(
    ("given_pairing", "messages", "expected", "repairs"),
    [case[1:] for case in REPAIR_CASES],
    ids=[case[0] for case in REPAIR_CASES],
)
def test_repair(
    given_pairing: Pairing,
    messages: list[Message | None],
    expected: list[Message],
    repairs: list[PairingError],
) -> None:
    """`repair` merges assistant messages in a row on top of `pair`, and says so."""
    repaired = pairing.repair(messages, given_pairing)
    assert repaired.messages == expected
    assert repaired.repairs == repairs
    pairing.validate(repaired.messages, given_pairing)


# ---------------------------------------------------------------- validate and check


def test_module_example_validates() -> None:
    """The module's example: a greeting and its answer is a canonical history."""
    pairing.validate([Message.user("Hello"), Message.assistant("Hi")])


VALIDATE_CASES: list[tuple[str, Pairing, list[Message], PairingError, str]] = [
    (
        "assistants in a row",
        CANONICAL,
        [u("q"), a("one"), a("two")],
        consecutive(2),
        "message 2 is an assistant message directly after another",
    ),
    (
        "a call without a result",
        CANONICAL,
        [u("q"), a(C1, C2), u(r(C1), "next")],
        unanswered(1, "c2"),
        "tool call 'c2' of message 1 has no result",
    ),
    (
        "a result without a call",
        CANONICAL,
        [u("q"), a("hi"), u(r(C3))],
        orphan(2, "c3"),
        "tool result 'c3' in message 2 answers no waiting call",
    ),
    (
        "a system message between a call and its result",
        CANONICAL,
        [u("q"), a(C1), s(), u(r(C1))],
        interrupted(2, "c1"),
        "system message 2 comes while tool call 'c1' waits for its result",
    ),
    (
        "a leading result, canonically",
        CANONICAL,
        [u(r(C1)), a("hi")],
        orphan(0, "c1"),
        "tool result 'c1' in message 0 answers no waiting call",
    ),
]


@pytest.mark.parametrize(
    ("given_pairing", "messages", "error", "text"),
    [case[1:] for case in VALIDATE_CASES],
    ids=[case[0] for case in VALIDATE_CASES],
)
def test_validate_rejects_with_where_and_which_call(
    given_pairing: Pairing, messages: list[Message], error: PairingError, text: str
) -> None:
    """`validate` raises the first finding, its message naming the message and the call."""
    with pytest.raises(PairingError) as raised:
        pairing.validate(messages, given_pairing)
    assert raised.value == error
    assert raised.value.message == text
    assert str(raised.value) == f"{error.reason}: {text}"
    assert pairing.check(messages, given_pairing) == error


VALID_CASES: list[tuple[str, Pairing, list[Message]]] = [
    ("results split over messages", CANONICAL, [a(C1, C2), u(r(C2)), u(r(C1), "next")]),
    ("user messages side by side", CANONICAL, [u("a"), u("b"), a("c"), u(), u("d")]),
    ("a failed turn owes nothing", CANONICAL, [u("q"), a(C1, stop=Stop("aborted")), u("r")]),
    ("a system message after the answer", CANONICAL, [a(C1), u(r(C1)), s(), u("q")]),
    ("stored leading results", STORED, [s(), u(r(C1), r(C2)), a("hi")]),
    ("calls as text left unanswered", AS_TEXT, [u("q"), a(C1), u("next"), a(C2)]),
    ("an empty history", CANONICAL, []),
]


@pytest.mark.parametrize(
    ("given_pairing", "messages"),
    [case[1:] for case in VALID_CASES],
    ids=[case[0] for case in VALID_CASES],
)
def test_validate_accepts(given_pairing: Pairing, messages: list[Message]) -> None:
    """`validate` accepts canonical histories, and `check` finds nothing in them."""
    pairing.validate(messages, given_pairing)
    assert pairing.check(messages, given_pairing) is None


def test_check_returns_the_first_finding() -> None:
    """`check` returns the first of several findings instead of raising."""
    messages: list[Message] = [a("hi"), u(r(C1)), a(C2), a("two")]
    assert pairing.check(messages) == orphan(1, "c1")


# ---------------------------------------------------------------- normalize

E_Q = Entry(u("q"), id="msg_q", author=Author.user("Ann"), source_id="src_q")
E_CALL = Entry(a(C1, C2), id="msg_call", source_id="src_call")


def entry(message: AnyMessage, name: str, author: Author | None = None) -> Entry:
    return Entry(message, id=f"msg_{name}", author=author, source_id=f"src_{name}")


def test_normalize_returns_valid_entries_untouched() -> None:
    """A list needing no repair comes back as the very same entry objects, with no repairs."""
    entries = [
        E_Q,
        E_CALL,
        entry(u(r(C2)), "r2"),
        entry(u(r(C1), "next"), "r1"),
        entry(u("side"), "side"),
        entry(s(), "sys"),
        entry(a("done"), "done"),
    ]
    normalized = pairing.normalize(entries)
    assert normalized.repairs == []
    assert len(normalized.entries) == len(entries)
    assert all(out is given for out, given in zip(normalized.entries, entries, strict=True))


def test_normalize_merges_assistant_entries_into_the_first() -> None:
    """A merged assistant entry keeps the first's id, author and source id."""
    first = entry(a("one", origin=ORIGIN_1), "one", Author.agent("sub"))
    second = entry(a("two", stop=Stop("stop"), origin=ORIGIN_2), "two", Author.plugin("p"))
    normalized = pairing.normalize([E_Q, first, second])
    assert normalized.entries == [
        E_Q,
        Entry(
            a("one", "two", stop=Stop("stop"), origin=ORIGIN_1),
            id="msg_one",
            author=Author.agent("sub"),
            source_id="src_one",
        ),
    ]
    assert normalized.repairs == [consecutive(2)]
    assert normalized.entries[0] is E_Q


def test_normalize_drops_orphans_and_entries_left_empty() -> None:
    """An orphan goes from its entry (a copy, same id); an entry of only orphans goes."""
    keeps = entry(u(r(C3), "text"), "keeps", Author.user())
    emptied = entry(u(r(C3)), "emptied")
    normalized = pairing.normalize([E_Q, entry(a("hi"), "hi"), keeps, emptied])
    assert normalized.entries[2] == Entry(
        u("text"), id="msg_keeps", author=Author.user(), source_id="src_keeps"
    )
    assert [e.id for e in normalized.entries] == ["msg_q", "msg_hi", "msg_keeps"]
    assert normalized.repairs == [orphan(2, "c3"), orphan(3, "c3")]


def test_normalize_puts_made_up_results_in_the_closing_user_entry() -> None:
    """A call closed by a user entry gets its made-up result there, after that entry's results."""
    split = entry(u(r(C1)), "split")
    closing = entry(u(r(C3), "stop"), "closing")
    normalized = pairing.normalize([E_Q, E_CALL, split, closing])
    assert normalized.entries[:3] == [E_Q, E_CALL, split]
    assert normalized.entries[2] is split
    assert normalized.entries[3] == Entry(
        u(made(C2), "stop"), id="msg_closing", source_id="src_closing"
    )
    assert normalized.repairs == [orphan(3, "c3"), unanswered(1, "c2")]


def test_normalize_puts_made_up_results_before_a_turn_in_a_new_rig_entry() -> None:
    """Calls closed by a turn or the end get a new id-less entry authored by the engine."""
    split = entry(u(r(C1)), "split")
    next_turn = entry(a(C3), "next")
    normalized = pairing.normalize([E_Q, E_CALL, split, next_turn])
    assert normalized.entries == [
        E_Q,
        E_CALL,
        split,
        Entry(u(made(C2)), author=Author.rig()),
        next_turn,
        Entry(u(made(C3)), author=Author.rig()),
    ]
    assert normalized.repairs == [unanswered(1, "c2"), unanswered(3, "c3")]


def test_normalize_moves_a_held_system_entry_after_the_answers() -> None:
    """A system entry that arrived while calls waited moves, unchanged, after their answers."""
    system = entry(s(), "sys", Author.plugin("memory"))
    first = entry(u(r(C2)), "first")
    last = entry(u(r(C1)), "last")
    normalized = pairing.normalize([E_Q, E_CALL, first, system, last])
    assert [e.id for e in normalized.entries] == [
        "msg_q",
        "msg_call",
        "msg_first",
        "msg_last",
        "msg_sys",
    ]
    assert normalized.entries[4] is system
    assert normalized.repairs == [interrupted(3, "c1")]


def test_normalize_keeps_user_entries_apart() -> None:
    """User entries side by side are no fault for `normalize`: each keeps its id."""
    entries = [entry(u("a"), "a"), entry(u("b"), "b"), entry(a("c"), "c")]
    normalized = pairing.normalize(entries)
    assert normalized == pairing.Normalized(entries, [])


# ---------------------------------------------------------------- pending calls and answers

PENDING_CASES: list[tuple[str, list[Message], list[ToolCall]]] = [
    ("no assistant message", [u("q")], []),
    ("no calls", [u("q"), a("hi")], []),
    ("all of the last turn's calls", [u("q"), a("x"), u("r"), a(C1, C2)], [C1, C2]),
    ("the calls no result answered yet", [a(C1, C2, C3), u(r(C2))], [C1, C3]),
    ("one per occurrence of an id", [a(C1, C1_AGAIN), u(r(C1))], [C1_AGAIN]),
    ("nothing once all are answered", [a(C1), u(r(C1))], []),
    ("nothing from a failed last turn", [a(C1), u(r(C1)), a(C2, stop=FAILED)], []),
    ("nothing after the user wrote on", [a(C1), u("never mind")], []),
    ("still owed past a system message", [a(C1, C2), s(), u(r(C1))], [C2]),
]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [case[1:] for case in PENDING_CASES],
    ids=[case[0] for case in PENDING_CASES],
)
def test_pending_calls(messages: list[Message], expected: list[ToolCall]) -> None:
    """`pending_calls` is what the last turn still owes, in call order, read as `pair` reads."""
    assert pairing.pending_calls(messages) == expected


ANSWER_CASES: list[tuple[str, list[ToolCall], Message | list[ToolResult], AnswerError | None]] = [
    ("exact, in any order", [C1, C2], u(r(C2), r(C1)), None),
    ("a list of results", [C1, C2], [r(C1), r(C2)], None),
    ("a repeated id, one result each", [C1, C1_AGAIN], [r(C1), r(C1)], None),
    ("nothing for nothing", [], u(), None),
    ("text in the message", [C1], u(r(C1), "and"), AnswerError.not_a_result()),
    ("an assistant message", [C1], a(C1), AnswerError.not_a_result()),
    ("a system message", [], s(), AnswerError.not_a_result()),
    ("a result for no call", [C1], [r(C1), r(C3)], AnswerError.unknown("c3")),
    ("one result too many for an id", [C1], [r(C1), r(C1)], AnswerError.unknown("c1")),
    ("calls left, in call order", [C1, C2, C3], [r(C2)], AnswerError.unanswered(["c1", "c3"])),
    ("a repeated id answered once", [C1, C1_AGAIN], [r(C1)], AnswerError.unanswered(["c1"])),
]


@pytest.mark.parametrize(
    ("pending", "results", "error"),
    [case[1:] for case in ANSWER_CASES],
    ids=[case[0] for case in ANSWER_CASES],
)
def test_answers(
    pending: list[ToolCall], results: Message | list[ToolResult], error: AnswerError | None
) -> None:
    """`answers` accepts results answering each call occurrence exactly, else says why not."""
    assert pairing.check_answers(pending, results) == error
    if error is None:
        pairing.answers(pending, results)
    else:
        with pytest.raises(AnswerError) as raised:
            pairing.answers(pending, results)
        assert raised.value == error


def test_answer_errors_name_the_calls() -> None:
    """The unknown and unanswered errors say which calls."""
    assert AnswerError.unknown("c3").message == "result 'c3' answers no pending call"
    error = pairing.check_answers([C1, C2], [])
    assert error is not None and error.call_ids == ("c1", "c2")
    assert error.message == "calls left without a result: c1, c2"


def test_close_pending_is_what_pair_makes_up() -> None:
    """`close_pending` gives one error result per occurrence, in call order, as `pair` does."""
    closing = pairing.close_pending([C2, C1, C1_AGAIN])
    assert closing == u(made(C2), made(C1), made(C1_AGAIN))
    assert pairing.pair([a(C2, C1, C1_AGAIN)]).messages[-1] == closing
    pairing.answers([C2, C1, C1_AGAIN], closing)


def test_close_pending_with_says_why() -> None:
    """`close_pending_with` puts the reason in each error result."""
    assert pairing.close_pending_with([C1, C2], "tool disabled") == u(
        ToolResult("c1", "search", [Text("tool disabled")], is_error=True),
        ToolResult("c2", "fetch", [Text("tool disabled")], is_error=True),
    )


# ---------------------------------------------------------------- safe start

HISTORY: list[Message] = [
    s(),  # 0
    u("q"),  # 1
    a(C1, C2),  # 2
    u(r(C1)),  # 3
    s("note"),  # 4
    u(r(C2), "and"),  # 5
    u("more"),  # 6
    a(C3),  # 7
    u(r(C3)),  # 8
]

SAFE_START_CASES: list[tuple[str, int, int]] = [
    ("at the start", 0, 0),
    ("at a user message", 1, 1),
    ("at the assistant", 2, 2),
    ("past cut-off results, with the system and text among them", 3, 6),
    ("past the last cut-off result", 5, 6),
    ("after them", 6, 6),
    ("results after the first turn stay", 7, 7),
    ("a trailing cut-off result", 8, 9),
    ("at the end", 9, 9),
    ("past the end", 12, 9),
    ("before the start", -3, 0),
]


@pytest.mark.parametrize(
    ("at", "expected"),
    [case[1:] for case in SAFE_START_CASES],
    ids=[case[0] for case in SAFE_START_CASES],
)
def test_safe_start(at: int, expected: int) -> None:
    """`safe_start` skips results whose call a window from `at` would cut off."""
    assert pairing.safe_start(HISTORY, at) == expected


# ---------------------------------------------------------------- properties

IDS = ["c1", "c2", "c3"]
call_ids = st.sampled_from(IDS)
texts = st.sampled_from(["a", "b"]).map(Text)
tool_calls = st.builds(ToolCall, call_ids, st.just("tool"), st.just({}))
tool_results = st.builds(
    ToolResult, call_ids, st.just("tool"), st.just([Text("ok")]), st.booleans()
)
stops = st.sampled_from(
    [None, Stop("stop"), Stop("tool_use"), Stop("length"), Stop("error"), Stop("aborted")]
)
origins = st.sampled_from([None, ORIGIN_1, ORIGIN_2])
users = st.builds(User, st.lists(st.one_of(tool_results, tool_results, texts), max_size=3))
assistants = st.builds(
    Assistant, st.lists(st.one_of(tool_calls, tool_calls, texts), max_size=3), stops, origins
)
systems = st.builds(System, st.sampled_from(["s1", "s2"]))
any_message: st.SearchStrategy[AnyMessage] = st.one_of(users, users, assistants, systems)
histories = st.lists(any_message, max_size=10)
histories_with_none = st.lists(st.one_of(any_message, st.none()), max_size=10)
pairings = st.builds(Pairing, st.booleans(), st.booleans())


def entries_of(messages: Sequence[AnyMessage]) -> list[Entry]:
    return [
        Entry(message, id=f"msg_{at}", source_id=str(at)) for at, message in enumerate(messages)
    ]


@given(histories_with_none, pairings)
def test_repair_output_validates(messages: list[Message | None], how: Pairing) -> None:
    """Whatever the input, `repair` gives a history `validate` accepts under the same reading."""
    pairing.validate(pairing.repair(messages, how).messages, how)


@given(histories_with_none, pairings)
def test_repair_is_idempotent(messages: list[Message | None], how: Pairing) -> None:
    """Repairing a repaired history changes nothing and finds nothing."""
    once = pairing.repair(messages, how).messages
    assert pairing.repair(once, how) == pairing.Paired(once, [])


@given(histories_with_none, pairings)
def test_pair_output_only_lacks_assistant_merges(
    messages: list[Message | None], how: Pairing
) -> None:
    """`pair`'s output fails `validate` at most for assistant messages in a row."""
    error = pairing.check(pairing.pair(messages, how).messages, how)
    assert error is None or error.reason == "consecutive_assistant"


@given(histories, pairings)
def test_check_is_the_first_repair(messages: list[AnyMessage], how: Pairing) -> None:
    """`check` finds exactly what `repair` would mend first."""
    repairs = pairing.repair(messages, how).repairs
    assert pairing.check(messages, how) == (repairs[0] if repairs else None)


@given(histories, pairings)
def test_normalize_keeps_ids_and_validates(messages: list[AnyMessage], how: Pairing) -> None:
    """`normalize` keeps the ids it keeps, in order bar moved system entries, and validates."""
    entries = entries_of(messages)
    normalized = pairing.normalize(entries, how)
    pairing.validate([e.message for e in normalized.entries], how)
    kept = [e.id for e in normalized.entries if e.id is not None]
    given_ids = [e.id for e in entries]
    assert len(set(kept)) == len(kept)
    assert set(kept) <= set(given_ids)
    kept_in_place = [e.id for e in normalized.entries if e.id and not isinstance(e.message, System)]
    assert kept_in_place == [id_ for id_ in given_ids if id_ in kept_in_place]
    for out in normalized.entries:
        if out.id is None:
            assert out.author == Author.rig()
            assert isinstance(out.message, User) and out.message.only_results()
        else:
            source = entries[int(out.id.removeprefix("msg_"))]
            assert (out.author, out.source_id) == (source.author, source.source_id)


@given(histories, pairings)
def test_normalize_leaves_what_needs_no_repair(messages: list[AnyMessage], how: Pairing) -> None:
    """A list is returned as the very same entries exactly when `check` finds nothing."""
    entries = entries_of(messages)
    normalized = pairing.normalize(entries, how)
    untouched = len(normalized.entries) == len(entries) and all(
        out is given for out, given in zip(normalized.entries, entries, strict=False)
    )
    assert untouched == (pairing.check(messages, how) is None)
    assert untouched == (normalized.repairs == [])
    again = pairing.normalize(normalized.entries, how)
    assert again.repairs == []
    assert all(out is given for out, given in zip(again.entries, normalized.entries, strict=True))


@given(histories, pairings)
def test_normalize_agrees_with_repair(messages: list[AnyMessage], how: Pairing) -> None:
    """`normalize` mends as `repair` does: merging its user entries gives `repair`'s messages."""
    normalized = pairing.normalize(entries_of(messages), how)
    repaired = pairing.repair(messages, how)
    assert normalized.repairs == repaired.repairs
    assert pairing.repair([e.message for e in normalized.entries], how).messages == (
        repaired.messages
    )


@given(histories)
def test_pending_calls_are_answered_by_one_result_each(messages: list[AnyMessage]) -> None:
    """One result per pending call, in any order, answers them; appended, nothing stays owed."""
    pending = pairing.pending_calls(messages)
    results = [r(call) for call in pending]
    results.reverse()
    pairing.answers(pending, results)
    closed = [*messages, pairing.close_pending(pending)] if pending else list(messages)
    assert pairing.pending_calls(closed) == []
    assert not any(
        found.reason == "orphan_tool_result" and found.index == len(messages)
        for found in pairing.pair(closed).repairs
    )


@given(histories, st.integers(min_value=-2, max_value=12))
def test_safe_start_leaves_no_cut_off_result(messages: list[AnyMessage], at: int) -> None:
    """From `safe_start`, no tool result comes before the first assistant turn."""
    start = pairing.safe_start(messages, at)
    assert start == len(messages) if at > len(messages) else max(at, 0) <= start <= len(messages)
    for message in messages[start:]:
        if isinstance(message, Assistant):
            break
        assert not message.tool_results()

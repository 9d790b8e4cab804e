"""The three-way merge (sync.merge): what both sides changed is kept, or it is a conflict."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from sync import Aside, Assistant, Author, Entry, Image, Message, Text, ToolCall, Usage, User
from sync.merge import diff, merge_aside, merge_entry, merge_message, merge_text

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Base texts are drawn from this pool without repeats (astral, combining marks and RTL
# included), and inserted text from pools of their own: then each side's diff is exactly the
# edit script that made it, and the expected merge is known.
BASE_POOL = [*"abcdefghijklmnopqrstuvwxyz", "\u0301", "\u05d0", "\u05d1", "\u0627"]
BASE_POOL += ["\U0001f600", "\U0001f98a", "\U00010348"]
OURS_POOL = [*"ABCDEFGH", "\U0001f525", "\u05e9"]
THEIRS_POOL = [*"0123456789", "\U0001f4a7", "\u0639"]

Script = list[tuple[int, int, str]]


def _apply(base: str, script: Script) -> str:
    out, at = [], 0
    for start, stop, text in sorted(script):
        out += [base[at:start], text]
        at = stop
    return "".join(out) + base[at:]


@st.composite
def _disjoint(draw: st.DrawFn) -> tuple[str, Script, Script]:
    """A base and two edit scripts whose ranges neither overlap nor meet (at least one
    unchanged code point between any two)."""
    base = "".join(draw(st.permutations(BASE_POOL))[: draw(st.integers(0, len(BASE_POOL)))])
    cuts = sorted(draw(st.sets(st.integers(0, len(base)), max_size=8)))
    ours: Script = []
    theirs: Script = []
    for start, stop in zip(cuts[::2], cuts[1::2], strict=False):
        if draw(st.booleans()):
            stop = start  # an insertion
        side, pool = draw(st.sampled_from([(ours, OURS_POOL), (theirs, THEIRS_POOL)]))
        text = "".join(draw(st.lists(st.sampled_from(pool), min_size=start == stop, max_size=4)))
        side.append((start, stop, text))
    return base, ours, theirs


@SETTINGS
@given(_disjoint())
def test_edits_that_do_not_touch_merge_in_either_order(case: tuple[str, Script, Script]) -> None:
    """Two edit scripts that do not touch merge to the text with both, whichever goes first."""
    base, ours, theirs = case
    mine, yours = _apply(base, ours), _apply(base, theirs)
    both = _apply(base, ours + theirs)
    assert merge_text(base, mine, yours) == both
    assert merge_text(base, yours, mine) == both


def _touch(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """The contract's rule, restated: ranges overlap, or one is an insertion inside or at an
    end of the other."""
    (s1, e1), (s2, e2) = a, b
    return (s1 < e2 and s2 < e1) or ((s1 == e1 or s2 == e2) and s1 <= e2 and s2 <= e1)


@SETTINGS
@given(st.data())
def test_edits_that_touch_conflict_never_lose_one(data: st.DataObject) -> None:
    """Two different edits whose ranges touch are a conflict in either order, never one of
    them silently."""
    base = "".join(data.draw(st.permutations(BASE_POOL))[: data.draw(st.integers(1, 12))])
    position = st.integers(0, len(base))
    s1, e1, s2, e2 = (data.draw(position) for _ in range(4))
    assume(s1 <= e1 and s2 <= e2 and _touch((s1, e1), (s2, e2)))

    def text(pool: list[str]) -> str:
        return "".join(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))

    mine = _apply(base, [(s1, e1, text(OURS_POOL))])
    yours = _apply(base, [(s2, e2, text(THEIRS_POOL))])
    assert merge_text(base, mine, yours) is None
    assert merge_text(base, yours, mine) is None


@SETTINGS
@given(st.text("ab\u0301\U0001f600", max_size=10), st.data())
def test_any_merge_is_symmetric_and_diffs_rebuild_their_text(
    base: str, data: st.DataObject
) -> None:
    """For any texts (repeats and all), the diff rebuilds the other text from the base, and
    the merge does not depend on which side goes first."""
    texts = st.text("ab\u0301\U0001f600X", max_size=10)
    mine, yours = data.draw(texts), data.draw(texts)
    for other in (mine, yours):
        assert _apply(base, [tuple(h) for h in diff(base, other)]) == other  # type: ignore[misc]
    assert merge_text(base, mine, yours) == merge_text(base, yours, mine)
    assert merge_text(base, mine, base) == mine and merge_text(base, base, yours) == yours


def test_the_issues_sentence_merges() -> None:
    """The case of issue 33, and its overlapping twin."""
    fox = "The quick brown fox jumps over the lazy dog."
    red, sleepy = fox.replace("brown", "RED"), fox.replace("lazy", "SLEEPY")
    assert merge_text(fox, red, sleepy) == "The quick RED fox jumps over the SLEEPY dog."
    assert merge_text(fox, red, fox.replace("brown", "BLUE")) is None
    assert merge_text(fox, red, red) == red  # the same edit made twice


def test_insertions_at_one_point_conflict_unless_identical() -> None:
    """Two insertions at the same point touch; identical ones are taken once."""
    assert merge_text("ab", "aXb", "aYb") is None
    assert merge_text("ab", "aXb", "aXb") == "aXb"
    assert merge_text("ab", "Xab", "abY") == "XabY"
    assert merge_text("ab", "xb", "ay") == "xy"  # ranges that only meet merge


def _call(arguments: dict[str, Any]) -> Assistant:
    return Assistant([Text("calling"), ToolCall("c1", "search", arguments)])


def test_messages_merge_part_by_part() -> None:
    """Text parts and a tool call's arguments merge at character level; other parts must be
    unchanged on one side; a different shape conflicts unless one side left it alone."""
    base = _call({"query": "red fox", "limit": 10})
    ours = _call({"query": "red fox jumps", "limit": 10})
    theirs = _call({"query": "red fox", "limit": 20})
    assert merge_message(base, ours, theirs) == _call({"query": "red fox jumps", "limit": 20})
    blue = _call({"query": "blue fox", "limit": 10})
    assert merge_message(base, ours, blue) == _call({"query": "blue fox jumps", "limit": 10})
    cat = _call({"query": "red cat", "limit": 10})
    assert merge_message(base, ours, cat) is None  # " jumps" goes in where "fox" changed
    image = User([Text("look"), Image("image/png", url="a.png")])
    assert merge_message(
        image,
        User([Text("look here"), Image("image/png", url="a.png")]),
        User([Text("look"), Image("image/png", url="b.png")]),
    ) == User([Text("look here"), Image("image/png", url="b.png")])
    assert (
        merge_message(
            image,
            User([Text("look"), Image("image/png", url="c.png")]),
            User([Text("look"), Image("image/png", url="b.png")]),
        )
        is None
    )
    longer = User([Text("look"), Image("image/png", url="a.png"), Text("more")])
    assert (
        merge_message(image, longer, User([Text("LOOK"), Image("image/png", url="a.png")])) is None
    )
    assert merge_message(image, longer, image) == longer
    assert merge_message(Message.user("a"), Message.assistant("b"), Message.user("c")) is None
    assert merge_message(
        Message.system("one two"), Message.system("ONE two"), Message.system("one TWO")
    ) == Message.system("ONE TWO")


def test_arguments_that_merge_into_bad_json_conflict() -> None:
    """A tool call's arguments merged as text must still be a JSON object."""
    base = _call({"a": "x"})
    assert merge_message(base, _call({"a": "x", "b": 1}), _call({"a": "x", "c": 2})) is None


def test_an_entry_keeps_the_pending_id_and_author() -> None:
    """The merged entry is the pending one's, with the author of whoever changed it last."""
    me, you = Author.user("me"), Author.user("you")
    base = Entry(Message.user("one two"), "msg_0", None)
    log = Entry(Message.user("ONE two"), "msg_0", you)
    pending = Entry(Message.user("one TWO"), "msg_1", me)
    assert merge_entry(base, log, pending) == Entry(Message.user("ONE TWO"), "msg_1", me)  # type: ignore[arg-type]
    same = Entry(Message.user("one TWO"), "msg_0", None)
    assert merge_entry(base, log, same) == Entry(Message.user("ONE TWO"), "msg_0", you)  # type: ignore[arg-type]


def test_notes_merge_their_text() -> None:
    """A note's text merges at character level; its title must be unchanged on one side."""
    base = Aside.note("plan", "one two", None)
    text = merge_aside(
        base, Aside.note("plan", "ONE two", None), Aside.note("plan", "one TWO", None)
    )
    assert text is not None and text.value == {"title": "plan", "text": "ONE TWO"}
    titles = merge_aside(base, Aside.note("a", "one two", None), Aside.note("b", "one two", None))
    assert titles is None
    other = Aside("pins", None, Author.user(), ["x"])
    assert (
        merge_aside(
            other,
            Aside("pins", None, Author.user(), ["y"]),
            Aside("pins", None, Author.user(), ["z"]),
        )
        is None
    )


@st.composite
def _token_edits(draw: st.DrawFn) -> tuple[str, str, str]:
    """A text of bracketed tokens that share most of their characters, and two sides that each
    insert tokens of their own between tokens (as people insert words between words)."""
    made = iter(range(10**6))

    def token(side: str) -> str:
        side = draw(st.sampled_from([side, "0"]))  # look-alikes of the base's tokens too
        return f"<r{side}.{draw(st.integers(0, 40))}{next(made)}>"

    def insert(text: str, side: str) -> str:
        bounds = [0, *(k + 1 for k, c in enumerate(text) if c == ">")]
        at = draw(st.sampled_from(bounds))
        return text[:at] + token(side) + text[at:]

    base = ""
    for _ in range(draw(st.integers(0, 5))):
        base = insert(base, "0")
    ours, theirs = base, base
    for _ in range(draw(st.integers(1, 3))):
        ours = insert(ours, "1")
    for _ in range(draw(st.integers(1, 3))):
        theirs = insert(theirs, "2")
    return base, ours, theirs


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_token_edits())
@example(
    ("<r0.302><r0.181>", "<r0.302><r0.353><r0.181>", "<r0.302><r1.205><r1.196><r0.181><r1.274>")
)
def test_insertions_between_repeated_text_never_interleave(case: tuple[str, str, str]) -> None:
    """Insertions among look-alike tokens merge with every token whole, or conflict: the same
    insertion point is found at one place on both sides however the text repeats."""
    base, ours, theirs = case
    merged = merge_text(base, ours, theirs)
    if merged is not None:
        tokens = re.compile(r"<r\d\.\d+>")
        assert sorted(tokens.findall(merged)) == sorted(
            {*tokens.findall(ours), *tokens.findall(theirs)}
        )
        assert len(merged) == len(ours) + len(theirs) - len(base)


def test_a_merge_keeps_the_provider_fields_either_side_set() -> None:
    """Usage set on one side and a tool call's provider data on the other, beside a text edit,
    all survive the merge (a merged message must not drop what a provider needs replayed)."""
    call = ToolCall("c1", "search", {"q": "x"})
    base = Assistant([Text("calling now"), call])
    ours = Assistant([Text("calling now!"), call], usage=Usage(10, 3))
    tagged = ToolCall("c1", "search", {"q": "x"}, provider_data={"id": "fc_1"})
    theirs = Assistant([Text("Calling now"), tagged])
    merged = merge_message(base, ours, theirs)
    assert merged == Assistant([Text("Calling now!"), tagged], usage=Usage(10, 3))
    assert merge_message(base, theirs, ours) == merged

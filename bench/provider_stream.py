"""Stream fold cost per event against the provider SDK's own accumulation (issue 28).

Run from the repository root:

    .venv/bin/python bench/provider_stream.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/provider_stream.py --quick    # a smoke run; writes nothing

What it measures: for each format, one long answer's stream (a reasoning block of 200 deltas,
800 text deltas of 4 characters, two tool calls of 60 argument deltas each, usage) is built as
the SDK's own event objects (its `construct_type`, as its SSE parser makes them) from the
fake provider's scripts (`tests/support/fakeprovider.py`). Then the CPU time
(`time.thread_time`, the collector paused) per event of, on the same objects, in the same run,
repeats interleaved:
the SDK's accumulation (`anthropic`'s `accumulate_event`; `openai`'s
`ChatCompletionStreamState.handle_chunk` and `ResponseStreamState.handle_event`, each with
its final message), and `sync.providers.streams` folding the events into draft appends and
the final `Assistant` (`feed` per event, then `final()`). Bar: the fold <= 1.5x the SDK's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench._support import use_test_helpers  # noqa: E402

use_test_helpers()  # tests/support (or tests): fleet, fakeprovider, ... by bare name

from _report import Results, gc_paused, now, publish, ratio_row  # noqa: E402
from fakeprovider import anthropic_stream, chat_stream, responses_stream  # noqa: E402

from sync.providers.streams import stream_fold  # noqa: E402

SECTION = "LLM provider stream folds vs the SDKs' accumulation (`bench/provider_stream.py`)"


def _anthropic(texts: int) -> tuple[list[Any], Callable[[list[Any]], object]]:
    from anthropic._models import construct_type
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent

    blocks = [
        {"type": "thinking", "thinking": "hmmm" * 200, "signature": "c2ln" * 20},
        {"type": "text", "text": "word" * texts},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": "x" * 220}},
        {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {"q": "y" * 220}},
    ]
    script = anthropic_stream(blocks, stop_reason="tool_use", usage={"cache_read_input_tokens": 5})
    events = [construct_type(type_=RawMessageStreamEvent, value=e) for e in script]

    def sdk(events: list[Any]) -> object:
        snapshot = None
        bufs: dict[int, bytes] = {}
        for event in events:
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
        return snapshot

    return events, sdk


def _chat(texts: int) -> tuple[list[Any], Callable[[list[Any]], object]]:
    from openai._models import construct_type
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    calls = [("call_1", "f", {"q": "x" * 220}), ("call_2", "g", {"q": "y" * 220})]
    script = chat_stream("word" * texts, calls=calls, finish="tool_calls")
    events = [construct_type(type_=ChatCompletionChunk, value=e) for e in script]

    def sdk(events: list[Any]) -> object:
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        for event in events:
            state.handle_chunk(event)
        return state.get_final_completion()

    return events, sdk


def _responses(texts: int) -> tuple[list[Any], Callable[[list[Any]], object]]:
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    items = [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "hmmm" * 200}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "word" * texts, "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": json.dumps({"q": "x" * 220}),
            "status": "completed",
        },
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "g",
            "arguments": json.dumps({"q": "y" * 220}),
            "status": "completed",
        },
    ]
    script = responses_stream(items)
    events = [construct_type(type_=ResponseStreamEvent, value=e) for e in script]

    def sdk(events: list[Any]) -> object:
        from openai import omit

        state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
        for event in events:
            state.handle_event(event)
        return state._completed_response

    return events, sdk


def _fold(format: Any) -> Callable[[list[Any]], object]:
    def run(events: list[Any]) -> object:
        fold = stream_fold(format)
        for event in events:
            fold.feed(event)
        return fold.final()

    return run


def _time(run: Callable[[list[Any]], object], events: list[Any], loops: int) -> float:
    """CPU seconds per event, over `loops` runs of the whole stream."""
    with gc_paused():
        start = time.thread_time()
        for _ in range(loops):
            run(events)
        return (time.thread_time() - start) / (loops * len(events))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    started, clock = now(), time.monotonic()
    texts, loops, repeats = (100, 3, 3) if args.quick else (800, 20, 9)
    results = Results()
    for name, format, build in (
        ("Anthropic Messages", "anthropic", _anthropic),
        ("OpenAI Chat Completions", "openai_chat", _chat),
        ("OpenAI Responses", "openai_responses", _responses),
    ):
        events, sdk = build(texts)
        fold = _fold(format)
        fold(events)  # warm both, and check the fold reads these objects
        sdk(events)
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(repeats):
            theirs.append(_time(sdk, events, loops))
            ours.append(_time(fold, events, loops))
        results.add(
            ratio_row(
                f"{name}: fold / SDK per event ({len(events)} events)", ours, theirs, 1.5, "<= 1.5"
            ),
            name,
        )
        results.notes.append(
            f"{name}: fold {sorted(ours)[len(ours) // 2] * 1e6:.2f} us/event, "
            f"SDK {sorted(theirs)[len(theirs) // 2] * 1e6:.2f} us/event"
        )
    table = results.table() + "\n\n" + "\n".join(f"- {note}" for note in results.notes)
    publish(SECTION, __doc__ or "", table, started, time.monotonic() - clock, write=not args.quick)
    if results.failed:
        sys.exit(f"bar failed: {', '.join(results.failed)}")


if __name__ == "__main__":
    main()

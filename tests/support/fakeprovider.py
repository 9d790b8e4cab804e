"""A fake LLM provider on 127.0.0.1 (port 0) that replays SSE streams in each provider's
documented shape, so the real `anthropic` and `openai` SDKs parse them with their own code.

`FakeProvider` runs `http.server` in a thread; `provider.script(events)` queues the events of
the next streamed answer (each a dict: its `type` becomes the SSE `event:` line for the
Anthropic and Responses formats; the Chat format sends bare `data:` lines and `[DONE]`), and
`provider.requests` holds every request body as JSON; a body the provider's API would refuse
(`requestshape.request_errors`) is answered 400 `invalid_request_error` as the API does. An event
`{"sleep": s}` pauses the stream (so a UI sees the draft grow), `{"hang": True}` holds it open
until the client goes away.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from requestshape import request_errors


class FakeProvider:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.scripts: list[list[dict[str, Any]]] = []
        self.closed_early = threading.Event()
        self.refused: list[list[str]] = []
        """What was wrong with each request answered 400 (`requestshape.request_errors`)."""
        self.partial_seen: threading.Event | None = None
        """Set by a watching UI once it has shown part of the text: a stream waits for it at
        its first pause after text (`watched` arms it)."""
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, events: list[dict[str, Any]]) -> None:
        self.scripts.append(events)

    @contextmanager
    def running(self) -> Iterator[FakeProvider]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _refuse(self, message: str) -> None:
                error = {"type": "invalid_request_error", "message": message}
                if self.path.endswith("/messages"):
                    payload = {"type": "error", "error": error}
                else:
                    payload = {"error": error | {"param": None, "code": None}}
                data = json.dumps(payload).encode()
                self.send_response(400)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                provider.requests.append((self.path, body))
                errors = request_errors(self.path, body)
                if errors:
                    # As the real APIs answer a request they do not take.
                    provider.refused.append(errors)
                    self._refuse("; ".join(errors))
                    return
                events = provider.scripts.pop(0) if provider.scripts else []
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                chat = self.path.endswith("/chat/completions")
                try:
                    for event in events:
                        if "sleep" in event:
                            seen = provider.partial_seen
                            if event.get("after_text") and seen is not None:
                                # Hold the rest until the watching UI has shown the text so
                                # far: "the UI saw the draft grow" then holds however slowly
                                # a loaded machine runs (bounded: a UI that never sees it
                                # fails its own check).
                                seen.wait(timeout=10)
                            time.sleep(event["sleep"])
                            continue
                        if "hang" in event:
                            while True:  # until the client closes: the write then fails
                                time.sleep(0.01)
                                self.wfile.write(b": keep\n\n")
                                self.wfile.flush()
                        data = json.dumps(event).encode()
                        if chat:
                            self.wfile.write(b"data: " + data + b"\n\n")
                        else:
                            self.wfile.write(b"event: " + event["type"].encode() + b"\n")
                            self.wfile.write(b"data: " + data + b"\n\n")
                        self.wfile.flush()
                    if chat:
                        self.wfile.write(b"data: [DONE]\n\n")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    provider.closed_early.set()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(5)


# ---------------------------------------------------------------------- Anthropic Messages


def anthropic_stream(
    blocks: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
    error_after: int | None = None,
    pause: float = 0.0,
) -> list[dict[str, Any]]:
    """The events of one Messages stream: `blocks` are `{"type": "text", "text"}`,
    `{"type": "thinking", "thinking", "signature"}`, `{"type": "redacted_thinking", "data"}`,
    `{"type": "tool_use", "id", "name", "input"}`, each streamed in pieces."""
    start_usage = {"input_tokens": 12, "output_tokens": 1} | (usage or {})
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake1",
                "type": "message",
                "role": "assistant",
                "model": "claude-fake",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start_usage,
            },
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for piece in _pieces(block["text"]):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    }
                )
                if pause:
                    events.append({"sleep": pause, "after_text": True})
        elif kind == "thinking":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
            for piece in _pieces(block["thinking"]):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": piece},
                    }
                )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                }
            )
        elif kind == "redacted_thinking":
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": start})
            for piece in _pieces(json.dumps(block["input"])):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    }
                )
        events.append({"type": "content_block_stop", "index": index})
        if error_after is not None and index + 1 == error_after:
            events.append(
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            )
            return events
    final_usage = {"output_tokens": 42} | {
        k: v for k, v in (usage or {}).items() if k != "output_tokens"
    }
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": final_usage,
        }
    )
    events.append({"type": "message_stop"})
    return events


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)] or [""]


# ---------------------------------------------------------------------- OpenAI Chat


def chat_stream(
    text: str | None = None,
    *,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    refusal: str | None = None,
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
    error: bool = False,
    pause: float = 0.0,
) -> list[dict[str, Any]]:
    """The chunks of one Chat Completions stream (with `include_usage`'s last chunk)."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-fake",
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            ],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(text) if text else []:
        events.append(chunk({"content": piece}))
        if pause:
            events.append({"sleep": pause, "after_text": True})
    if error:
        events.append({"error": {"message": "overloaded", "type": "server_error"}})
        return events
    for piece in _pieces(refusal) if refusal else []:
        events.append(chunk({"refusal": piece}))
    for index, (call_id, name, arguments) in enumerate(calls):
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [first]}))
        for piece in _pieces(json.dumps(arguments)):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    events.append(chunk({}, finish))
    events.append(
        {
            "id": "chatcmpl-fake1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-fake",
            "choices": [],
            "usage": usage
            or {
                "prompt_tokens": 30,
                "completion_tokens": 9,
                "total_tokens": 39,
                "prompt_tokens_details": {"cached_tokens": 20},
                "completion_tokens_details": {"reasoning_tokens": 4},
            },
        }
    )
    return events


# ---------------------------------------------------------------------- OpenAI Responses


def responses_stream(
    items: list[dict[str, Any]],
    *,
    status: str = "completed",
    incomplete: str | None = None,
    error: bool = False,
    pause: float = 0.0,
) -> list[dict[str, Any]]:
    """The `response.*` events of one Responses stream. `items` are output items in their
    final shape (`message` with `output_text`/`refusal` parts, `reasoning`, `function_call`)."""
    seq = iter(range(10_000))
    base = {
        "id": "resp_fake1",
        "object": "response",
        "created_at": 1700000000,
        "model": "gpt-fake",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "in_progress",
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": next(seq), "response": base},
        {"type": "response.in_progress", "sequence_number": next(seq), "response": base},
    ]
    for index, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            added = item | {"content": [], "status": "in_progress"}
            events.append(
                {
                    "type": "response.output_item.added",
                    "sequence_number": next(seq),
                    "output_index": index,
                    "item": added,
                }
            )
            for c, part in enumerate(item["content"]):
                empty = part | ({"text": ""} if part["type"] == "output_text" else {"refusal": ""})
                events.append(
                    {
                        "type": "response.content_part.added",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": c,
                        "part": empty,
                    }
                )
                key = "text" if part["type"] == "output_text" else "refusal"
                delta_type = (
                    "response.output_text.delta" if key == "text" else "response.refusal.delta"
                )
                for piece in _pieces(part[key]):
                    delta = {
                        "type": delta_type,
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": c,
                        "delta": piece,
                    }
                    if key == "text":
                        delta["logprobs"] = []
                    events.append(delta)
                    if pause:
                        events.append({"sleep": pause, "after_text": key == "text"})
                done_type = (
                    "response.output_text.done" if key == "text" else "response.refusal.done"
                )
                done = {
                    "type": done_type,
                    "sequence_number": next(seq),
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": c,
                    key: part[key],
                }
                if key == "text":
                    done["logprobs"] = []
                events.append(done)
                events.append(
                    {
                        "type": "response.content_part.done",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": c,
                        "part": part,
                    }
                )
        elif kind == "reasoning":
            added = item | {"summary": []}
            events.append(
                {
                    "type": "response.output_item.added",
                    "sequence_number": next(seq),
                    "output_index": index,
                    "item": added,
                }
            )
            for s, part in enumerate(item["summary"]):
                events.append(
                    {
                        "type": "response.reasoning_summary_part.added",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "summary_index": s,
                        "part": {"type": "summary_text", "text": ""},
                    }
                )
                for piece in _pieces(part["text"]):
                    events.append(
                        {
                            "type": "response.reasoning_summary_text.delta",
                            "sequence_number": next(seq),
                            "item_id": item["id"],
                            "output_index": index,
                            "summary_index": s,
                            "delta": piece,
                        }
                    )
                events.append(
                    {
                        "type": "response.reasoning_summary_text.done",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "summary_index": s,
                        "text": part["text"],
                    }
                )
                events.append(
                    {
                        "type": "response.reasoning_summary_part.done",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "summary_index": s,
                        "part": part,
                    }
                )
        elif kind == "function_call":
            added = item | {"arguments": "", "status": "in_progress"}
            events.append(
                {
                    "type": "response.output_item.added",
                    "sequence_number": next(seq),
                    "output_index": index,
                    "item": added,
                }
            )
            for piece in _pieces(item["arguments"]):
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "sequence_number": next(seq),
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": piece,
                    }
                )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "sequence_number": next(seq),
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                    "name": item["name"],
                }
            )
        events.append(
            {
                "type": "response.output_item.done",
                "sequence_number": next(seq),
                "output_index": index,
                "item": item,
            }
        )
        if error:
            events.append(
                {
                    "type": "error",
                    "sequence_number": next(seq),
                    "code": "server_error",
                    "message": "boom",
                    "param": None,
                }
            )
            return events
    final = base | {
        "status": status,
        "output": items,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "usage": {
            "input_tokens": 50,
            "input_tokens_details": {"cached_tokens": 32},
            "output_tokens": 17,
            "output_tokens_details": {"reasoning_tokens": 8},
            "total_tokens": 67,
        },
    }
    end = {"completed": "response.completed", "incomplete": "response.incomplete"}[status]
    events.append({"type": end, "sequence_number": next(seq), "response": final})
    return events

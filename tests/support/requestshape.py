"""What each provider's API accepts as a request, checked by the fake provider (SPEC §11).

A request body that a real API would answer with 400 `invalid_request_error` gets the same
from the fake provider, so every SDK test that sends a conversation back out through `to_*`
shows the provider would take it. The rules are the documented request shapes, kept to what
the converters can get wrong: which keys each message, block, part and item may carry (an id
or author leaking into a prompt is an unknown key), which blocks each role may hold, Anthropic's
thinking blocks with their signatures and tool results first in a user turn, and every tool
result answering a call made right before it.

`request_errors(path, body)` lists what is wrong, empty when the request is well formed.
"""

from __future__ import annotations

from typing import Any

Json = Any

_ANTHROPIC_TOP = {
    "model", "max_tokens", "messages", "system", "stream", "thinking", "tools", "tool_choice",
    "metadata", "stop_sequences", "temperature", "top_p", "top_k", "service_tier",
}  # fmt: skip
_ANTHROPIC_BLOCKS: dict[str, tuple[set[str], set[str]]] = {  # type: (required, allowed)
    "text": ({"text"}, {"cache_control", "citations"}),
    "image": ({"source"}, {"cache_control"}),
    "document": ({"source"}, {"cache_control", "citations", "context", "title"}),
    "tool_use": ({"id", "name", "input"}, {"cache_control"}),
    "tool_result": ({"tool_use_id"}, {"content", "is_error", "cache_control"}),
    "thinking": ({"thinking", "signature"}, set()),
    "redacted_thinking": ({"data"}, set()),
}
_ANTHROPIC_ROLE_BLOCKS = {
    "user": {"text", "image", "document", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}

_CHAT_TOP = {
    "model", "messages", "stream", "stream_options", "tools", "tool_choice", "temperature",
    "max_tokens", "max_completion_tokens", "parallel_tool_calls", "response_format", "seed",
    "top_p", "user", "reasoning_effort", "store", "metadata",
}  # fmt: skip
_CHAT_MESSAGES: dict[str, tuple[set[str], set[str]]] = {
    "system": ({"content"}, {"name"}),
    "developer": ({"content"}, {"name"}),
    "user": ({"content"}, {"name"}),
    "assistant": (set(), {"content", "tool_calls", "refusal", "name", "audio"}),
    "tool": ({"tool_call_id", "content"}, set()),
}
_CHAT_PARTS = {
    "text": {"text"},
    "image_url": {"image_url"},
    "input_audio": {"input_audio"},
    "file": {"file"},
    "refusal": {"refusal"},
}

_RESPONSES_TOP = {
    "model", "input", "stream", "include", "tools", "tool_choice", "instructions", "reasoning",
    "store", "previous_response_id", "max_output_tokens", "temperature", "top_p", "metadata",
    "parallel_tool_calls", "text", "truncation", "user", "background", "service_tier",
}  # fmt: skip
_RESPONSES_ITEMS: dict[str, tuple[set[str], set[str]]] = {
    "message": ({"role", "content"}, {"type", "id", "status"}),
    "reasoning": ({"summary"}, {"id", "encrypted_content", "content", "status"}),
    "function_call": ({"call_id", "name", "arguments"}, {"id", "status"}),
    "function_call_output": ({"call_id", "output"}, {"id", "status"}),
}
_RESPONSES_PARTS = {
    "input_text": {"text"},
    "input_image": {"image_url", "file_id", "detail"},
    "input_file": {"file_data", "file_id", "file_url", "filename"},
    "output_text": {"text", "annotations", "logprobs"},
    "refusal": {"refusal"},
}


def request_errors(path: str, body: Json) -> list[str]:
    """What is wrong with request `body` sent to `path` (empty when a provider takes it)."""
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    if path.endswith("/messages"):
        return _anthropic(body)
    if path.endswith("/chat/completions"):
        return _chat(body)
    if path.endswith("/responses"):
        return _responses(body)
    return [f"no such endpoint {path}"]


def _keys(where: str, value: Json, required: set[str], allowed: set[str]) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: not an object"]
    errors = [f"{where}: missing {key}" for key in sorted(required - value.keys())]
    unknown = value.keys() - required - allowed - {"type", "role"}
    errors += [f"{where}: unknown key {key}" for key in sorted(unknown)]
    return errors


def _text_blocks(where: str, content: Json, kinds: set[str]) -> list[str]:
    """`content` is a string or a list of blocks whose `type` is one of `kinds`."""
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        return [f"{where}: content is neither text nor a list"]
    return [
        f"{where}.{at}: a {block.get('type')!r} block may not be here"
        for at, block in enumerate(content)
        if not isinstance(block, dict) or block.get("type") not in kinds
    ]


# ---------------------------------------------------------------------- Anthropic Messages


def _anthropic(body: Json) -> list[str]:
    errors = _keys("request", body, {"model", "max_tokens", "messages"}, _ANTHROPIC_TOP)
    if "system" in body:
        errors += _text_blocks("system", body["system"], {"text"})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages: at least one message"]
    if isinstance(messages[0], dict) and messages[0].get("role") != "user":
        errors.append("messages.0: the first message must be the user's")
    for at, message in enumerate(messages):
        errors += _keys(f"messages.{at}", message, {"role", "content"}, set())
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ANTHROPIC_ROLE_BLOCKS:
            errors.append(f"messages.{at}: role {role!r}")
    if errors:
        return errors
    calls: set[str] = set()  # the tool_use ids of the assistant turn just before
    for where, role, content in _turns(messages):
        if isinstance(content, str):
            calls = set()
            continue
        if not isinstance(content, list) or not content:
            errors.append(f"{where}: content is neither text nor a non-empty list")
            continue
        seen_other = False
        answered: set[str] = set()
        for index, block in enumerate(content):
            spot = f"{where}.content.{index}"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in _ANTHROPIC_ROLE_BLOCKS[role]:
                errors.append(f"{spot}: a {kind!r} block in a {role} message")
                continue
            required, allowed = _ANTHROPIC_BLOCKS[kind]
            errors += _keys(spot, block, required, allowed)
            if kind == "tool_result":
                if seen_other:
                    errors.append(f"{spot}: tool results go first in a user message")
                if block.get("tool_use_id") not in calls:
                    errors.append(f"{spot}: answers no tool_use of the turn before")
                answered.add(block.get("tool_use_id"))
                errors += _text_blocks(spot, block.get("content", ""), {"text", "image"})
            else:
                seen_other = True
            if kind == "thinking" and not block.get("signature"):
                errors.append(f"{spot}: a thinking block needs its signature")
            if kind == "tool_use" and not isinstance(block.get("input"), dict):
                errors.append(f"{spot}: tool_use input must be an object")
        if role == "user" and calls - answered:
            errors.append(f"{where}: tool_use {sorted(calls - answered)} not answered")
        calls = {
            block["id"]
            for block in content
            if role == "assistant" and isinstance(block, dict) and block.get("type") == "tool_use"
        }
    return errors


def _turns(messages: list[Json]) -> list[tuple[str, str, Json]]:
    """The conversation's turns as the API reads them: a run of messages of one role is one
    turn (their contents joined), named by where the run starts."""
    turns: list[tuple[str, str, Json]] = []
    for at, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if turns and turns[-1][1] == role and isinstance(content, list | str):
            where, _, before = turns[-1]
            joined = [*_as_blocks(before), *_as_blocks(content)]
            turns[-1] = (where, role, joined)
        else:
            turns.append((f"messages.{at}", role, content))
    return turns


def _as_blocks(content: Json) -> list[Json]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


# ---------------------------------------------------------------------- OpenAI Chat


def _chat(body: Json) -> list[str]:
    errors = _keys("request", body, {"model", "messages"}, _CHAT_TOP)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages: at least one message"]
    owed: set[str] = set()  # calls of the last assistant message not answered yet
    for at, message in enumerate(messages):
        where = f"messages.{at}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _CHAT_MESSAGES:
            errors.append(f"{where}: role {role!r}")
            continue
        required, allowed = _CHAT_MESSAGES[role]
        errors += _keys(where, message, required, allowed)
        if role != "tool" and owed:
            errors.append(f"{where}: tool calls {sorted(owed)} not answered before it")
            owed = set()
        if role == "tool":
            if message.get("tool_call_id") not in owed:
                errors.append(f"{where}: answers no call of the assistant message before")
            owed.discard(message.get("tool_call_id"))
            errors += _text_blocks(where, message.get("content"), {"text"})
        elif role == "assistant":
            content = message.get("content")
            if content is not None:
                errors += _text_blocks(where, content, {"text", "refusal"})
            calls = message.get("tool_calls") or []
            if content is None and not calls:
                errors.append(f"{where}: an assistant message needs content or tool_calls")
            for index, call in enumerate(calls):
                spot = f"{where}.tool_calls.{index}"
                errors += _keys(spot, call, {"id", "type", "function"}, set())
                function = call.get("function") if isinstance(call, dict) else None
                errors += _keys(f"{spot}.function", function, {"name", "arguments"}, set())
                if isinstance(function, dict) and not isinstance(function.get("arguments"), str):
                    errors.append(f"{spot}: arguments must be a JSON string")
                owed.add(call.get("id") if isinstance(call, dict) else None)
        else:
            content = message.get("content")
            kinds = set(_CHAT_PARTS) - {"refusal"} if role == "user" else {"text"}
            errors += _text_blocks(where, content, kinds)
            for index, part in enumerate(content if isinstance(content, list) else []):
                if isinstance(part, dict) and part.get("type") in _CHAT_PARTS:
                    need = _CHAT_PARTS[part["type"]]
                    errors += _keys(f"{where}.content.{index}", part, need, set())
    if owed:
        errors.append(f"messages: tool calls {sorted(owed)} not answered")
    return errors


# ---------------------------------------------------------------------- OpenAI Responses


def _responses(body: Json) -> list[str]:
    errors = _keys("request", body, {"model", "input"}, _RESPONSES_TOP)
    items = body.get("input")
    if isinstance(items, str):
        return errors
    if not isinstance(items, list) or not items:
        return [*errors, "input: at least one item"]
    calls: set[str] = set()
    for at, item in enumerate(items):
        where = f"input.{at}"
        if not isinstance(item, dict):
            errors.append(f"{where}: not an object")
            continue
        kind = item.get("type", "message")
        if kind not in _RESPONSES_ITEMS:
            errors.append(f"{where}: item type {kind!r}")
            continue
        required, allowed = _RESPONSES_ITEMS[kind]
        errors += _keys(where, item, required, allowed)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                errors.append(f"{where}: role {role!r}")
            kinds = {"output_text", "refusal"} if role == "assistant" else set(_RESPONSES_PARTS)
            kinds -= set() if role == "assistant" else {"output_text", "refusal"}
            content = item.get("content")
            errors += _text_blocks(where, content, kinds)
            for index, part in enumerate(content if isinstance(content, list) else []):
                if isinstance(part, dict) and part.get("type") in _RESPONSES_PARTS:
                    allowed_part = _RESPONSES_PARTS[part["type"]]
                    need = {"text"} if "text" in allowed_part else set()
                    errors += _keys(f"{where}.content.{index}", part, need, allowed_part)
        elif kind == "reasoning":
            for index, part in enumerate(item.get("summary") or []):
                errors += _keys(f"{where}.summary.{index}", part, {"text"}, set())
        elif kind == "function_call":
            calls.add(item.get("call_id"))
            if not isinstance(item.get("arguments"), str):
                errors.append(f"{where}: arguments must be a JSON string")
        elif item.get("call_id") not in calls:
            errors.append(f"{where}: answers no function_call before it")
    return errors

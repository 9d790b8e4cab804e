"""The JS fold (client/web/convsync.js under node) against the Python fold, on the same records.

Run from the repository root: `.venv/bin/python bench/js_fold.py` (about a minute). It writes
the section "JS fold vs Python fold" of docs/benchmarks.md.

Two record streams of 100,000 records, made by the Python model and written as JSON arrays:
- pushes: one-entry push records of ~300-character alternating user/assistant messages (the
  stream `bench/model.py` folds);
- mixed: the same with, every 10th record, an edit of the last entry (a splice keeping its id),
  every 25th an aside put, every 50th a halt and every 100th a pure insertion near the end.

Each side times decoding the JSON text into records (`msgspec` typed decoding of
`list[ChangeRecord]`; `JSON.parse`) and folding the decoded records onto a new conversation
(`Conversation.apply` each; the JS fold also checks each record's shape, as msgspec's decoder
does in Python). Repeats alternate between the two languages. Node runs one warm-up fold per
process before it measures (a live page has compiled its fold long before); Python needs none.
The bar: the JS fold at least as fast as the Python fold, for both streams.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from bench._report import (
    ROOT,
    Results,
    Row,
    command_line,
    gc_paused,
    machine,
    median,
    now,
    text,
    write_section,
)
from bench._report import spread as spread_of
from sync import Aside, Author, ChangeRecord, Conversation, Message, User, encode

RECORDS = 100_000
REPEATS = 5
HEADING = "JS fold vs Python fold (`bench/js_fold.py`)"


def pushes() -> list[ChangeRecord]:
    conversation = Conversation()
    for i in range(RECORDS):
        message = Message.user(text(i)) if i % 2 == 0 else Message.assistant(text(i))
        conversation.push(message)
    return conversation.take_unsaved()


def mixed() -> list[ChangeRecord]:
    conversation = Conversation()
    editor = Author.plugin("edit")
    for i in range(RECORDS):
        n = len(conversation)
        if i % 100 == 99 and n > 3:
            conversation.splice(slice(n - 2, n - 2), [Message.system(text(i, 80))], editor)
        elif i % 50 == 49 and n:
            if not conversation.halt("kept"):
                conversation.push(Message.user(text(i)))
        elif i % 25 == 24 and n:
            conversation.add_aside(Aside.note("note", text(i, 60), conversation.id(n - 1)))
        elif i % 10 == 9 and n:
            last = conversation.entry(n - 1)
            assert last is not None
            user = isinstance(last.message, User)
            changed = Message.user(text(i)) if user else Message.assistant(text(i))
            conversation.splice(
                slice(n - 1, n), [msgspec.structs.replace(last, message=changed)], editor
            )
        else:
            message = Message.user(text(i)) if i % 2 == 0 else Message.assistant(text(i))
            conversation.push(message)
    records = conversation.take_unsaved()
    assert len(records) == RECORDS
    return records


def time_python(data: bytes) -> tuple[float, float, Conversation]:
    decoder = msgspec.json.Decoder(list[ChangeRecord])
    with gc_paused():
        start = time.perf_counter()
        records = decoder.decode(data)
        decoded = time.perf_counter() - start
        conversation = Conversation()
        start = time.perf_counter()
        for record in records:
            conversation.apply(record)
        folded = time.perf_counter() - start
    return decoded, folded, conversation


def main() -> None:
    began = time.perf_counter()
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    streams = {"pushes": pushes(), "mixed": mixed()}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, records in streams.items():
            path = Path(tmp) / f"{name}.json"
            path.write_bytes(encode(records))
            files[name] = path
        times: dict[str, dict[str, list[float]]] = {
            name: {"py_decode": [], "py_fold": [], "js_parse": [], "js_fold": [], "js_cold": []}
            for name in streams
        }
        sizes = {name: path.stat().st_size for name, path in files.items()}
        for _ in range(REPEATS):
            for name, path in files.items():
                decoded, folded, conversation = time_python(path.read_bytes())
                times[name]["py_decode"].append(decoded)
                times[name]["py_fold"].append(folded)
                expected = (len(conversation), conversation.revision)
            out = subprocess.run(
                ["node", str(ROOT / "bench" / "js_fold.mjs"), *map(str, files.values())],
                capture_output=True,
                text=True,
                check=True,
            )
            found = json.loads(out.stdout)
            for name, path in files.items():
                result = found[str(path)]
                times[name]["js_parse"].append(result["parse"])
                times[name]["js_fold"].append(result["fold"])
                times[name]["js_cold"].append(result["cold"])
            # Both sides folded the same value (checked on the last stream).
            assert (result["entries"], result["revision"]) == expected, (result, expected)
    results = Results()
    failed = False
    for name in streams:
        t = times[name]
        for key, label in (
            ("py_decode", f"{name}: Python decode (msgspec, one array)"),
            ("js_parse", f"{name}: JS `JSON.parse`"),
            ("py_fold", f"{name}: Python fold (`apply` each)"),
            ("js_fold", f"{name}: JS fold (`apply` each)"),
            ("js_cold", f"{name}: JS fold, cold (the first in its process; informative)"),
        ):
            value = median(t[key])
            results.add(
                Row(
                    label,
                    f"{value:.3f} s = {RECORDS / value / 1000:.0f}k records/s",
                    spread_of(t[key], "{:.3f} s"),
                )
            )
        ratio = median(t["py_fold"]) / median(t["js_fold"])
        passed = ratio >= 1.0
        failed |= not passed
        results.add(
            Row(f"{name}: JS fold speed / Python fold speed", f"{ratio:.2f}x", "", ">= 1", passed)
        )
        both = (median(t["py_decode"]) + median(t["py_fold"])) / (
            median(t["js_parse"]) + median(t["js_fold"])
        )
        results.add(
            Row(f"{name}: decode + fold, JS speed / Python speed (informative)", f"{both:.2f}x")
        )
    head = "  \n".join(
        [
            f"Command: `{command_line()}` (from the repository root)",
            f"Date: {now()}; the run took {time.perf_counter() - began:.0f} s",
            f"Machine: {machine()}, node {node.stdout.strip()}, shared with other jobs",
            f"Result: **{'a bar FAILED' if failed else 'all bars PASS'}**",
        ]
    )
    streams_doc = (__doc__ or "").split("Two record streams", 1)[1].split("The bar:", 1)[0]
    body = "\n\n".join(
        [
            head,
            "Two record streams" + streams_doc.strip(),
            f"Each timing is the median of {REPEATS} repeats; the JSON is "
            f"{sizes['pushes'] / 1e6:.1f} MB (pushes) and {sizes['mixed'] / 1e6:.1f} MB (mixed). "
            "The Python loops run with the garbage collector paused.",
            results.table(),
        ]
    )
    write_section(HEADING, body)
    print(body)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

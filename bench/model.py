"""Benchmarks of the conversation model, `sync.Conversation` (SPEC 1.7 "Performance").

Run from the repository root:

    .venv/bin/python bench/model.py            # the full run; writes docs/benchmarks.md
    .venv/bin/python bench/model.py --quick    # a smoke run at small sizes; writes nothing

What it measures, in one run (bars are checked on figures from this run only):

1. `push` of one entry at 1,000 and at 100,000 entries: cost per push (bar: ratio <= 1.5).
2. `apply` of a one-entry push record at the same two sizes (bar: ratio <= 1.5).
3. Folding 100,000 decoded one-entry push records onto an empty conversation vs decoding the
   same records from JSON with `sync.decode_record` (bar: fold time <= 4 x decode time).
4. Memory of a 100,000-entry conversation of ~300-character messages, traced with
   `tracemalloc`, vs its JSON size (bar: <= 3x).
5. `index_of`, `id` and `aside` lookups and a splice in the middle, at both sizes
   (informative).

Timing loops run with the cyclic garbage collector paused (`gc.collect()` first), so a full
collection of the large conversation's objects is not billed to whichever operation happens
to trigger it. Repeats of the two sides of each ratio are interleaved. When a bar fails, the
failing workload is run once more under `cProfile` and its top functions are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sync
from bench._report import (
    Results,
    Row,
    command_line,
    gc_paused,
    machine,
    median,
    now,
    spread,
    text,
    write_section,
)
from sync import (
    Aside,
    AsideChange,
    Assistant,
    Author,
    ChangeRecord,
    Conversation,
    Entry,
    IdMinter,
    Message,
    Push,
    Stop,
    Text,
    User,
)

SECTION = "Model (`bench/model.py`)"

# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    small: int  # entries in the small conversation
    large: int  # entries in the large conversation
    batch: int  # pushes / applies timed per repeat
    repeats: int  # repeats of every timing (the median is reported)
    fold: int  # records folded / decoded
    memory: int  # entries in the conversation whose memory is traced
    probes: int  # lookups timed per repeat
    splices: int  # splices timed per repeat


FULL = Settings(
    small=1_000,
    large=100_000,
    batch=1_000,
    repeats=9,
    fold=100_000,
    memory=100_000,
    probes=20_000,
    splices=20,
)
QUICK = Settings(
    small=1_000,
    large=10_000,
    batch=500,
    repeats=3,
    fold=10_000,
    memory=10_000,
    probes=2_000,
    splices=5,
)

# ---------------------------------------------------------------------------- workload


def message(i: int) -> User | Assistant:
    """Message `i` of a chat: even ones the user's, odd ones the model's replies."""
    if i % 2 == 0:
        return Message.user(text(i))
    return Assistant([Text(text(i))], stop=Stop("stop"))


def entries_record(n: int) -> ChangeRecord:
    """One push record of `n` entries with ids, to grow a conversation to `n` by `apply`."""
    minter = IdMinter()
    return ChangeRecord(Push([Entry(message(i), minter.message_id()) for i in range(n)]))


def grown(record: ChangeRecord) -> Conversation:
    """A fresh conversation holding the entries of `record` (and nothing unsaved)."""
    conversation = Conversation()
    conversation.apply(record)
    return conversation


def push_records(n: int, start: int = 0) -> list[ChangeRecord]:
    """`n` one-entry push records, made by another conversation's `push` and `take_unsaved`."""
    source = Conversation()
    for i in range(start, start + n):
        source.push(message(i))
    return source.take_unsaved()


def elapsed_ns(run: Callable[[], object]) -> int:
    """Nanoseconds `run()` takes, with the garbage collector paused."""
    with gc_paused():
        begin = time.perf_counter_ns()
        run()
        return time.perf_counter_ns() - begin


# ---------------------------------------------------------------------------- results


def us(ns: float) -> str:
    """Microseconds (milliseconds from 10 ms on)."""
    return f"{ns / 1e6:.1f} ms" if ns >= 1e7 else f"{ns / 1000:.2f} µs"


# ---------------------------------------------------------------------------- measurements


def per_op_at_sizes(
    settings: Settings, timed_batch: Callable[[Conversation], int]
) -> dict[int, list[float]]:
    """ns per operation of `timed_batch` on a fresh conversation of each size, repeats
    interleaved between the sizes."""
    records = {n: entries_record(n) for n in (settings.small, settings.large)}
    samples: dict[int, list[float]] = {n: [] for n in records}
    for _ in range(settings.repeats):
        for n, record in records.items():
            conversation = grown(record)
            samples[n].append(timed_batch(conversation) / settings.batch)
            del conversation
    return samples


def ratio_rows(
    results: Results,
    settings: Settings,
    what: str,
    measurement: str,
    samples: dict[int, list[float]],
) -> None:
    small, large = settings.small, settings.large
    for n in (small, large):
        results.add(
            Row(f"{what} at {n:,} entries (per op)", us(median(samples[n])), spread=_us(samples[n]))
        )
    ratio = median(samples[large]) / median(samples[small])
    results.add(
        Row(
            f"{what}: {large:,} / {small:,} cost ratio",
            f"{ratio:.2f}",
            bar="<= 1.5",
            passed=ratio <= 1.5,
        ),
        measurement,
    )


def _us(samples: list[float]) -> str:
    return spread([s / 1000 for s in samples], "{:.2f}") + " µs"


def bench_push(settings: Settings, results: Results) -> None:
    """1. `push` of one entry at the small and the large size."""
    messages = [message(i) for i in range(settings.batch)]

    def pushes(conversation: Conversation) -> int:
        push = conversation.push

        def run() -> None:
            for item in messages:
                push(item)

        return elapsed_ns(run)

    ratio_rows(results, settings, "push", "push", per_op_at_sizes(settings, pushes))


def bench_apply(settings: Settings, results: Results) -> None:
    """2. `apply` of a one-entry push record at the small and the large size."""
    records = push_records(settings.batch, start=10**9)

    def applies(conversation: Conversation) -> int:
        apply = conversation.apply

        def run() -> None:
            for record in records:
                apply(record)

        return elapsed_ns(run)

    ratio_rows(
        results, settings, "apply (push record)", "apply", per_op_at_sizes(settings, applies)
    )


def bench_fold(settings: Settings, results: Results) -> None:
    """3. Folding decoded one-entry push records vs decoding them from JSON."""
    n = settings.fold
    blobs = [sync.encode(record) for record in push_records(n)]
    batch_blob = b"[" + b",".join(blobs) + b"]"
    batch_type = list[ChangeRecord]
    decode_record = sync.decode_record
    decoded = [decode_record(blob) for blob in blobs]

    def decode_each() -> None:
        [decode_record(blob) for blob in blobs]

    def decode_batch() -> None:
        sync.decode(batch_blob, batch_type)

    def fold() -> None:
        apply = Conversation().apply
        for record in decoded:
            apply(record)

    decode_batch()  # builds (and caches) the batch decoder outside the timing
    times: dict[str, list[int]] = {"decode": [], "batch": [], "fold": []}
    for _ in range(settings.repeats):
        times["decode"].append(elapsed_ns(decode_each))
        times["batch"].append(elapsed_ns(decode_batch))
        times["fold"].append(elapsed_ns(fold))

    def rate(ns: list[int]) -> str:
        return f"{n / (median(ns) / 1e9) / 1000:,.0f}k records/s"

    def secs(ns: list[int]) -> str:
        return spread([t / 1e9 for t in ns], "{:.3f}") + " s"

    kib = len(batch_blob) / n
    results.add(
        Row(
            f"decode {n:,} records, `sync.decode_record` each ({kib:.0f} B JSON each)",
            f"{median(times['decode']) / 1e9:.3f} s = {rate(times['decode'])}",
            spread=secs(times["decode"]),
        )
    )
    results.add(
        Row(
            f"decode {n:,} records as one JSON array (`list[ChangeRecord]`)",
            f"{median(times['batch']) / 1e9:.3f} s = {rate(times['batch'])}",
            spread=secs(times["batch"]),
        )
    )
    results.add(
        Row(
            f"fold {n:,} decoded records (`Conversation().apply` each)",
            f"{median(times['fold']) / 1e9:.3f} s = {rate(times['fold'])}",
            spread=secs(times["fold"]),
        )
    )
    ratio = median(times["fold"]) / median(times["decode"])
    results.add(
        Row(
            "fold time / decode time (`decode_record` each)",
            f"{ratio:.2f} (fold at {1 / ratio:.2f}x decode speed)",
            bar="<= 4 (fold >= 1/4 decode speed)",
            passed=ratio <= 4,
        ),
        "fold",
    )
    batch_ratio = median(times["fold"]) / median(times["batch"])
    results.add(Row("fold time / batch decode time (informative)", f"{batch_ratio:.2f}"))


def bench_memory(settings: Settings, results: Results) -> None:
    """4. Retained memory of a conversation (tracemalloc) vs its JSON size."""
    n = settings.memory
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    conversation = Conversation()
    for i in range(n):
        conversation.push(message(i))
    conversation.take_unsaved()  # the outbox is not the conversation's memory
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - before
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    json_size = len(sync.encode(conversation))
    ratio = retained / json_size
    results.add(
        Row(
            f"memory of {n:,} entries (tracemalloc, retained)",
            f"{retained / 2**20:.1f} MiB = {retained / n:.0f} B/entry",
        )
    )
    results.add(
        Row(
            "JSON size (`len(sync.encode(conversation))`)",
            f"{json_size / 2**20:.1f} MiB = {json_size / n:.0f} B/entry",
        )
    )
    results.add(
        Row("memory / JSON size", f"{ratio:.2f}", bar="<= 3", passed=ratio <= 3),
        "memory",
    )
    top = snapshot.statistics("lineno")[:6]
    results.notes.append(
        "Memory by allocating line (tracemalloc, top 6; the `model.py` lines are the message "
        "texts and messages this benchmark made, which the conversation holds): "
        + "; ".join(
            f"`{Path(stat.traceback[0].filename).name}:{stat.traceback[0].lineno}` "
            f"{stat.size / 2**20:.1f} MiB"
            for stat in top
        )
    )


def scan_sizes(settings: Settings) -> list[int]:
    """The sizes lookups and splices are timed at: small, 10,000 and large."""
    return sorted({settings.small, 10_000, settings.large})


def by_size(timings: dict[int, list[float]], show: Callable[[float], str]) -> str:
    """`show(median)` at the largest size, then the smaller sizes in brackets."""
    sizes = sorted(timings, reverse=True)
    rest = ", ".join(f"{n:,}: {show(median(timings[n]))}" for n in sizes[1:])
    return f"{show(median(timings[sizes[0]]))} ({rest})"


def bench_lookups(settings: Settings, results: Results) -> None:
    """5a. `index_of`, `id` and `aside` lookups of random keys, at each scan size (O(1)
    sanity; random probes over a larger conversation also miss the CPU caches more)."""
    rng = random.Random(7)
    minter = IdMinter()
    cases = {}
    for n in scan_sizes(settings):
        conversation = grown(entries_record(n))
        aside_ids = [minter.aside_id() for _ in range(n // 10)]
        for k, aside_id in enumerate(aside_ids):
            aside = Aside.note(f"note {k}", text(k, 40), conversation.id(k * 10))
            conversation.apply(ChangeRecord(AsideChange(aside_id, aside)))
        ids = [conversation.id(rng.randrange(n)) for _ in range(settings.probes)]
        ats = [rng.randrange(n) for _ in range(settings.probes)]
        asides = [rng.choice(aside_ids) for _ in range(settings.probes)]
        plain = {conversation.id(at): at for at in range(n)}
        cases[n] = (conversation, ids, ats, asides, plain)
    timings: dict[str, dict[int, list[float]]] = {
        "index_of": {},
        "id": {},
        "aside": {},
        "dict.get": {},
    }
    for _ in range(settings.repeats):
        for n, (conversation, ids, ats, asides, plain) in cases.items():
            index_of, id_, aside = conversation.index_of, conversation.id, conversation.aside

            def run_index_of(ids: list[str] = ids, index_of: Callable = index_of) -> None:
                for x in ids:
                    index_of(x)

            def run_id(ats: list[int] = ats, id_: Callable = id_) -> None:
                for at in ats:
                    id_(at)

            def run_aside(asides: list[str] = asides, aside: Callable = aside) -> None:
                for x in asides:
                    aside(x)

            def run_dict_get(ids: list[str] = ids, get: Callable = plain.get) -> None:
                for x in ids:
                    get(x)

            for name, run in (
                ("index_of", run_index_of),
                ("id", run_id),
                ("aside", run_aside),
                ("dict.get", run_dict_get),
            ):
                per_op = elapsed_ns(run) / settings.probes
                timings[name].setdefault(n, []).append(per_op)
    for name, at_sizes in timings.items():
        what = f"`{name}` of a random key"
        if name == "dict.get":
            what = "baseline: `dict.get` of the same ids on a plain `{id: index}` dict"
        results.add(
            Row(
                f"{what} at {settings.large:,} entries (smaller sizes)",
                by_size(at_sizes, lambda ns: f"{ns:.0f} ns"),
                spread=spread(at_sizes[settings.large], "{:.0f}") + " ns",
            )
        )


def bench_splice(settings: Settings, results: Results) -> None:
    """5b. A one-entry splice in the middle at each scan size (O(entries after it))."""
    by = Author.plugin("bench")
    conversations = {n: grown(entries_record(n)) for n in scan_sizes(settings)}
    timings: dict[int, list[float]] = {n: [] for n in conversations}
    counter = iter(range(10**9, 2 * 10**9))
    for _ in range(settings.repeats):
        for n, conversation in conversations.items():
            replacements = [message(next(counter)) for _ in range(settings.splices)]
            middle = slice(n // 2, n // 2 + 1)
            splice = conversation.splice

            def run(
                replacements: list[User | Assistant] = replacements,
                middle: slice = middle,
                splice: Callable = splice,
            ) -> None:
                for item in replacements:
                    splice(middle, [item], by)

            timings[n].append(elapsed_ns(run) / settings.splices)
            conversation.take_unsaved()
    results.add(
        Row(
            f"splice of 1 entry in the middle at {settings.large:,} entries (smaller sizes)",
            by_size(timings, us),
            spread=f"{us(min(timings[settings.large]))}-{us(max(timings[settings.large]))}",
        )
    )
    results.notes.append(
        "Lookups and splices are informative. Lookups grow with the size because random "
        "probes into a larger conversation miss the CPU caches more, not because of more "
        "steps: the plain-dict baseline grows alike. A splice moves the entries after it "
        "in the list (one C-level move) and leaves their positions in the id index stale; the "
        "next lookup that finds a stale position refreshes them in one pass, so the cost of "
        "re-indexing is paid once per run of splices, not once per splice."
    )


# ---------------------------------------------------------------------------- profiles


def profile(measurement: str, settings: Settings) -> str:
    """The top functions (by own time) of the workload behind `measurement`, run once."""
    profiler = cProfile.Profile()
    if measurement in ("push", "apply"):
        conversation = grown(entries_record(settings.large))
        if measurement == "push":
            items = [message(i) for i in range(settings.batch * 10)]
            work = conversation.push
        else:
            items = push_records(settings.batch * 10, start=10**9)
            work = conversation.apply
        gc.disable()
        profiler.enable()
        for item in items:
            work(item)
        profiler.disable()
        gc.enable()
    elif measurement == "fold":
        blobs = [sync.encode(record) for record in push_records(settings.fold)]
        gc.disable()
        profiler.enable()
        decoded = [sync.decode_record(blob) for blob in blobs]
        apply = Conversation().apply
        for record in decoded:
            apply(record)
        profiler.disable()
        gc.enable()
    else:
        return "(see the tracemalloc breakdown above)"
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


# ---------------------------------------------------------------------------- report


def section(results: Results, settings: Settings, started: str, seconds: float) -> str:
    verdict = "all bars PASS" if not results.failed else f"FAILED: {', '.join(results.failed)}"
    return "\n".join(
        [
            f"Command: `{command_line()}` (from the repository root)  ",
            f"Date: {started}; the run took {seconds:.0f} s  ",
            f"Machine: {machine()}, shared with other jobs  ",
            f"Result: **{verdict}**",
            "",
            f"Each timing is the median of {settings.repeats} repeats, the sizes' repeats "
            "interleaved; the spread is min-max over the repeats. Lookups and splices are "
            "informative (no bar). `push`/`apply`: a batch of "
            f"{settings.batch:,} operations is timed on a fresh conversation grown to "
            f"{settings.small:,} or {settings.large:,} entries by one `apply` of a push record; "
            "the apply records were made by another conversation (`push`, then "
            "`take_unsaved()`). Fold vs decode: the same one-entry push records of ~300-character "
            "alternating user/assistant messages. Memory: built by `push` of such messages, "
            "then `take_unsaved()` (the outbox is dropped), measured as tracemalloc's traced "
            "total after `gc.collect()`, minus the total before building.",
            "",
            "The garbage collector is paused (after a `gc.collect()`) inside every timing loop: "
            "fair here because every side of each ratio runs the same way, and a full "
            "collection over the large conversation's objects is the interpreter's cost, not "
            "the model's.",
            "",
            results.table(),
            "",
            "\n\n".join(results.notes),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run at small sizes (writes nothing)"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of every timed workload"
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    started = now()
    begin = time.perf_counter()
    results = Results()
    steps = [
        ("push", bench_push),
        ("apply", bench_apply),
        ("fold vs decode", bench_fold),
        ("memory", bench_memory),
        ("lookups", bench_lookups),
        ("splice", bench_splice),
    ]
    for name, step in steps:
        print(f"... {name}", file=sys.stderr, flush=True)
        step(settings, results)
    seconds = time.perf_counter() - begin

    print(results.table())
    for note in results.notes:
        print(note)
    for measurement in ["push", "apply", "fold"] if args.profile else results.failed:
        print(f"\ncProfile of `{measurement}` (top 15 by own time):")
        print(profile(measurement, settings))
    if args.quick or args.no_write:
        print("\n(not written to docs/benchmarks.md)")
    else:
        path = write_section(SECTION, section(results, settings, started, seconds))
        print(f"\nwrote the {SECTION!r} section of {path}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())

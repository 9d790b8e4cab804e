"""Run many chaos seeds and publish the figures: `python tests/chaos/run.py --seeds 1:501`.

`--store postgres --hubs 2` runs each seed on two hub processes sharing one PostgreSQL schema
(the server at `--pg`, default `CONVSYNC_TEST_PG` or a throwaway cluster as the tests start);
`--write` then fills the section "Chaos on PostgreSQL" instead. `--kill-replicas` gives every
replica an outbox (SPEC 14) and kills -9 replica processes too, each started again on its
outbox; `--write` then fills "Chaos with replica kills".

Each seed runs in its own directory under `--dir` (kept for failed seeds). A failing seed is
printed with the command that reproduces it; the exit code is 1 when any seed failed. With
`--write`, the totals go to `docs/reliability.md` (section "Chaos").
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tests" / "support"), str(ROOT / "tests"), str(ROOT)]

from harness import Chaos, run  # noqa: E402


def seeds(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start), int(stop) if stop else int(start) + 1)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=seeds, default=seeds("1:21"), help="START:STOP")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--ops", type=int, default=40, help="edits per replica")
    parser.add_argument("--no-kills", action="store_true", help="no kill -9 of the hub")
    parser.add_argument("--dir", type=Path, default=None, help="where run directories go")
    parser.add_argument("--write", action="store_true", help="write docs/reliability.md")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--hubs", type=int, default=1, help="hub processes (postgres only)")
    parser.add_argument("--pg", default=None, help="a PostgreSQL url for --store postgres")
    parser.add_argument(
        "--kill-replicas",
        action="store_true",
        help="replicas keep outboxes and are killed -9 (and started again) too",
    )
    args = parser.parse_args()
    server = None
    if args.store == "postgres" and args.pg is None:
        import pgserver

        found = pgserver.find_or_start()
        if isinstance(found, str):
            print(found, file=sys.stderr)
            return 2
        server, args.pg = found, found.dsn
    try:
        return await _main(args)
    finally:
        if server is not None:
            server.stop()


async def _main(args: argparse.Namespace) -> int:
    base = args.dir or Path(tempfile.mkdtemp(prefix="convsync-chaos-"))
    totals: Counter[str] = Counter()  # updated by every seed as it finishes
    faults: Counter[str] = Counter()
    failed: list[int] = []
    started = time.monotonic()
    gate = asyncio.Semaphore(args.jobs)

    async def one(seed: int) -> None:
        async with gate:
            await run_seed(seed)

    async def run_seed(seed: int) -> None:
        run_dir = base / f"seed-{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        chaos = Chaos(
            seed,
            replicas=args.replicas,
            ops=args.ops,
            kills=not args.no_kills,
            store=args.store,
            hubs=args.hubs,
            dsn=args.pg,
            kill_replicas=args.kill_replicas,
        )
        try:
            report = await run(chaos, run_dir)
            problems = report.problems
        except Exception as exc:  # a hang or a crash is a failure of that seed too
            problems = [f"harness: {type(exc).__name__}: {exc}"]
            report = None
        totals.update(seeds=1)
        if report is not None:
            totals.update(
                operations=report.operations,
                acknowledged=report.acknowledged,
                log_records=report.log_records,
                conflicts=report.conflicts,
                lost=report.lost,
                duplicates=report.duplicates,
                overwritten=report.overwritten,
                tokens=report.tokens,
                edit_conflicts=report.edit_conflicts,
                approvals_asked=report.approvals_asked,
                approvals_decided=report.approvals_decided,
                decided_twice=report.decided_twice,
                answers=report.answers,
                answers_duplicated=report.answers_duplicated,
                diverged=sum(p.startswith("diverged") for p in report.problems),
            )
            faults.update(report.faults)
        if problems:
            failed.append(seed)
            print(f"seed {seed} FAILED: {problems}; run dir {run_dir}", flush=True)
            where = f" --store {args.store} --hubs {args.hubs}" if args.store != "sqlite" else ""
            where += " --kill-replicas" if args.kill_replicas else ""
            print(
                f"  reproduce: python tests/chaos/run.py --seeds {seed}:{seed + 1}{where}",
                flush=True,
            )
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            injected = len(report.faults) if report is not None else 0
            print(f"seed {seed} ok ({injected} faults)", flush=True)

    await asyncio.gather(*(one(seed) for seed in args.seeds))
    elapsed = time.monotonic() - started
    summary = {**totals, "failed": len(failed), "seconds": round(elapsed)}
    print(summary, dict(faults))
    if args.write:
        _write(args, summary, faults, failed)
    return 1 if failed else 0


def _write(
    args: argparse.Namespace, summary: dict[str, int], faults: Counter[str], failed: list[int]
) -> None:
    sys.path.insert(0, str(ROOT))
    from bench._report import machine, now

    command = " ".join(["python", "tests/chaos/run.py", *sys.argv[1:]])
    title = "## Chaos" if args.store == "sqlite" else "## Chaos on PostgreSQL"
    if args.kill_replicas:
        title += " with replica kills" if args.store == "sqlite" else ", with replica kills"
    hubs = "" if args.store == "sqlite" else f", {args.hubs} hub processes on one database"
    lines = [
        title,
        "",
        f"Command: `{command}` ({now()}, {machine()}).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| seeds run | {summary.get('seeds', 0)} (replicas per seed: {args.replicas}, "
        f"edits per replica: {args.ops}{hubs}"
        + (", each replica with an outbox, replicas killed -9 too" if args.kill_replicas else "")
        + ") |",
        f"| faults injected | {sum(faults.values())}: "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items()))
        + " |",
        f"| edits made | {summary.get('operations', 0)} |",
        f"| records acknowledged | {summary.get('acknowledged', 0)} |",
        f"| records in the logs | {summary.get('log_records', 0)} |",
        f"| acknowledged records lost | {summary.get('lost', 0)} |",
        f"| duplicates | {summary.get('duplicates', 0)} |",
        f"| conflicts surfaced | {summary.get('conflicts', 0)} "
        f"(`edited`: {summary.get('edit_conflicts', 0)}) |",
        f"| concurrent-edit tokens in the logs | {summary.get('tokens', 0)} |",
        f"| acknowledged edits silently overwritten | {summary.get('overwritten', 0)} |",
        f"| approvals asked / decided | {summary.get('approvals_asked', 0)} / "
        f"{summary.get('approvals_decided', 0)} |",
        f"| approvals decided twice | {summary.get('decided_twice', 0)} |",
        f"| workers' answers after a decision, landed | {summary.get('answers', 0)} |",
        f"| assistant messages duplicated after an approval "
        f"| {summary.get('answers_duplicated', 0)} |",
        f"| replicas not converged | {summary.get('diverged', 0)} |",
        f"| failed seeds | {len(failed)} {failed if failed else ''} |",
        f"| wall time | {summary['seconds']} s |",
        "",
    ]
    path = ROOT / "docs" / "reliability.md"
    text = path.read_text() if path.exists() else "# Reliability\n\n"
    head, sep, rest = text.partition(title + "\n")
    tail = rest[rest.find("\n## ") + 1 :] if sep and "\n## " in rest else ""
    path.write_text(head.rstrip() + "\n\n" + "\n".join(lines) + ("\n" + tail if tail else ""))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

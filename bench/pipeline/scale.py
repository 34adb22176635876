"""How big a history each checker handles on this machine: wall time and peak memory.

    python bench/pipeline/scale.py --events 10000000 --checker spark --checker arrow --checker reference
    python bench/pipeline/scale.py --events 100000000 --checker spark --master 'local[2]'

A synthetic history of about N events (publish, confirm, deliver and ack of N/4 messages
over 8 queues, with a few defects and two fault windows) is generated once under
--work-dir and reused. Each checker then runs in its own process, watched by a sampler
that adds up the resident memory of that process and all its children (the JVM), and
its findings are compared with the injected truth. Checkers:

- spark: the `hutch check` job (`hutch.pipeline.check.SparkCheck`), results written as Parquet;
- reference: the pure-Python reference checker (`hutch.pipeline.reference`);
- arrow: a pandas/pyarrow rendering of the main counts (published, confirmed, delivered,
  lost, duplicates, unexpected, reordered), for the crossover with Spark.

Results are printed as a table and appended as JSON lines to --results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil

QUEUES = 8
PUBLISHERS = 4
CONSUMERS = 4


def spec_for(events: int):
    from hutch.pipeline.synth import Defects, Fault, SynthSpec

    per_publisher = max(1000, events // (4 * QUEUES * PUBLISHERS))
    duration_s = per_publisher / 2000.0
    return SynthSpec(
        run_id=f"scale-{events}", queues=QUEUES, publishers_per_queue=PUBLISHERS, consumers_per_queue=CONSUMERS,
        messages_per_publisher=per_publisher, rate_per_publisher=2000.0,
        faults=(Fault("kill-node1", duration_s * 0.3, 2.0), Fault("partition", duration_s * 0.7, 3.0)),
        defects=Defects(lost=10, dup_flagged=10, dup_unflagged=5, reordered=10, unexpected=5, nacked=4, unconfirmed=4),
        seed=42,
    )


def ensure_history(work: Path, events: int) -> tuple[Path, dict]:
    from hutch.pipeline.synth import generate

    d = work / f"history-{events}"
    meta = d / "_truth.json"
    if meta.exists():
        return d, json.loads(meta.read_text())
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    truth = generate(spec_for(events), d, rows_per_file=1_000_000)
    info = {"rows": truth.rows, "files": truth.files, "generate_s": round(time.monotonic() - t0, 1),
            "bytes": sum(p.stat().st_size for p in d.glob("*.parquet")),
            "queues": {q: {k: v for k, v in t.__dict__.items() if k not in ("lost_ids", "lost_by_window")}
                       for q, t in truth.queues.items()}}
    meta.write_text(json.dumps(info))
    return d, info


def arrow_check(directory: Path) -> dict:
    """The main counts with pyarrow group-bys and a pandas sort for reorders."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from hutch.pipeline.history import read_history

    t = read_history(directory).select(["run_id", "queue", "op", "msg_id", "redelivered", "client_id", "client_seq"])
    t = t.filter(pc.is_valid(t["msg_id"]))
    out: dict[str, dict] = {}
    keys = ["run_id", "queue", "msg_id"]
    per_op = {}
    for op in ("publish", "confirm", "return", "deliver"):
        sub = t.filter(pc.equal(t["op"], op))
        per_op[op] = sub.group_by(keys).aggregate([("msg_id", "count")]).rename_columns(keys + [f"n_{op}"])
    msgs = per_op["publish"]
    for op in ("confirm", "return", "deliver"):
        msgs = msgs.join(per_op[op], keys, join_type="full outer")
    df = msgs.to_pandas()
    df = df.fillna(0)
    for q, g in df.groupby("queue"):
        out[q] = {
            "published": int((g.n_publish > 0).sum()),
            "confirmed": int((g.n_confirm > 0).sum()),
            "delivered": int((g.n_deliver > 0).sum()),
            "lost": int(((g.n_confirm > 0) & (g.n_return == 0) & (g.n_deliver == 0)).sum()),
            "duplicates": int((g.n_deliver - 1).clip(lower=0).sum()),
            "unexpected": int(((g.n_deliver > 0) & (g.n_publish == 0)).sum()),
        }
    d = t.filter(pc.and_(pc.equal(t["op"], "deliver"), pc.invert(pc.fill_null(t["redelivered"], False))))
    d = d.append_column("publisher", pc.shift_right(d["msg_id"], pa.scalar(32, pa.int64())))
    d = d.append_column("seq", pc.bit_wise_and(d["msg_id"], pa.scalar(2**32 - 1, pa.int64())))
    pdf = d.select(["queue", "client_id", "publisher", "client_seq", "seq"]).to_pandas()
    pdf = pdf.sort_values(["queue", "client_id", "publisher", "client_seq"])
    same = (pdf.queue == pdf.queue.shift()) & (pdf.client_id == pdf.client_id.shift()) & (pdf.publisher == pdf.publisher.shift())
    desc = same & (pdf.seq < pdf.seq.shift())
    for q, n in desc.groupby(pdf.queue).sum().items():
        out[q]["reordered"] = int(n)
    return out


def _run_checker(checker: str, directory: str, out_dir: str, master: str, result_path: str) -> None:
    t0 = time.monotonic()
    if checker == "spark":
        from hutch.pipeline.check import SparkCheck, history_bytes
        from hutch.pipeline.spark import session

        size = history_bytes(Path(directory))
        spark = session(master=master, shuffle_partitions=max(4, min(200, size // (32 * 1024 * 1024))),
                        driver_memory=os.environ.get("HUTCH_BENCH_DRIVER_MEMORY", "6g"), quick_jvm=False)
        t_session = time.monotonic() - t0
        job = SparkCheck(spark, directory)
        f = job.run()
        job.write_tables(Path(out_dir))
        job.close()
        spark.stop()
        counts = {q: s for q, s in f.summary["queues"].items()}
        extra = {"session_s": round(t_session, 1), "steps_s": job.timings_s}
    elif checker == "reference":
        from hutch.pipeline.reference import check_history

        counts = check_history(directory).summary["queues"]
        extra = {}
    else:
        counts = arrow_check(Path(directory))
        extra = {}
    Path(result_path).write_text(json.dumps({"wall_s": round(time.monotonic() - t0, 1), "counts": counts, **extra},
                                            default=str))


def measure(checker: str, directory: Path, out_dir: Path, master: str) -> dict:
    result_path = out_dir / f"{checker}.json"
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_run_checker, args=(checker, str(directory), str(out_dir), master, str(result_path)))
    peak = [0]
    t0 = time.monotonic()
    p.start()
    stop = threading.Event()

    def sample():
        proc = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            stop.wait(0.25)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    p.join()
    stop.set()
    th.join()
    wall = time.monotonic() - t0
    if p.exitcode != 0:
        return {"checker": checker, "ok": False, "exitcode": p.exitcode, "process_s": round(wall, 1)}
    r = json.loads(result_path.read_text())
    return {"checker": checker, "ok": True, "process_s": round(wall, 1), "peak_rss_mb": round(peak[0] / 2**20),
            **{k: v for k, v in r.items() if k != "counts"}, "counts": r["counts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--checker", action="append", choices=["spark", "reference", "arrow"])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/hutch-bench-pipeline"))
    ap.add_argument("--results", type=Path, default=Path(__file__).with_name("results.jsonl"))
    args = ap.parse_args()
    checkers = args.checker or ["spark", "arrow", "reference"]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    directory, info = ensure_history(args.work_dir, args.events)
    print(f"history: {info['rows']:,} events in {info['files']} files, {info['bytes'] / 2**20:.0f} MiB "
          f"(generated in {info.get('generate_s')} s)", flush=True)
    for checker in checkers:
        out = args.work_dir / f"out-{args.events}-{checker}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        r = measure(checker, directory, out, args.master)
        agree = None
        if r["ok"]:
            agree = all(r["counts"][q][k] == v for q, t in info["queues"].items() for k, v in t.items()
                        if k in r["counts"][q])
        row = {"events": info["rows"], "checker": checker, "master": args.master if checker == "spark" else None,
               "cpus": os.cpu_count(), **{k: v for k, v in r.items() if k != "counts"}, "matches_truth": agree,
               "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        print(json.dumps(row), flush=True)
        with args.results.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""The Spark job against the reference checker and against the injected defects."""

from __future__ import annotations

import json

import pytest

from hutch.pipeline.check import SparkCheck
from hutch.pipeline.reference import check_history
from hutch.pipeline.synth import generate

from .scenarios import SCENARIOS, assert_matches_truth

pytestmark = pytest.mark.spark


def _plain(x):
    return json.loads(json.dumps(x, default=str))


def _spark_findings(spark, directory, gap_ms=1000.0):
    job = SparkCheck(spark, directory, gap_ms=gap_ms, examples_max=100_000)
    try:
        return job.run()
    finally:
        job.close()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_spark_job_and_reference_agree_and_find_the_injected_defects(spark, name, tmp_path):
    truth = generate(SCENARIOS[name], tmp_path, rows_per_file=4000)
    got = _spark_findings(spark, tmp_path)
    ref = check_history(tmp_path)

    assert _plain(got.summary) == _plain(ref.summary)  # every count, gap field, window and percentile
    assert [g.as_row() for g in got.gaps] == [g.as_row() for g in ref.gaps]
    assert got.throughput == sorted(ref.throughput, key=lambda r: (r["run_id"], r["queue"], r["second"], r["op"]))

    def by_key(rows):
        return sorted(rows, key=lambda r: (r["run_id"], r["queue"], r["second"], r["kind"]))

    assert by_key(got.latency) == by_key(ref.latency)
    for table in ("lost", "duplicates", "unexpected", "reorders"):
        key = ("run_id", "queue", "msg_id", "client_seq") if table == "reorders" else ("run_id", "queue", "msg_id")
        assert sorted(tuple(r[k] for k in key) for r in getattr(got, table)) == sorted(
            tuple(r[k] for k in key) for r in getattr(ref, table)), table

    lost = {}
    for r in got.lost:
        lost.setdefault(r["queue"], set()).add(r["msg_id"])
    assert_matches_truth(got.summary, lost, got.gaps, truth)


def test_several_runs_in_one_directory_are_checked_apart(spark, tmp_path):
    a = generate(SCENARIOS["losses_in_a_failover"], tmp_path / "a")
    b = generate(SCENARIOS["clean"], tmp_path / "b")
    # results of an earlier check (hutch check's default --out) and a file being written are not history
    import shutil

    for hidden in ("_check/lost.parquet", ".incoming"):
        (tmp_path / hidden).mkdir(parents=True)
        shutil.copy(sorted((tmp_path / "a").glob("pub-*.parquet"))[0], tmp_path / hidden / "part-0.parquet")
    got = _spark_findings(spark, tmp_path)
    assert set(got.summary["runs"]) == {a.run_id, b.run_id}
    assert got.summary["runs"][a.run_id]["queues"]["q0"]["lost"] == 7
    assert got.summary["runs"][b.run_id]["queues"]["q0"]["lost"] == 0
    assert got.summary["queues"]["q0"]["lost"] == 7 and got.summary["queues"]["q0"]["runs"] == 2
    assert got.summary["runs"][a.run_id]["queues"]["q0"]["published"] == a.queues["q0"].published

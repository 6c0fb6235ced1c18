"""Fleet questions in SQL: DuckDB reads a converted run directory (hive-partitioned Parquet) straight from disk
and answers "peak active bytes per rank" and "top categories across ranks" as `ranks` does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze.cli import main
from snapanalyze.layout import PEAK_TABLE
from snapanalyze.session import compare_ranks

duckdb = pytest.importorskip("duckdb")
TP2 = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "tp2_vision_encoder"

PEAK_PER_RANK = """
SELECT rank, max(active_bytes) AS peak_active_bytes
FROM read_parquet('{run}/rank=*/tag=final/peak_categories.parquet', hive_partitioning = true)
GROUP BY rank ORDER BY rank
"""
TOP_CATEGORIES = """
SELECT category, sum(bytes) AS bytes, count(DISTINCT rank) AS ranks
FROM read_parquet('{run}/rank=*/tag=final/peak_categories.parquet', hive_partitioning = true)
GROUP BY category ORDER BY bytes DESC, category
"""
EVENTS_PER_RANK = """
SELECT rank, count(*) AS events, sum(size) FILTER (WHERE action = 'alloc') AS allocated
FROM read_parquet('{run}/rank=*/tag=final/events.parquet', hive_partitioning = true)
GROUP BY rank ORDER BY rank
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = Path(shutil.copytree(TP2, tmp_path_factory.mktemp("sql") / "run"))
    result = CliRunner().invoke(main, ["convert", str(run), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    return run


def test_peak_active_bytes_per_rank_in_sql_equal_ranks(converted: Path) -> None:
    rows = duckdb.sql(PEAK_PER_RANK.format(run=converted)).fetchall()
    table = compare_ranks(converted).table
    assert rows == [(int(r.rank), int(r.active_bytes)) for r in table.itertuples()]
    assert len(rows) == 2 and rows[1][1] > rows[0][1]              # rank 1 is the outlier


def test_top_categories_across_ranks_in_sql_equal_the_comparison(converted: Path) -> None:
    rows = duckdb.sql(TOP_CATEGORIES.format(run=converted)).fetchall()
    cats = compare_ranks(converted).categories
    expected = cats.groupby("category")["bytes"].agg(["sum", "count"]).reset_index()
    expected = sorted(((str(c), int(s), int(n)) for c, s, n in expected.itertuples(index=False)),
                      key=lambda r: (-r[1], r[0]))
    assert [(c, int(b), int(n)) for c, b, n in rows] == expected
    assert rows[0][0] == "kv_cache" and ("vision_encoder", 1) in {(c, n) for c, _, n in rows}


def test_the_raw_tables_answer_too_and_every_rank_has_its_peak_table(converted: Path) -> None:
    assert sorted(p.parent.parent.name for p in converted.glob(f"rank=*/tag=final/{PEAK_TABLE}")) == \
        ["rank=0", "rank=1"]
    rows = duckdb.sql(EVENTS_PER_RANK.format(run=converted)).fetchall()
    assert [r[0] for r in rows] == [0, 1] and all(events > 0 and allocated > 0 for _, events, allocated in rows)

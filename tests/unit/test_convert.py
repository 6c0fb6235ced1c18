"""`snapanalyze convert`: where each input goes, refusal to overwrite (and to write outside the output or onto
what it did not write), and identical CLI answers."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze import UsageError
from snapanalyze.cli import main
from snapanalyze.session.convert import convert_plan

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"
FILE = REAL / "cs336-step-user-metadata-t2.11.pickle"


def test_plan_names_rank_and_tag(tmp_path):
    assert convert_plan([str(FILE)], str(tmp_path), None, None, False) == [
        (FILE, tmp_path / "rank=0" / "tag=cs336-step-user-metadata-t2.11")]
    assert convert_plan([str(FILE)], str(tmp_path), 3, "after", False) == [
        (FILE, tmp_path / "rank=3" / "tag=after")]
    with pytest.raises(UsageError, match="give -o"):
        convert_plan([str(FILE)], None, None, None, False)
    with pytest.raises(UsageError, match="single input"):
        convert_plan([str(FILE), str(FILE)], str(tmp_path), 1, None, False)
    with pytest.raises(UsageError, match="would be written to"):
        convert_plan([str(FILE), str(FILE)], str(tmp_path), None, None, False)


def test_cli_convert_then_analyse_run_gives_the_same_json(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["convert", str(FILE), "-o", str(tmp_path / "run"), "--tag", "final"])
    assert out.exit_code == 0, out.output
    for command in (["peaks"], ["attribute", "--explain"]):
        a = json.loads(runner.invoke(main, [*command, str(FILE), "--format", "json"]).output)
        b = json.loads(runner.invoke(main, [*command, str(tmp_path / "run"), "--format", "json"]).output)
        a.pop("source"), b.pop("source")
        assert a == b
    again = runner.invoke(main, ["convert", str(FILE), "-o", str(tmp_path / "run"), "--tag", "final"])
    assert again.exit_code == 2 and "already exists (use --force" in again.output


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapanalyze: error: ") and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("tag", ["../../../../x", "../x", "a/b", "..", ".hidden", "/abs", "x" * 129])
def test_a_path_traversal_tag_is_refused_and_nothing_is_written(tmp_path, tag):
    work = tmp_path / "a" / "b" / "c" / "d"
    work.mkdir(parents=True)
    before = _tree(tmp_path)
    result = CliRunner().invoke(main, ["convert", str(FILE), "-o", str(work / "out"), "--tag", tag])
    assert "--tag: snapshot tag" in _one_error_line(result) and "is not usable in a file name" in result.stderr
    assert _tree(tmp_path) == before


def test_tags_from_file_names_are_made_safe_and_engine_names_give_the_rank(tmp_path):
    odd = tmp_path / "in" / "..we ird;name!.pickle"
    odd.parent.mkdir()
    odd.write_bytes(FILE.read_bytes())
    assert convert_plan([str(odd)], str(tmp_path / "run"), None, None, False) == [
        (odd, tmp_path / "run" / "rank=0" / "tag=we_ird_name_")]
    sglang = tmp_path / "in" / "1758551300.159891-TP-3-memory-prefill.pickle"
    titan = tmp_path / "in" / "iteration_10" / "rank5_memory_snapshot.pickle"
    assert convert_plan([str(sglang)], str(tmp_path / "run"), None, None, False) == [
        (sglang, tmp_path / "run" / "rank=3" / "tag=1758551300.159891-prefill")]
    assert convert_plan([str(titan)], str(tmp_path / "run"), None, None, False) == [
        (titan, tmp_path / "run" / "rank=5" / "tag=iteration_10")]
    with pytest.raises(UsageError, match="no tag can be made from the file name"):
        convert_plan([str(tmp_path / "in" / "....pickle")], str(tmp_path / "run"), None, None, False)
    with pytest.raises(UsageError, match="--rank: -1 is not a rank"):
        convert_plan([str(FILE)], str(tmp_path / "run"), -1, None, False)


def test_force_never_replaces_a_fifo_or_what_convert_did_not_write(tmp_path):
    out = tmp_path / "run"
    (out / "rank=0").mkdir(parents=True)
    os.mkfifo(out / "rank=0" / "tag=final")
    result = CliRunner().invoke(main, ["convert", str(FILE), "-o", str(out), "--tag", "final", "--force"])
    assert "rank=0/tag=final: is a FIFO, not tables `snapanalyze convert` wrote" in _one_error_line(result)
    assert stat.S_ISFIFO((out / "rank=0" / "tag=final").lstat().st_mode)
    (out / "rank=0" / "tag=mine").mkdir()
    (out / "rank=0" / "tag=mine" / "notes.txt").write_text("keep")
    result = CliRunner().invoke(main, ["convert", str(FILE), "-o", str(out), "--tag", "mine", "--force"])
    assert "is a directory without snapshot.json, not tables" in _one_error_line(result)
    assert (out / "rank=0" / "tag=mine" / "notes.txt").read_text() == "keep"
    # converted tables are replaced, and nothing is left beside them
    for _ in range(2):
        done = CliRunner().invoke(main, ["convert", str(FILE), "-o", str(out), "--tag", "t", "--force"])
        assert done.exit_code == 0, done.output
    assert sorted(p.name for p in (out / "rank=0").iterdir()) == ["tag=final", "tag=mine", "tag=t"]


def test_an_output_that_is_not_a_directory_is_refused(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    assert "is a FIFO, not a directory: -o names the run directory" in _one_error_line(
        CliRunner().invoke(main, ["convert", str(FILE), "-o", str(fifo)]))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank=0").write_text("a file where the rank directory goes")
    assert "run/rank=0: is a regular file, not a directory" in _one_error_line(
        CliRunner().invoke(main, ["convert", str(FILE), "-o", str(tmp_path / "run")]))

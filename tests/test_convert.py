"""`snapanalyze convert`: where each input goes, refusal to overwrite, and identical CLI answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze import UsageError
from snapanalyze.cli import main
from snapanalyze.load.convert import convert_plan

REAL = Path(__file__).parent.parent / "fixtures" / "real"
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

"""Rank detection: torch.distributed, then RANK/LOCAL_RANK/WORLD_SIZE, then rank 0 of 1."""

from __future__ import annotations

import pytest

from snapanalyze.collect import CollectorError
from snapanalyze.collect.rank import RankInfo, detect_rank


@pytest.mark.parametrize(
    ("env", "dist", "expected"),
    [
        ({}, None, RankInfo(0, 1, None, "default")),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, None, RankInfo(3, 8, 1, "env")),
        ({"LOCAL_RANK": "2"}, None, RankInfo(2, None, 2, "env")),
        ({"RANK": " 1 "}, None, RankInfo(1, None, None, "env")),
        ({"RANK": "", "WORLD_SIZE": "4"}, None, RankInfo(0, 4, None, "default")),
        ({"RANK": "3", "WORLD_SIZE": "8"}, (5, 16), RankInfo(5, 16, None, "torch.distributed")),
    ],
)
def test_detect_rank(env: dict[str, str], dist: tuple[int, int] | None, expected: RankInfo) -> None:
    assert detect_rank(env, dist) == expected


@pytest.mark.parametrize(
    "env", [{"RANK": "one"}, {"RANK": "-1"}, {"WORLD_SIZE": "x"}, {"RANK": "4", "WORLD_SIZE": "4"}]
)
def test_bad_environment_is_a_collector_error(env: dict[str, str]) -> None:
    with pytest.raises(CollectorError, match="RANK|WORLD_SIZE"):
        detect_rank(env)

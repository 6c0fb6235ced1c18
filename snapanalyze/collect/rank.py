"""Which rank this process is, decided once when a recording starts.

Order: an initialised ``torch.distributed`` process group (its rank and world size) wins; otherwise the
launcher's environment (``RANK``, else ``LOCAL_RANK``; ``WORLD_SIZE``), as torchrun, accelerate and most
engines set it; otherwise rank 0 of a world of 1. A variable that is set but not a non-negative integer is a
`CollectorError` (a typo would otherwise make every rank write into ``rank=0``). Pure: the caller passes
the environment and the distributed probe's answer, so nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import CollectorError

RankSource = Literal["torch.distributed", "env", "default"]


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job. `world_size` is None when RANK is set but WORLD_SIZE is not."""

    rank: int
    world_size: int | None
    local_rank: int | None
    source: RankSource


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise CollectorError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < 0:
        raise CollectorError(f"environment variable {name}={raw!r} is negative")
    return value


def detect_rank(env: Mapping[str, str], distributed: tuple[int, int] | None = None) -> RankInfo:
    """Rank and world size from `distributed` ((rank, world) of an initialised group, or None), else `env`."""
    local_rank = _env_int(env, "LOCAL_RANK")
    if distributed is not None:
        dist_rank, dist_world = distributed
        return RankInfo(rank=dist_rank, world_size=dist_world, local_rank=local_rank, source="torch.distributed")
    env_rank = _env_int(env, "RANK")
    world = _env_int(env, "WORLD_SIZE")
    rank = env_rank if env_rank is not None else local_rank
    if rank is None:
        return RankInfo(rank=0, world_size=1 if world is None else world, local_rank=None, source="default")
    if world is not None and rank >= world:
        raise CollectorError(f"RANK={rank} is not below WORLD_SIZE={world}")
    return RankInfo(rank=rank, world_size=world, local_rank=local_rank, source="env")

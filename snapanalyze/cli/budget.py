"""`snapanalyze budget`: a serving engine's memory budget against the peaks measured at real batch shapes."""

from __future__ import annotations

from typing import Any

import click

from ..analyze.budget import BudgetCheck
from ..analyze.capacity import DRIVER_ORDER
from ..engine_config import ENGINES, EngineConfig
from ..errors import UsageError
from ..report.budget_documents import budget_document
from ..report.budget_terminal import render_budget
from ..session import budget_of
from . import main
from .common import (
    SIZE,
    device_option,
    echo_text,
    emit_json,
    format_option,
    rules_for,
    rules_option,
    source_for,
    source_option,
    terminal_width,
)
from .parallel import executor, parallel_options
from .progress import Progress

# option → figure; sizes take a unit (80GiB), the rest are plain numbers
FIGURE_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "total": ("total_bytes", SIZE, "The device's memory, e.g. 79.19GiB (vLLM V1 does not log it at INFO)."),
    "gpu_memory_utilization": ("utilization", click.FloatRange(0, 1, min_open=True), "vLLM's setting."),
    "mem_fraction_static": ("mem_fraction_static", click.FloatRange(0, 1, min_open=True), "SGLang's setting."),
    "weights": ("weights_bytes", SIZE, "The model's weights."),
    "activation_peak": ("activation_peak_bytes", SIZE,
                        "vLLM's profiled activation peak ('torch peak memory increase', DEBUG log)."),
    "non_torch": ("non_torch_bytes", SIZE, "Memory outside PyTorch the engine measured."),
    "kv_cache": ("kv_cache_bytes", SIZE, "The KV cache pool."),
    "kv_cache_tokens": ("kv_cache_tokens", click.IntRange(1), "Tokens the KV cache pool holds."),
    "cuda_graph": ("cuda_graph_bytes", SIZE, "What CUDA graph capture took."),
    "free_at_start": ("free_after_startup_bytes", SIZE, "SGLang: device memory free when serving starts."),
    "max_num_batched_tokens": ("max_num_batched_tokens", click.IntRange(1), "vLLM's setting."),
    "max_num_seqs": ("max_num_seqs", click.IntRange(1), "vLLM's setting."),
    "chunked_prefill_size": ("chunked_prefill_size", click.IntRange(1), "SGLang's setting."),
    "max_running_requests": ("max_running_requests", click.IntRange(1), "SGLang's setting."),
}


def engine_options(func: Any) -> Any:
    """--engine-log, --engine and one option per budget figure (`FIGURE_OPTIONS`)."""
    for option, (_, kind, help_text) in reversed(FIGURE_OPTIONS.items()):
        func = click.option(f"--{option.replace('_', '-')}", option, type=kind, default=None,
                            help=help_text)(func)
    func = click.option("--engine", type=click.Choice(ENGINES), default=None,
                        help="The engine, when its figures are given as options rather than a log.")(func)
    return click.option("--engine-log", "engine_log", type=click.Path(dir_okay=False, path_type=str), default=None,
                        help="The engine's start-up log (vLLM V0/V1, SGLang): its budget lines are read.")(func)


def engine_config_of(engine_log: str | None, engine: str | None, options: dict[str, Any]) -> EngineConfig:
    """The engine's figures from --engine-log and the figure options (`FIGURE_OPTIONS`), each option named."""
    from ..session.inputs import engine_config

    figures = {FIGURE_OPTIONS[k][0]: v for k, v in options.items() if k in FIGURE_OPTIONS}
    given_as = {FIGURE_OPTIONS[k][0]: f"--{k.replace('_', '-')}" for k in FIGURE_OPTIONS}
    return engine_config(engine_log, engine, figures, given_as)


def measure_budget(config: EngineConfig, inputs: list[str], shape_from: str, rank: int | None, tag: str | None,
                   rules_file: str | None, device: int | None, driver: str | None, source: Any) -> BudgetCheck:
    """`session.budget_of` with progress shown and inputs measured in parallel."""
    with Progress() as progress:
        return budget_of(config, inputs, shape_from, rank, tag, rules_for(rules_file), device, driver, executor(),
                         progress.step, source)


def budget_of_input(path: str, engine_log: str, total: int | None, rank: int | None, tag: str | None,
                    rules_file: str | None, device: int | None, source: Any) -> BudgetCheck:
    """The budget check of one snapshot or run, shape aside (`check --engine-log`, `report --engine-log`)."""
    config = engine_config_of(engine_log, None, {"total": total})
    return measure_budget(config, [path], "none", rank, tag, rules_file, device, None, source)


@main.command()
@click.argument("inputs", nargs=-1, type=click.Path(dir_okay=True, path_type=str))
@engine_options
@click.option("--shape-from", "shape_from", default="filename", show_default=True,
              help="Where each input's shape comes from: filename (tokens=8192, chunk=2048, bs4), markers, "
                   "a manifest .csv (as `capacity` reads them), or none (each input's peak, no shape limit).")
@click.option("--driver", type=click.Choice(DRIVER_ORDER), default=None,
              help="Shape variable the forward pass is fitted against (default: the one that explains it best).")
@click.option("--explain", is_flag=True, help="Show where each figure came from and the arithmetic of each setting.")
@device_option("Device to measure (default: the one with the highest peak).")
@click.option("--rank", type=int, default=None, help="Rank in run directories.")
@click.option("--tag", default=None, help="Snapshot tag in run directories (default: final).")
@rules_option()
@format_option()
@source_option
@parallel_options
def budget(inputs: tuple[str, ...], engine_log: str | None, engine: str | None, shape_from: str,
           driver: str | None, explain: bool, device: int | None, rank: int | None, tag: str | None,
           rules_file: str | None, source: tuple[str, ...], fmt: str, **figures: Any) -> None:
    """Does the engine's memory budget cover the shapes you serve? Its budget (from --engine-log or options)
    beside the peaks measured in INPUTS (snapshots or runs at real batch shapes): per shape fits / exceeds by
    how much and with what, and the settings that would fit, with the KV tokens each leaves."""
    config = engine_config_of(engine_log, engine, figures)
    if not inputs and not shape_from.endswith(".csv"):
        raise UsageError("budget: give the snapshots or runs measured at real shapes")
    rules_for(rules_file)
    check = measure_budget(config, list(inputs), shape_from, rank, tag, rules_file, device, driver,
                           source_for(source))
    if fmt == "json":
        emit_json(budget_document(check))
        return
    width = terminal_width()
    echo_text(render_budget(check, explain, width), width)

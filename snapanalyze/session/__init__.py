"""The one layer that turns paths into data, for the commands (`cli/`) and the reports (`report/`); the
analyses below it (`analyze/`) take snapshots, timelines and tables, never a path.

Modules: `inputs` — one snapshot a user names with its rank's markers (`open_input`), the ranks of a run
directory (`run_ranks`), --source, an engine's log and a user's rules file (`load_rules`) read; `convert` —
which pickle becomes which tables directory (`convert_plan`); `runs` — a run read once (`open_run`), its
ranks compared, OOMs explained, sweeps, capacity and engine budgets measured (pandas); `estimate` — a program's
estimate (`collect.estimate`) written where the user asked, a sweep of them, the chunked-prefill check's. The
names below are imported on first use (PEP 562), so that `import snapanalyze.session.inputs` stays light.
"""

from typing import TYPE_CHECKING

from .. import lazy

_EXPORTS = {
    ".inputs": ("Input", "open_input", "RunRanks", "run_ranks", "source_index", "engine_config", "reading_limits",
                "load_rules"),
    ".convert": ("convert_plan",),
    ".runs": ("Run", "RankData", "open_run", "is_run_path", "RankTask", "LoadedRank", "rank_task", "measure_task",
              "compare_ranks", "Converted", "peak_table", "convert_file", "explain_path", "SweepInput",
              "sweep_inputs", "input_points", "measure_input", "sweep_points", "measure_sweep_inputs", "capacity",
              "budget", "budget_of"),
}
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and editors
    from .convert import convert_plan
    from .inputs import (
        Input,
        RunRanks,
        engine_config,
        load_rules,
        open_input,
        reading_limits,
        run_ranks,
        source_index,
    )
    from .runs import (
        Converted,
        LoadedRank,
        RankData,
        RankTask,
        Run,
        SweepInput,
        budget,
        budget_of,
        capacity,
        compare_ranks,
        convert_file,
        explain_path,
        input_points,
        is_run_path,
        measure_input,
        measure_sweep_inputs,
        measure_task,
        open_run,
        peak_table,
        rank_task,
        sweep_inputs,
        sweep_points,
    )

__all__ = [
    "Converted", "Input", "LoadedRank", "RankData", "RankTask", "Run", "RunRanks", "SweepInput", "budget",
    "budget_of", "capacity", "compare_ranks", "convert_file", "convert_plan", "engine_config", "explain_path",
    "input_points", "is_run_path", "load_rules", "measure_input", "measure_sweep_inputs", "measure_task", "open_input",
    "open_run", "peak_table", "rank_task", "reading_limits", "run_ranks", "source_index", "sweep_inputs",
    "sweep_points",
]

r"""Runs the rows of a table, each into its own workdir, and reports ours beside the paper's.

  python -m vitboot_jax.tools.sweep --table=cifar100          # rows, commands, the table so far
  python -m vitboot_jax.tools.sweep --table=cifar100 --root=workdirs/table1_c100 --run
  python -m vitboot_jax.tools.sweep --table=replication --root=workdirs/cpu_replication \
    --epochs=10 --seeds=0,1 --run             # or: bash launch/cpu_replication.sh ROOT 10 0,1
  python -m vitboot_jax.tools.sweep --table=cifar10 --markdown   # the paper's numbers only

A table is data: rows, each a config file with its args ("configs/<file>.py:<args>"), the models
whose final top-1 it reports, and the paper's top-1 of each (sweep/paper_results.py).
Tables (sweep/tables.py, the tables' data; sweep/runs.py runs their rows, sweep/report.py
reads the results into tables and figures; this module is the command line):
  * cifar10, cifar100 (paper Table 1), imagenet (Table 3), ablation (Tables 4 and 5): the paper's
    rows at the paper's scale. Every row names the recipe it runs ("recipe" column): the authors'
    code, which made the published numbers, unless labelled otherwise. Shared rows run twice: as
    the authors' code (align=none: one gradient of the summed losses) and as the paper's
    Algorithm 1 (align=pcgrad). ViT-B-Sparse runs twice: ViT-B with entmax (the paper's label
    and parameter count) and the authors' shipped config, which builds the ViT-S shape
    (288/6/9). tests/paper_recipes.py pins every row's resolved recipe.
  * replication: every method on one CPU-scale setting (configs/quickstart.py: 32-px CIFAR-10
    image folder, 10% of the training set per class, the quickstart ViT 144-d / 6 layers /
    9 heads / patch 4 and its agent, batch 64), equal epochs, seeds and flags for every row.
    DrLoc lambda 0.1 (DRLOC_LAMBDA): the DrLoc paper's value for grids the size of our 8x8.
  * replication_tokens16: the same at the paper's token grid (configs/cifar10_tokens16.py:
    patch 2, 16x16 tokens), the five methods and Table 4's joint rows.
  * mechanism: why the feature (hint) term costs the ViT at 8x8 tokens (the replication's
    setting and 5 epochs): the references (ViT alone, agent alone, official joint and shared,
    joint without the hint) and one joint row per explanation's switch (configs/common.py):
    teacher quality (the agent from the finished agent-alone run of the same seed, trained on or
    frozen: AGENT_RUN, so it runs after the agent row; the hint gated on the agent's running
    train top-1), timing (the hint early only), form and strength (the paper's Eq. 6, a linear
    projector, the last layers, a gradient-norm cap) and geometry (2-D pooling).
  * replication_224: the paper's own ViT-S and Agent-S rows (configs/vits_cifar10.py: 224 px,
    the official recipe) on the same 10% of CIFAR-10, with the dataset on the devices; run side
    by side on one accelerator by launch/rung3_224.sh, which sets the data and the epochs.
  * well_trained: does the agent help a well-trained ViT (the helps setting, 20 epochs): the
    helps references and teacher rows (the same commands, so their records are reused), the ViT
    alone with label smoothing and given teacher_corr's training compute (37 and 86 epochs,
    counted before any run: docs/results.md), and the same rows with recipe=deit (DeiT's
    augmentation and regularisation). Its report adds each row's training FLOPs
    (tools/train_compute.py, the teacher's run apart) and ROOT/compute.png.
  * baseline, teachers (and, once tables.py names the winners, baseline_schedule,
    baseline_methods and students): the small-data study, validation held out, one root
    (workdirs/small_data) so that rows reuse each other's runs: the ViT alone's screening grid
    G1-G7 at 100 epochs, the teachers (the agent, ResNet-20 and -56), the winner at 200 epochs,
    the seeds' methods on the winner, and the winner taught by the chosen
    teachers with the ViT alone at their compute; each writes its report files under its own
    prefix (ROOT/teachers_table.md, ...). paper_schedule_240: the 8x8-token rung's ViT, agent, joint
    and shared at the paper's 240 epochs (issue 83; on a GPU: launch/gpu_small_data.py).
  The replication tables read the CIFAR-10 image folder --data_dir and evaluate every epoch.

Every (row, seed) trains into ROOT/<run>_seed<S>, where <run> is the replication row's name or,
on paper tables, named after the config (rows with one config, e.g. the two models of a joint
run, share a run). Without --run the tool prints each run's command (runnable as printed from
the repository root) and the table so far from the final.json files that exist, so it reports
runs launched elsewhere (SLURM, TPU) too. With --run the missing runs train one after another
as subprocesses of `vitboot_jax.main`, all rows of the first seed before the next seed; a run
with a final.json is skipped, an interrupted one resumes. --rows limits what runs and is
printed (the table lists every row); --override adds a flag to every run alike.

Where ROOT exists, ROOT/table.md and ROOT/table.json (under the table's prefix, if any) get per row
and model the paper's top-1 and the mean and spread (sample std, min-max) of ours over the finished
seeds, the epochs, the training wall time (sum over seeds of final.json's `train_seconds_this_run`:
the training loop with its compilation and evaluations; marked (*) when a seed resumed, whose
steps before its last launch are timed from the rates the earlier launches logged) and the
commit; ROOT/curves.png gets the first seed's curves (tools/plot.py, needs matplotlib).

SIGTERM or Ctrl-C to a running sweep reaches the run in progress as SIGTERM: it saves its
checkpoint and exits, the sweep writes the table so far and exits with the run's code (143/130);
re-running the same command resumes. A run stopped by a signal sent to it alone stops the sweep
too, rather than counting as failed.
"""

from __future__ import annotations

import sys
import time

from absl import app, flags
from etils import epath

from vitboot_jax.tools.sweep import report as sweep_report
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import tables as sweep_tables

_FLAGS = {}


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  _FLAGS["table"] = flags.DEFINE_enum(
    "table",
    None,
    list(sweep_tables.TABLES),
    "Paper Table 1 (cifar10, cifar100), 3 (imagenet), 4-5 (ablation); CPU replications.",
  )
  _FLAGS["root"] = flags.DEFINE_string(
    "root", None, "Parent directory of the runs' workdirs and the table; default: the table's."
  )
  _FLAGS["run"] = flags.DEFINE_bool("run", False, "Run the missing (row, seed) workdirs first.")
  _FLAGS["seeds"] = flags.DEFINE_list(
    "seeds", None, "Seeds of every row (config.seed); default: the table's (paper: 0)."
  )
  _FLAGS["epochs"] = flags.DEFINE_integer(
    "epochs", None, "Training epochs of every row (replication tables; default 10)."
  )
  _FLAGS["data_dir"] = flags.DEFINE_string(
    "data_dir",
    sweep_runs.DEFAULT_DATA_DIR,
    "CIFAR-10 image folder (train/, test/) of the replication tables; relative: to the cwd.",
  )
  _FLAGS["rows"] = flags.DEFINE_list(
    "rows", [], "Rows (names or run names) to run and print; default all. The table has all."
  )
  _FLAGS["override"] = flags.DEFINE_multi_string(
    "override", [], "Extra flag for every run alike, e.g. --override=--config.data.dir=/data."
  )
  _FLAGS["markdown"] = flags.DEFINE_bool(
    "markdown", False, "Print --table's rows as markdown: published top-1, config, recipe."
  )
  flags.mark_flag_as_required("table")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  table = sweep_tables.TABLES[_FLAGS["table"].value]
  if _FLAGS["markdown"].value:
    if not table.paper:
      raise app.UsageError(f"table {table.name} has no published numbers")
    print(sweep_tables.rows_markdown(table), end="")
    return 0
  seeds = None if _FLAGS["seeds"].value is None else [int(x) for x in _FLAGS["seeds"].value]
  if seeds is not None and not seeds:
    raise app.UsageError("--seeds needs at least one seed")
  try:
    s = sweep_runs.settings(
      table,
      _FLAGS["root"].value,
      seeds,
      _FLAGS["epochs"].value,
      _FLAGS["data_dir"].value,
      _FLAGS["override"].value,
    )
    selected = sweep_tables.select_rows(table, _FLAGS["rows"].value)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  failed, stopped = [], None
  if _FLAGS["run"].value:
    start = time.perf_counter()
    try:
      failed = sweep_runs.run_missing(table, s, selected)
    except sweep_runs.Stopped as stop:
      stopped = stop
    print(f"sweep: {(time.perf_counter() - start) / 60:.1f} min wall time", flush=True)
  else:
    sweep_runs.print_commands(table, s, selected)
  report = sweep_report.build_report(table, s)
  root = sweep_runs.absolute(epath.Path(s.root))
  if root.exists():
    curves = sweep_report.plot_curves(table, s, s.seeds[0])
    report["curves"] = str(curves) if curves else None
    if table.compute:
      compute = sweep_report.plot_compute(report, root)
      report["compute_figure"] = str(compute) if compute else None
    validation = sweep_report.plot_validation(report, root)
    report["validation_figure"] = str(validation) if validation else None
    sweep_report.write_report(root, report)
    md, js = (
      root / f"{table.files}{name}" for name in (sweep_report.TABLE_MD, sweep_report.TABLE_JSON)
    )
    print(f"# Wrote {md} and {js}")
  print(sweep_report.table_markdown(report))
  if stopped is not None:
    print(f"sweep: {stopped}", file=sys.stderr)
    return stopped.exit_code
  if failed:
    print(f"{len(failed)} run(s) failed: {failed}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)

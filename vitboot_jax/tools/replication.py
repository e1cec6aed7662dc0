r"""CPU-scale replication of the paper's claim: every method on the same small CIFAR-10 setting.

  python -m vitboot_jax.tools.replication --root=workdirs/cpu_replication --epochs=10 \
    --seeds=0,1 --run                       # or: bash launch/cpu_replication.sh ROOT EPOCHS SEEDS
  python -m vitboot_jax.tools.replication --root=workdirs/cpu_replication   # commands + table

Setting (configs/quickstart.py; --config=configs/cifar10_tokens16.py for 16x16 tokens): the 32-px
CIFAR-10 image folder (--data_dir), 10% of the training set per class (5,000 images), the full test
set, the quickstart ViT (144-d, 6 layers, 9 heads, patch 4 -> 8x8 tokens) and agent, batch 64, AdamW
lr 1e-3, cosine; the same epochs, seeds and flags for every row. What differs between rows is the
method only, plus what a mode sets by itself in `configlib.set_mode` (the official per-mode values):
the loss weights, gradient clipping 0.1 of the ViT-alone worker, and MLP dropout 0.1 of the
standalone and joint agent (the official joint configs load the standalone agent config).

Rows (ROWS below): ViT alone, agent alone, joint, shared with Align (PCGrad, the paper's
Algorithm 1), shared without Align (summed gradients, as the official code), ViT + DrLoc, ViT
with impulse init, ViT with mimetic init, shared + DrLoc (on the ViT, with Align), and Table 4's
loss ablation in joint mode (KD only, feature term only, both without decay).
  * DrLoc lambda = 0.1 (DRLOC_LAMBDA): the DrLoc paper's value for T2T and CvT, whose 7x7 grid
    is the size of our unpooled 8x8 one (its ViT-B/16 value 0.01 is for a 768-d, 12-layer
    model whose 14x14 grid it pools); the l1 variant with unnormalised offsets, as its code.
  * Impulse init: impulse3, the 3x3 window, one of the 9 offsets per head of the 9 heads.

Every (row, seed) trains into ROOT/<row>_seed<S>. With --run the missing ones run one after
another as subprocesses of `vitboot_jax.main`, all rows of the first seed before the next seed,
so an interrupted replication still leaves a complete table for the first seed; a run with a
final.json is skipped and an interrupted one resumes. --rows limits what runs (the table always
lists every row); --override adds a flag to every run alike.

Then ROOT/table.md and ROOT/table.json get per row the mean and spread (sample std, min-max) of
the final-epoch ViT and agent top-1 over the finished seeds, the epochs, the training wall time
(sum over seeds of final.json's `train_seconds_this_run`: the training loop with its
compilation and evaluations, not the start-up before it; marked (*) when a seed resumed, as it then
counts only the steps after the resume) and the commit; ROOT/curves.png gets
the first seed's curves (tools/plot.py, needs matplotlib). Without --run only the commands and
the table so far are printed (and the files written if ROOT exists), so it also reports runs
launched elsewhere.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags

CONFIG = "configs/quickstart.py"
DEFAULT_DATA_DIR = "../shared/data/cifar10"
DEFAULT_EPOCHS = 10
DRLOC_LAMBDA = 0.1
TABLE_MD = "table.md"
TABLE_JSON = "table.json"
CURVES = "curves.png"
# The repository root: the config path and the default data dir are relative to it.
REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of the table: a quickstart config (args + flag overrides) and what it reports."""

  name: str  # Also the workdir prefix: ROOT/<name>_seed<S>.
  description: str
  args: str  # configs/quickstart.py args, without epochs (added for every row alike).
  overrides: tuple[str, ...] = ()  # Extra --config.* flags of this row.
  models: tuple[str, ...] = ("vit",)  # Whose final top-1 the row reports.


_PAIR = ("vit", "agent")
ROWS: tuple[Row, ...] = (
  Row("vit", "ViT alone", "mode=vit"),
  Row("agent", "agent alone", "mode=agent", models=("agent",)),
  Row("joint", "joint (ViT + agent, separate weights)", "mode=joint", models=("vit", "agent")),
  Row(
    "shared_align",
    "shared with Align (PCGrad)",
    "mode=shared",
    ("--config.align=pcgrad",),
    ("vit", "agent"),
  ),
  Row(
    "shared_noalign",
    "shared without Align (official: summed gradients)",
    "mode=shared",
    ("--config.align=none",),
    ("vit", "agent"),
  ),
  Row("vit_drloc", f"ViT + DrLoc (lambda {DRLOC_LAMBDA:g})", f"mode=vit,drloc={DRLOC_LAMBDA:g}"),
  Row("vit_impulse", "ViT, impulse init (3x3)", "mode=vit,init=impulse3"),
  Row("vit_mimetic", "ViT, mimetic init", "mode=vit,init=mimetic"),
  Row(
    "shared_drloc",
    f"shared with Align + DrLoc on the ViT (lambda {DRLOC_LAMBDA:g})",
    f"mode=shared,drloc={DRLOC_LAMBDA:g}",
    ("--config.align=pcgrad",),
    ("vit", "agent"),
  ),
  # Table 4's loss ablation in joint mode ("both" is the joint row).
  Row("joint_kd_only", "joint, KD only (no feature term)", "mode=joint,feature=0", models=_PAIR),
  Row("joint_feature_only", "joint, feature term only (no KD)", "mode=joint,kd=0", models=_PAIR),
  Row(
    "joint_no_decay",
    "joint, both terms, constant feature weight (No Decay)",
    "mode=joint,decay=none",
    models=_PAIR,
  ),
)
ROWS_BY_NAME = {row.name: row for row in ROWS}


def select_rows(names: Sequence[str] | None) -> list[Row]:
  """The rows named (all when empty), in table order; unknown names fail with the choices."""
  if not names:
    return list(ROWS)
  unknown = sorted(set(names) - set(ROWS_BY_NAME))
  if unknown:
    raise ValueError(f"unknown rows {unknown}; choose from {list(ROWS_BY_NAME)}")
  return [row for row in ROWS if row.name in set(names)]


def workdir(root: str | pathlib.Path, row: Row, seed: int) -> pathlib.Path:
  return pathlib.Path(root) / f"{row.name}_seed{seed}"


def command(
  row: Row,
  root: str | pathlib.Path,
  seed: int,
  epochs: int,
  data_dir: str,
  extra: Sequence[str] = (),
  config: str = CONFIG,
) -> list[str]:
  """The training command of (row, seed); run it from the repository root."""
  return [
    sys.executable,
    "-m",
    "vitboot_jax.main",
    f"--config={config}:{row.args},epochs={epochs}",
    f"--workdir={workdir(root, row, seed)}",
    f"--config.seed={seed}",
    f"--config.data.dir={data_dir}",
    "--config.eval_every_epochs=1",  # Curves per epoch (the quickstart evaluates every 3rd).
    *row.overrides,
    *extra,
  ]


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def spread(values: Sequence[float]) -> dict[str, Any] | None:
  """Mean, sample std (None for one value), min, max and n; None without values."""
  if not values:
    return None
  values = [float(v) for v in values]
  return {
    "mean": statistics.fmean(values),
    "std": statistics.stdev(values) if len(values) > 1 else None,
    "min": min(values),
    "max": max(values),
    "n": len(values),
    "values": values,
  }


def aggregate(
  root: str | pathlib.Path,
  rows: Sequence[Row],
  seeds: Sequence[int],
  epochs: int,
  config: str = CONFIG,
) -> list[dict[str, Any]]:
  """Per row: status and the statistics of the finished seeds' final.json (top-1 in %)."""
  out = []
  for row in rows:
    finals = {}
    started = []
    for seed in seeds:
      wd = workdir(root, row, seed)
      final = _read_json(wd / "final.json")
      if final is not None:
        finals[seed] = final
      elif wd.exists():
        started.append(seed)
    if len(finals) == len(seeds):
      status = "done"
    elif finals:
      status = f"partial ({len(finals)}/{len(seeds)} seeds)"
    elif started:
      status = "incomplete"
    else:
      status = "not run"
    run_epochs = sorted({float(f["epochs"]) for f in finals.values() if "epochs" in f})
    entry = {
      "name": row.name,
      "description": row.description,
      "config": f"{config}:{row.args},epochs={epochs}",
      "overrides": list(row.overrides),
      "status": status,
      "seeds_done": sorted(finals),
      "seeds_incomplete": started,
      "epochs": run_epochs,
      "epochs_match": all(math.isclose(e, epochs) for e in run_epochs),
      "train_seconds": sum(float(f.get("train_seconds_this_run", 0.0)) for f in finals.values()),
      # final.json times only the last run of a workdir, so a resumed seed's time is too short.
      "seeds_resumed": sorted(s for s, f in finals.items() if f.get("resumed_from_step", 0) > 0),
    }
    for model in ("vit", "agent"):
      values = [100.0 * f[f"top1_{model}"] for f in finals.values() if f"top1_{model}" in f]
      entry[f"top1_{model}"] = spread(values) if model in row.models else None
    out.append(entry)
  return out


def _format_top1(stats: dict[str, Any] | None, reported: bool) -> str:
  if not reported:
    return "—"
  if stats is None:
    return "not run"
  if stats["std"] is None:
    return f"{stats['mean']:.2f} (1 seed)"
  return f"{stats['mean']:.2f} ± {stats['std']:.2f} [{stats['min']:.2f}, {stats['max']:.2f}]"


def format_duration(seconds: float) -> str:
  minutes = round(seconds / 60)
  return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{seconds / 60:.1f} min"


def commit() -> str | None:
  """HEAD of the repository (read-only), or None outside a git checkout."""
  try:
    result = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    )
  except (OSError, subprocess.CalledProcessError):
    return None
  return result.stdout.strip() or None


def table_markdown(report: dict[str, Any]) -> str:
  """The table of `report` (as written to table.json) in Markdown."""
  lines = [
    "# CPU-scale replication (quickstart ViT + agent, CIFAR-10 10%, 32 px)",
    "",
    f"Epochs {report['epochs']:g}, seeds {report['seeds']}; top-1 (%) on the full test set: "
    "mean ± sample std [min, max] over the finished seeds. Training time: sum over seeds.",
    "",
    "| row | ViT top-1 | agent top-1 | status | seeds | epochs | train time | config |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in report["rows"]:
    epochs = ", ".join(f"{e:.3g}" for e in r["epochs"]) + ("" if r["epochs_match"] else " (!)")
    config = " ".join([r["config"].split(":", 1)[1], *r["overrides"]])
    duration = format_duration(r["train_seconds"]) + (" (*)" if r["seeds_resumed"] else "")
    lines.append(
      f"| {r['description']} | {_format_top1(r['top1_vit'], 'vit' in r['models'])} "
      f"| {_format_top1(r['top1_agent'], 'agent' in r['models'])} | {r['status']} "
      f"| {','.join(map(str, r['seeds_done'])) or '—'} | {epochs or '—'} "
      f"| {duration if r['seeds_done'] else '—'} | `{config}` |"
    )
  lines += [
    "",
    f"Total training time {format_duration(report['train_seconds'])}; commit "
    f"`{report['commit'] or 'unknown'}`; data `{report['data_dir']}`; "
    f"DrLoc lambda {report['drloc_lambda']:g}; generated {report['generated']}.",
  ]
  if report["extra_overrides"]:
    lines.append(f"Flags of every run: `{' '.join(report['extra_overrides'])}`.")
  if any(r["seeds_resumed"] for r in report["rows"]):
    lines.append(
      "(*) a seed of this row resumed from a checkpoint: its time counts only the steps after it."
    )
  if not all(r["epochs_match"] for r in report["rows"]):
    lines.append(f"(!) a finished run of this row trained other than {report['epochs']:g} epochs.")
  if report.get("curves"):
    lines += ["", f"![curves of seed {report['seeds'][0]}]({CURVES})"]
  return "\n".join(lines) + "\n"


def build_report(
  root: str | pathlib.Path,
  rows: Sequence[Row],
  seeds: Sequence[int],
  epochs: int,
  data_dir: str,
  extra: Sequence[str] = (),
  config: str = CONFIG,
) -> dict[str, Any]:
  """The content of table.json: the rows' statistics and the run's settings."""
  entries = aggregate(root, rows, seeds, epochs, config)
  for entry, row in zip(entries, rows):
    entry["models"] = list(row.models)
    entry["commands"] = [
      shlex.join(["python", *command(row, root, s, epochs, data_dir, extra, config)[1:]])
      for s in seeds
    ]
  return {
    "config": config,
    "epochs": epochs,
    "seeds": list(seeds),
    "data_dir": data_dir,
    "drloc_lambda": DRLOC_LAMBDA,
    "extra_overrides": list(extra),
    "commit": commit(),
    "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "train_seconds": sum(e["train_seconds"] for e in entries),
    "rows": entries,
    "curves": None,
  }


def plot_curves(root: pathlib.Path, rows: Sequence[Row], seed: int) -> pathlib.Path | None:
  """ROOT/curves.png over the rows' workdirs of `seed` that have logged; None if none."""
  runs = [(row.name, workdir(root, row, seed)) for row in rows]
  runs = [(name, wd) for name, wd in runs if (wd / "metrics.jsonl").exists()]
  if not runs:
    return None
  from vitboot_jax.tools import plot

  try:
    return plot.plot_runs(
      [wd for _, wd in runs],
      root / CURVES,
      labels=[name for name, _ in runs],
      title=f"CPU replication, seed {seed}",
    )
  except ModuleNotFoundError as error:
    if error.name != "matplotlib":
      raise
    print(f"warning: no {CURVES}: {error}", file=sys.stderr)
    return None


def write_report(root: pathlib.Path, report: dict[str, Any]) -> None:
  root.mkdir(parents=True, exist_ok=True)
  (root / TABLE_JSON).write_text(json.dumps(report, indent=2) + "\n")
  (root / TABLE_MD).write_text(table_markdown(report))


def run_missing(
  root: pathlib.Path,
  rows: Sequence[Row],
  seeds: Sequence[int],
  epochs: int,
  data_dir: str,
  extra: Sequence[str] = (),
  config: str = CONFIG,
) -> list[str]:
  """Trains every (row, seed) without a final.json, seed by seed; returns the failed workdirs."""
  failed = []
  for seed in seeds:
    for row in rows:
      wd = workdir(root, row, seed)
      if (wd / "final.json").exists():
        print(f"done already: {wd}", flush=True)
        continue
      cmd = command(row, root, seed, epochs, data_dir, extra, config)
      print(f"running: {shlex.join(['python', *cmd[1:]])}", flush=True)
      start = time.perf_counter()
      result = subprocess.run(cmd, cwd=REPO if (REPO / config).exists() else None, check=False)
      minutes = (time.perf_counter() - start) / 60
      if result.returncode:
        print(f"FAILED ({result.returncode}) after {minutes:.1f} min: {wd}", flush=True)
        failed.append(str(wd))
      else:
        print(f"finished in {minutes:.1f} min: {wd}", flush=True)
  return failed


_ROOT = None
_DATA_DIR = None
_EPOCHS = None
_SEEDS = None
_CONFIG = None
_ROWS = None
_RUN = None
_OVERRIDES = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _ROOT, _CONFIG, _DATA_DIR, _EPOCHS, _SEEDS, _ROWS, _RUN, _OVERRIDES
  _CONFIG = flags.DEFINE_string(
    "config", CONFIG, "Config file of every row (relative to the repository root)."
  )
  _ROOT = flags.DEFINE_string("root", None, "Parent directory of the runs' workdirs and the table.")
  _DATA_DIR = flags.DEFINE_string(
    "data_dir", DEFAULT_DATA_DIR, "CIFAR-10 image folder (train/, test/); relative: to the cwd."
  )
  _EPOCHS = flags.DEFINE_integer("epochs", DEFAULT_EPOCHS, "Training epochs of every row.")
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds of every row (config.seed).")
  _ROWS = flags.DEFINE_list(
    "rows", [], f"Rows to run or list (default: all; the table has all): {list(ROWS_BY_NAME)}."
  )
  _RUN = flags.DEFINE_bool("run", False, "Run the missing (row, seed) workdirs before reporting.")
  _OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra flag for every run alike, e.g. --override=--config.batch_size=128."
  )
  flags.mark_flag_as_required("root")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  root = pathlib.Path(os.path.abspath(_ROOT.value))
  data_dir = os.path.abspath(_DATA_DIR.value)  # Runs start in the repository root.
  seeds = [int(s) for s in _SEEDS.value]
  if not seeds:
    raise app.UsageError("--seeds needs at least one seed")
  rows = select_rows(_ROWS.value)
  extra = list(_OVERRIDES.value)
  failed = []
  if _RUN.value:
    start = time.perf_counter()
    failed = run_missing(root, rows, seeds, _EPOCHS.value, data_dir, extra, _CONFIG.value)
    print(f"replication: {(time.perf_counter() - start) / 60:.1f} min wall time", flush=True)
  else:
    print(f"# Commands (run from {REPO}):")
    for seed in seeds:
      for row in rows:
        cmd = command(row, root, seed, _EPOCHS.value, data_dir, extra, _CONFIG.value)
        print(shlex.join(["python", *cmd[1:]]))
    print()
  # The table and the figure always cover every row: --rows only limits what runs now.
  report = build_report(root, ROWS, seeds, _EPOCHS.value, data_dir, extra, _CONFIG.value)
  if root.exists():
    curves = plot_curves(root, ROWS, seeds[0])
    report["curves"] = str(curves) if curves else None
    write_report(root, report)
    print(f"# Wrote {root / TABLE_MD} and {root / TABLE_JSON}")
  print(table_markdown(report))
  if failed:
    print(f"{len(failed)} run(s) failed: {failed}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)

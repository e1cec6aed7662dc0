r"""Runs the rows of a table, each into its own workdir, and reports ours beside the paper's.

  python -m vitboot_jax.tools.sweep --table=cifar100          # rows, commands, the table so far
  python -m vitboot_jax.tools.sweep --table=cifar100 --root=workdirs/table1_c100 --run
  python -m vitboot_jax.tools.sweep --table=replication --root=workdirs/cpu_replication \
    --epochs=10 --seeds=0,1 --run             # or: bash launch/cpu_replication.sh ROOT 10 0,1
  python -m vitboot_jax.tools.sweep --table=cifar10 --markdown   # the paper's numbers only

A table is data: rows, each a config file with its args ("configs/<file>.py:<args>"), the models
whose final top-1 it reports, and the paper's top-1 of each (vitboot_jax/paper_results.py).
Tables (TABLES below):
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
  The replication tables read the CIFAR-10 image folder --data_dir and evaluate every epoch.

Every (row, seed) trains into ROOT/<run>_seed<S>, where <run> is the replication row's name or,
on paper tables, named after the config (rows with one config, e.g. the two models of a joint
run, share a run). Without --run the tool prints each run's command (runnable as printed from
the repository root) and the table so far from the final.json files that exist, so it reports
runs launched elsewhere (SLURM, TPU) too. With --run the missing runs train one after another
as subprocesses of `vitboot_jax.main`, all rows of the first seed before the next seed; a run
with a final.json is skipped, an interrupted one resumes. --rows limits what runs and is
printed (the table lists every row); --override adds a flag to every run alike.

Where ROOT exists, ROOT/table.md and ROOT/table.json get per row and model the paper's top-1 and
the mean and spread (sample std, min-max) of ours over the finished seeds, the epochs, the
training wall time (sum over seeds of final.json's `train_seconds_this_run`: the training loop
with its compilation and evaluations; marked (*) when a seed resumed, as it then counts only
the steps after the resume) and the commit; ROOT/curves.png gets the first seed's curves
(tools/plot.py, needs matplotlib).

SIGTERM or Ctrl-C to a running sweep reaches the run in progress as SIGTERM: it saves its
checkpoint and exits, the sweep writes the table so far and exits with the run's code (143/130);
re-running the same command resumes. A run stopped by a signal sent to it alone stops the sweep
too, rather than counting as failed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from etils import epath

from vitboot_jax import paper_results

DEFAULT_DATA_DIR = "../shared/data/cifar10"
DRLOC_LAMBDA = 0.1
TABLE_MD = "table.md"
TABLE_JSON = "table.json"
CURVES = "curves.png"
# The repository root: config paths are relative to it and runs start in it.
REPO = pathlib.Path(__file__).resolve().parents[2]

# Which recipe a paper row runs (the report's "recipe" column).
CODE = "authors' code"  # The authors' config and code, which made the published numbers.
ALIGN = "paper Alg. 1 (Align)"  # Shared with the paper's Align; absent from the authors' code.
PAPER_B = "paper: ViT-B + entmax"  # Table 1's label and parameter count for ViT-B-Sparse.
SHIPPED_S = "authors' yaml: ViT-S shape"  # vit-base-entmax.yaml == vit-small-entmax.yaml.
ABLATION = "authors' code + Table 4 switch"  # No shipped config: one loss switch of Ours-Joint S.
# The paper gives no fine-tuning recipe; the authors' single-model worker runs the ViT recipe.
FINE_TUNE = "ours: authors' ViT recipe from imported weights"


@dataclasses.dataclass(frozen=True)
class Row:
  """One row: a config file with its args (+ flags), and whose final top-1 it reports."""

  name: str  # The paper's row label (its published top-1 is looked up by it) or ours.
  config: str  # "configs/<file>.py:<args>", relative to the repository root.
  models: tuple[str, ...] = ("vit",)  # "vit", "agent" or "cnn": the final top-1s reported.
  note: str = CODE  # Paper rows: the recipe; replication rows: what the row is.
  overrides: tuple[str, ...] = ()  # Extra --config.* flags of this row.
  run: str | None = None  # Workdir prefix; None: named after the config.

  @property
  def run_name(self) -> str:
    if self.run:
      return self.run
    stem = self.config.split("/")[-1].replace(".py:", "_").removesuffix(".py")
    return stem.replace(",", "_").replace("=", "-")


@dataclasses.dataclass(frozen=True)
class Table:
  name: str
  title: str
  rows: tuple[Row, ...]
  paper: str | None = None  # Key of paper_results.TABLES; None: no published numbers.
  note_header: str = "recipe"
  seeds: tuple[int, ...] = (0,)  # Default --seeds.
  epochs: int | None = None  # Default --epochs, appended to every row's args; None: the config's.
  data_folder: bool = False  # Pass the image folder --data_dir to every run.
  overrides: tuple[str, ...] = ()  # Flags of every run of this table.
  root: str = ""  # Default --root.


def _cifar_rows(dataset: str) -> tuple[Row, ...]:
  def config(size: str, args: str) -> str:
    return f"configs/{size}_{dataset}.py:{args}"

  pair = ("agent", "vit")
  rows = [
    Row("Agent-S", config("vits", "mode=agent"), ("agent",)),
    Row("Agent-B", config("vitb", "mode=agent"), ("agent",)),
    Row("ViT-S", config("vits", "mode=vit")),
    Row("ViT-B", config("vitb", "mode=vit")),
    Row("Ours-Joint S", config("vits", "mode=joint"), pair),
    Row("Ours-Joint B", config("vitb", "mode=joint"), pair),
  ]
  for size in ("S", "B"):
    rows += [
      Row(f"Ours-Shared {size}", config(f"vit{size.lower()}", "mode=shared,align=none"), pair),
      Row(
        f"Ours-Shared {size}", config(f"vit{size.lower()}", "mode=shared,align=pcgrad"), pair, ALIGN
      ),
    ]
  rows += [
    Row("ViT-S-SAM", config("vits", "mode=vit,sam=1")),
    Row("ViT-S-Sparse", config("vits", "mode=vit,attention=entmax")),
    Row("ViT-B-SAM", config("vitb", "mode=vit,sam=1")),
    Row("ViT-B-Sparse", config("vitb", "mode=vit,attention=entmax"), note=PAPER_B),
    # The authors' ViT-B-Sparse config is their ViT-S-Sparse one: the same run as ViT-S-Sparse.
    Row("ViT-B-Sparse", config("vits", "mode=vit,attention=entmax"), note=SHIPPED_S),
    Row("ResNet50", f"configs/cnn_baselines.py:model=resnet50,dataset={dataset}", ("cnn",)),
    Row(
      "EfficientNet-B2",
      f"configs/cnn_baselines.py:model=efficientnet_b2,dataset={dataset}",
      ("cnn",),
    ),
    # Fine-tuned from ImageNet-1k weights (the ViT-B row from DeiT-S's; see the config).
    Row(
      "Pre-trained ViT-S",
      f"configs/pretrained_cifar.py:dataset={dataset},vit=vit_s",
      note=FINE_TUNE,
    ),
    Row(
      "Pre-trained ViT-B",
      f"configs/pretrained_cifar.py:dataset={dataset},vit=vit_b",
      note=FINE_TUNE,
    ),
  ]
  return tuple(rows)


def _imagenet_rows() -> tuple[Row, ...]:
  spec = [
    ("Agent-B", "vitb", "mode=agent", "agent", CODE),
    ("ViT-B", "vitb", "mode=vit", "vit", CODE),
    ("Ours-Joint", "vitb", "mode=joint", "vit", CODE),
    ("Ours-Shared", "vitb", "mode=shared,align=none", "vit", CODE),
    ("Ours-Shared", "vitb", "mode=shared,align=pcgrad", "vit", ALIGN),
    ("ViT-B-SAM", "vitb", "mode=vit,sam=1", "vit", CODE),
    ("ViT-B-Sparse", "vitb", "mode=vit,attention=entmax", "vit", PAPER_B),
    ("ViT-B-Sparse", "vits", "mode=vit,attention=entmax", "vit", SHIPPED_S),
  ]
  subsets = (0.05, 0.1, 0.5)
  rows = [
    Row(f"{name} {round(s * 100)}%", f"configs/{size}_imagenet.py:subset={s},{args}", (m,), note)
    for name, size, args, m, note in spec
    for s in subsets
  ]
  rows += [
    Row(
      f"ResNet50 {round(s * 100)}%",
      f"configs/cnn_baselines.py:model=resnet50,dataset=imagenet,subset={s}",
      ("cnn",),
    )
    for s in subsets
  ]
  return tuple(rows)


def _ablation_rows() -> tuple[Row, ...]:
  # Table 4 (loss terms of Ours-Joint ViT-S on CIFAR-100; AP-2D sits under "Feat Only") and
  # Table 5 (the ViT-like "base" agent stem).
  config = "configs/vits_cifar100.py:"
  return (
    Row("T4 Baseline (ViT-S)", config + "mode=vit"),
    Row("T4 KD Only", config + "mode=joint,feature=0", note=ABLATION),
    Row("T4 Feat Only, No Decay", config + "mode=joint,kd=0,decay=none", note=ABLATION),
    Row("T4 Feat Only", config + "mode=joint,kd=0", note=ABLATION),
    Row("T4 Feat Only, AP-2D", config + "mode=joint,kd=0,adapt=pool2d", note=ABLATION),
    Row("T4 Both, No Decay", config + "mode=joint,decay=none", note=ABLATION),
    Row("T4 Both (Ours-Joint S)", config + "mode=joint"),
    Row("T5 Agent-S base", config + "mode=agent,agent=base", ("agent",)),
    Row("T5 Joint base", config + "mode=joint,agent=base", ("vit", "agent")),
  )


def _replication_rows(config: str, names: Sequence[str] | None = None) -> tuple[Row, ...]:
  """The CPU replication's rows on `config`; each row's name is its workdir prefix."""

  def row(name: str, args: str, note: str, models: tuple[str, ...] = ("vit", "agent")) -> Row:
    return Row(name, f"{config}:{args}", models, note, run=name)

  drloc = f"{DRLOC_LAMBDA:g}"
  rows = (
    row("vit", "mode=vit", "ViT alone", ("vit",)),
    row("agent", "mode=agent", "agent alone", ("agent",)),
    row("joint", "mode=joint", "joint (ViT + agent, separate weights)"),
    row("shared_align", "mode=shared,align=pcgrad", "shared with Align (PCGrad)"),
    row(
      "shared_noalign",
      "mode=shared,align=none",
      "shared without Align (official: summed gradients)",
    ),
    row("vit_drloc", f"mode=vit,drloc={drloc}", f"ViT + DrLoc (lambda {drloc})", ("vit",)),
    row("vit_impulse", "mode=vit,init=impulse3", "ViT, impulse init (3x3)", ("vit",)),
    row("vit_mimetic", "mode=vit,init=mimetic", "ViT, mimetic init", ("vit",)),
    row(
      "shared_drloc",
      f"mode=shared,align=pcgrad,drloc={drloc}",
      f"shared with Align + DrLoc on the ViT (lambda {drloc})",
    ),
    # Table 4's loss ablation in joint mode ("both" is the joint row).
    row("joint_kd_only", "mode=joint,feature=0", "joint, KD only (no feature term)"),
    row("joint_feature_only", "mode=joint,kd=0", "joint, feature term only (no KD)"),
    row(
      "joint_no_decay",
      "mode=joint,decay=none",
      "joint, both terms, constant feature weight (No Decay)",
    ),
  )
  return tuple(r for r in rows if names is None or r.name in names)


# The agent-alone run of the same seed, which the teacher rows of the mechanism table start from.
AGENT_RUN = "{root}/agent_seed{seed}"


def _mechanism_rows(config: str) -> tuple[Row, ...]:
  """Why the feature (hint) term costs the ViT: one row per explanation's switch (configs/
  common.py), all in joint mode unless named, beside the references."""

  def row(name: str, args: str, note: str, models=("vit", "agent"), overrides=()) -> Row:
    return Row(name, f"{config}:{args}", models, note, tuple(overrides), run=name)

  teacher = (f"--config.agent_init_from={AGENT_RUN}",)
  # Run in this order (the references the rows need first, then one row per explanation).
  return (
    row("vit", "mode=vit", "reference: ViT alone", ("vit",)),
    row("agent", "mode=agent", "reference: agent alone (the teacher rows' start)", ("agent",)),
    row("joint", "mode=joint", "reference: official joint (ce 1, kd 1, feature 10)"),
    row(
      "joint_teacher",
      "mode=joint",
      "1 teacher: the agent starts from the finished agent-alone run, trained on",
      overrides=teacher,
    ),
    row(
      "joint_teacher_frozen",
      "mode=joint,frozen=1",
      "1 teacher: the agent starts from the finished agent-alone run, frozen",
      overrides=teacher,
    ),
    row("joint_until10", "mode=joint,until=0.1", "2 timing: hint in the first 10% of steps only"),
    row("joint_until30", "mode=joint,until=0.3", "2 timing: hint in the first 30% of steps only"),
    row("joint_balance1", "mode=joint,balance=1", "3 strength: hint gradient <= the CE's (norm)"),
    row("joint_projector", "mode=joint,projector=linear", "3 form: learnable linear projector"),
    row("joint_last2", "mode=joint,layers=2", "3 strength: the last 2 of 6 layers only"),
    row("joint_paper_form", "mode=joint,form=paper", "3 form: the paper's Eq. 6 (L2-normalised)"),
    row(
      "joint_gate35",
      "mode=joint,gate=0.35",
      "1 teacher: hint on once the agent's train top-1 >= 35%",
    ),
    row("joint_pool2d", "mode=joint,adapt=pool2d", "4 geometry: 2-D pooling of the agent's grid"),
    row("joint_kd_only", "mode=joint,feature=0", "reference: joint without the hint (KD only)"),
    row("shared_noalign", "mode=shared,align=none", "reference: official shared"),
  )


_REPLICATION = dict(
  note_header="description",
  seeds=(0, 1),
  epochs=10,
  data_folder=True,
  overrides=("--config.eval_every_epochs=1",),  # Curves per epoch (the quickstart: every 3rd).
)
_TABLES = (
  Table("cifar10", "Table 1, CIFAR-10", _cifar_rows("cifar10"), "cifar10", root="workdirs/cifar10"),
  Table(
    "cifar100", "Table 1, CIFAR-100", _cifar_rows("cifar100"), "cifar100", root="workdirs/cifar100"
  ),
  Table("imagenet", "Table 3, ImageNet-1k", _imagenet_rows(), "imagenet", root="workdirs/imagenet"),
  Table(
    "ablation", "Tables 4-5, CIFAR-100", _ablation_rows(), "ablation", root="workdirs/ablation"
  ),
  Table(
    "replication",
    "CPU-scale replication (quickstart ViT + agent, CIFAR-10 10%, 32 px, 8x8 tokens)",
    _replication_rows("configs/quickstart.py"),
    root="workdirs/cpu_replication",
    **_REPLICATION,
  ),
  Table(
    "replication_tokens16",
    "CPU-scale replication at 16x16 tokens (CIFAR-10 10%, 32 px, patch 2)",
    _replication_rows(
      "configs/cifar10_tokens16.py",
      ("vit", "agent", "joint", "shared_align", "shared_noalign")
      + ("joint_kd_only", "joint_feature_only", "joint_no_decay"),
    ),
    root="workdirs/cpu_replication_tokens16",
    **_REPLICATION,
  ),
)
_TABLES += (
  Table(
    "replication_224",
    "The paper's ViT-S and Agent-S at 224 px, official recipe, CIFAR-10 10% (third rung)",
    _replication_rows(
      "configs/vits_cifar10.py", ("vit", "agent", "joint", "shared_align", "shared_noalign")
    ),
    note_header="description",
    root="workdirs/rung3_224",
    # The data (an .npz of the 10% subset) and the epochs come from launch/rung3_224.sh.
    overrides=("--config.data.pipeline=device",),
  ),
)
_TABLES += (
  Table(
    "mechanism",
    "Why the hint costs the ViT: one switch per explanation (8x8 tokens, CIFAR-10 10%, 32 px)",
    _mechanism_rows("configs/quickstart.py"),
    root="workdirs/mechanism",
    **{**_REPLICATION, "epochs": 5},
  ),
)
TABLES: dict[str, Table] = {t.name: t for t in _TABLES}
PAPER_TABLES = tuple(t.name for t in _TABLES if t.paper)


def rows(table: str) -> tuple[Row, ...]:
  return TABLES[table].rows


def paper_top1(table: Table, row: Row, model: str) -> float | None:
  return paper_results.top1(table.paper, row.name, model) if table.paper else None


def select_rows(table: Table, names: Sequence[str] | None) -> list[Row]:
  """The rows named (by row name or run name; all when empty), in table order."""
  if not names:
    return list(table.rows)
  known = {r.name for r in table.rows} | {r.run_name for r in table.rows}
  unknown = sorted(set(names) - known)
  if unknown:
    choices = list(dict.fromkeys(r.run_name for r in table.rows))
    raise ValueError(f"unknown rows {unknown} of table {table.name}; choose from {choices}")
  return [r for r in table.rows if r.name in names or r.run_name in names]


def runs(selected: Sequence[Row]) -> list[Row]:
  """The first row of each run (rows with one run name train once)."""
  first = {}
  for row in selected:
    first.setdefault(row.run_name, row)
  return list(first.values())


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every run of a sweep shares."""

  root: str  # As printed: relative to the repository root when inside it, else absolute.
  seeds: tuple[int, ...]
  epochs: int | None
  data_dir: str | None  # Absolute (written into each run's config.json); None: not a folder table.
  extra: tuple[str, ...] = ()


def repo_path(path: str | os.PathLike) -> str:
  """`path` (relative to the cwd) as it works from the repository root; a URL (gs://) as is."""
  if "://" in os.fspath(path):
    return os.fspath(path)
  absolute = pathlib.Path(os.path.abspath(path))
  try:
    return str(absolute.relative_to(REPO))
  except ValueError:
    return str(absolute)


def settings(
  table: Table,
  root: str | None = None,
  seeds: Sequence[int] | None = None,
  epochs: int | None = None,
  data_dir: str = DEFAULT_DATA_DIR,
  extra: Sequence[str] = (),
) -> Settings:
  if epochs is not None and table.epochs is None:
    raise ValueError(
      f"table {table.name} trains its configs' epochs; change them with "
      "--override=--config.num_epochs=N"
    )
  return Settings(
    root=repo_path(root or REPO / table.root),
    seeds=tuple(table.seeds if seeds is None else seeds),
    epochs=table.epochs if epochs is None else epochs,
    data_dir=os.path.abspath(data_dir) if table.data_folder else None,
    extra=tuple(extra),
  )


def workdir(s: Settings, row: Row, seed: int) -> epath.Path:
  """Where (row, seed) trains, relative to the repository root unless ROOT is outside it (a
  bucket's gs://... included: epath reads it, pathlib would turn it into gs:/...)."""
  return epath.Path(s.root) / f"{row.run_name}_seed{seed}"


def _abs(path: epath.Path) -> epath.Path:
  return path if "://" in os.fspath(path) or path.is_absolute() else epath.Path(REPO) / path


def row_config(s: Settings, row: Row) -> str:
  return row.config + (f",epochs={s.epochs}" if s.epochs is not None else "")


def command(table: Table, s: Settings, row: Row, seed: int) -> list[str]:
  """The training command of (row, seed), starting with `python`; run it from the repo root."""
  data = ["--config.data.name=folder", f"--config.data.dir={s.data_dir}"] if s.data_dir else []
  return [
    "python",
    "-m",
    "vitboot_jax.main",
    f"--config={row_config(s, row)}",
    f"--workdir={workdir(s, row, seed)}",
    f"--config.seed={seed}",
    *data,
    *table.overrides,
    *(o.format(root=s.root, seed=seed) for o in row.overrides),
    *s.extra,
  ]


def _read_json(path: epath.Path) -> dict[str, Any] | None:
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


def aggregate(table: Table, s: Settings) -> list[dict[str, Any]]:
  """Per row: status, the statistics of the finished seeds' final.json (top-1 in %), the
  paper's top-1 and the commands."""
  out = []
  for row in table.rows:
    finals, started = {}, []
    for seed in s.seeds:
      wd = _abs(workdir(s, row, seed))
      final = _read_json(wd / "final.json")
      if final is not None:
        finals[seed] = final
      elif wd.exists():
        started.append(seed)
    if len(finals) == len(s.seeds):
      status = "done"
    elif finals:
      status = f"partial ({len(finals)}/{len(s.seeds)} seeds)"
    else:
      status = "incomplete" if started else "not run"
    run_epochs = sorted({float(f["epochs"]) for f in finals.values() if "epochs" in f})
    entry = {
      "name": row.name,
      "note": row.note,
      "run": row.run_name,
      "config": row_config(s, row),
      "overrides": list(row.overrides),
      "models": list(row.models),
      "status": status,
      "seeds_done": sorted(finals),
      "seeds_incomplete": started,
      "epochs": run_epochs,
      "epochs_match": s.epochs is None or all(math.isclose(e, s.epochs) for e in run_epochs),
      "train_seconds": sum(float(f.get("train_seconds_this_run", 0.0)) for f in finals.values()),
      # final.json times only the last run of a workdir, so a resumed seed's time is too short.
      "seeds_resumed": sorted(k for k, f in finals.items() if f.get("resumed_from_step", 0) > 0),
      "paper_top1": {m: paper_top1(table, row, m) for m in row.models},
      "top1": {
        m: spread([100.0 * f[f"top1_{m}"] for f in finals.values() if f"top1_{m}" in f])
        for m in row.models
      },
      "commands": [shlex.join(command(table, s, row, seed)) for seed in s.seeds],
    }
    out.append(entry)
  return out


def commit() -> str | None:
  """HEAD of the repository (read-only), or None outside a git checkout."""
  try:
    result = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    )
  except (OSError, subprocess.CalledProcessError):
    return None
  return result.stdout.strip() or None


def build_report(table: Table, s: Settings) -> dict[str, Any]:
  """The content of table.json: the rows' statistics and the sweep's settings."""
  entries = aggregate(table, s)
  train_seconds = sum(e["train_seconds"] for e in {e["run"]: e for e in entries}.values())
  return {
    "table": table.name,
    "title": table.title,
    "paper_source": paper_results.TABLES[table.paper].source if table.paper else None,
    "note_header": table.note_header,
    "root": s.root,
    "epochs": s.epochs,
    "seeds": list(s.seeds),
    "data_dir": s.data_dir,
    "table_overrides": list(table.overrides),
    "extra_overrides": list(s.extra),
    "commit": commit(),
    "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "train_seconds": train_seconds,
    "rows": entries,
    "curves": None,
  }


def _format_top1(stats: dict[str, Any] | None, seeds: int) -> str:
  if stats is None:
    return "not run"
  if stats["std"] is None:
    return f"{stats['mean']:.2f}" + (" (1 seed)" if seeds > 1 else "")
  return f"{stats['mean']:.2f} ± {stats['std']:.2f} [{stats['min']:.2f}, {stats['max']:.2f}]"


def format_duration(seconds: float) -> str:
  minutes = round(seconds / 60)
  return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{seconds / 60:.1f} min"


MODEL_LABELS = paper_results.MODEL_LABELS


def table_markdown(report: dict[str, Any]) -> str:
  """The table of `report` (as written to table.json) in Markdown: a line per row and model."""
  epochs = "the configs' epochs" if report["epochs"] is None else f"epochs {report['epochs']:g}"
  lines = [f"# {report['title']}", ""]
  paper_header = " paper top-1 |" if report["paper_source"] else ""
  if report["paper_source"]:
    lines += [f"Paper top-1: {report['paper_source']} (vitboot_jax/paper_results.py).", ""]
  lines += [
    f"Ours: {epochs}, seeds {report['seeds']}; final-epoch top-1 (%) on the test set, "
    "mean ± sample std [min, max] over the finished seeds. Training time: sum over seeds.",
    "",
    f"| row | model | {report['note_header']} |{paper_header} ours top-1 | status | seeds "
    "| epochs | train time | config |",
    "|---|---|---|---|---|---|---|---|---|" + ("---|" if paper_header else ""),
  ]
  for r in report["rows"]:
    epochs = ", ".join(f"{e:.3g}" for e in r["epochs"]) + ("" if r["epochs_match"] else " (!)")
    duration = format_duration(r["train_seconds"]) + (" (*)" if r["seeds_resumed"] else "")
    config = " ".join([r["config"].removeprefix("configs/"), *r["overrides"]])
    for model in r["models"]:
      paper = r["paper_top1"][model]
      lines.append(
        f"| {r['name']} | {MODEL_LABELS[model]} | {r['note']} "
        + (f"| {'—' if paper is None else f'{paper:.2f}'} " if paper_header else "")
        + f"| {_format_top1(r['top1'][model], len(report['seeds']))} | {r['status']} "
        f"| {','.join(map(str, r['seeds_done'])) or '—'} | {epochs or '—'} "
        f"| {duration if r['seeds_done'] else '—'} | `{config}` |"
      )
  lines += [
    "",
    f"Total training time {format_duration(report['train_seconds'])}; commit "
    f"`{report['commit'] or 'unknown'}`; generated {report['generated']}.",
  ]
  if report["data_dir"]:
    lines.append(f"Data: the image folder `{report['data_dir']}`.")
  flags_of_all = report["table_overrides"] + report["extra_overrides"]
  if flags_of_all:
    lines.append(f"Flags of every run: `{' '.join(flags_of_all)}`.")
  if any(r["seeds_resumed"] for r in report["rows"]):
    lines.append(
      "(*) a seed of this row resumed from a checkpoint: its time counts only the steps after it."
    )
  if not all(r["epochs_match"] for r in report["rows"]):
    lines.append(f"(!) a finished run of this row trained other than {report['epochs']:g} epochs.")
  if report.get("curves"):
    lines += ["", f"![curves of seed {report['seeds'][0]}]({CURVES})"]
  return "\n".join(lines) + "\n"


def plot_curves(table: Table, s: Settings, seed: int) -> epath.Path | None:
  """ROOT/curves.png over the runs of `seed` that have logged; None if none."""
  found = [(row.name, _abs(workdir(s, row, seed))) for row in runs(table.rows)]
  found = [(name, wd) for name, wd in found if (wd / "metrics.jsonl").exists()]
  if not found:
    return None
  from vitboot_jax.tools import plot

  try:
    return plot.plot_runs(
      [wd for _, wd in found],
      _abs(epath.Path(s.root)) / CURVES,
      labels=[name for name, _ in found],
      title=f"{table.title}, seed {seed}",
    )
  except ModuleNotFoundError as error:
    if error.name != "matplotlib":
      raise
    print(f"warning: no {CURVES}: {error}", file=sys.stderr)
    return None


def write_report(root: epath.Path, report: dict[str, Any]) -> None:
  root.mkdir(parents=True, exist_ok=True)
  (root / TABLE_JSON).write_text(json.dumps(report, indent=2) + "\n")
  (root / TABLE_MD).write_text(table_markdown(report))


def rows_markdown(table: Table, *also: str) -> str:
  """The README's view of a paper table: per row the published top-1 (of `table.paper` and of
  the paper tables `also`, matched by row name), the `--config=` it runs and its recipe."""
  papers = (table.paper, *also)
  header = ["paper row", *(f"{paper_results.TABLES[p].column} (paper)" for p in papers)]
  lines = ["| " + " | ".join([*header, "`--config=`", "recipe"]) + " |"]
  lines.append("|" + "---|" * (len(header) + 2))
  for row in table.rows:
    cells = []
    for paper in papers:
      found = [(m, paper_results.top1(paper, row.name, m)) for m in row.models]
      found = [(m, v) for m, v in found if v is not None]
      named = len(row.models) > 1
      cells.append(
        ", ".join(f"{MODEL_LABELS[m]} {v:.2f}" if named else f"{v:.2f}" for m, v in found)
      )
    lines.append("| " + " | ".join([row.name, *cells, f"`{row.config}`", row.note]) + " |")
  return "\n".join(lines) + "\n"


def describe(table: Table, row: Row) -> str:
  """'# name (note): paper top-1 ...' above a row's command."""
  paper = [(m, paper_top1(table, row, m)) for m in row.models]
  published = ", ".join(f"{MODEL_LABELS[m]} {p:.2f}" for m, p in paper if p is not None)
  return f"# {row.name} ({row.note})" + (f": paper top-1 {published}" if published else "")


def print_commands(table: Table, s: Settings, selected: Sequence[Row]) -> None:
  print(f"# {table.title}: run the commands from the repository root ({REPO}).")
  for seed in s.seeds:
    for row in runs(selected):
      shared = [r for r in selected if r.run_name == row.run_name]
      for r in shared:
        print(describe(table, r))
      print(shlex.join(command(table, s, row, seed)))
  print()


class Stopped(Exception):  # noqa: N818 (not an error: a requested stop)
  """A run stopped on SIGTERM/SIGINT after saving its checkpoint; the sweep stops with it."""

  def __init__(self, workdir: str, exit_code: int):
    self.workdir, self.exit_code = workdir, exit_code
    super().__init__(
      f"stopped ({signal.Signals(exit_code - 128).name}) with {workdir} saved; re-run the same "
      "command to resume"
    )


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_training(cmd: Sequence[str]) -> tuple[int, int | None]:
  """Runs one training command from the repo root: (exit code, stop signal the sweep got).

  SIGTERM or SIGINT to the sweep reaches the run as SIGTERM, so it saves and exits (a Ctrl-C in
  a terminal reaches both; a second SIGTERM is harmless, a second SIGINT would skip the save).
  """
  process = subprocess.Popen([sys.executable, *cmd[1:]], cwd=REPO)
  received: list[int] = []

  def forward(signum: int, frame: Any) -> None:
    del frame
    received.append(signum)
    if process.poll() is None:
      process.send_signal(signal.SIGTERM)

  in_main_thread = threading.current_thread() is threading.main_thread()
  previous = {sig: signal.signal(sig, forward) for sig in _STOP_SIGNALS} if in_main_thread else {}
  try:
    return process.wait(), (received[0] if received else None)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def run_missing(table: Table, s: Settings, selected: Sequence[Row]) -> list[str]:
  """Trains every (run, seed) without a final.json, seed by seed; returns the failed workdirs.

  Raises Stopped when a run stops on a signal (sent to the sweep or to the run itself).
  """
  failed = []
  for seed in s.seeds:
    for row in runs(selected):
      wd = workdir(s, row, seed)
      if (_abs(wd) / "final.json").exists():
        print(f"done already: {wd}", flush=True)
        continue
      cmd = command(table, s, row, seed)
      print(f"running: {shlex.join(cmd)}", flush=True)
      start = time.perf_counter()
      returncode, stop_signal = run_training(cmd)
      minutes = (time.perf_counter() - start) / 60
      if stop_signal is not None or returncode in (128 + sig for sig in _STOP_SIGNALS):
        raise Stopped(str(wd), returncode if returncode > 128 else 128 + stop_signal)
      if returncode:
        print(f"FAILED ({returncode}) after {minutes:.1f} min: {wd}", flush=True)
        failed.append(str(wd))
      else:
        print(f"finished in {minutes:.1f} min: {wd}", flush=True)
  return failed


_FLAGS = {}


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  _FLAGS["table"] = flags.DEFINE_enum(
    "table",
    None,
    list(TABLES),
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
    DEFAULT_DATA_DIR,
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
  table = TABLES[_FLAGS["table"].value]
  if _FLAGS["markdown"].value:
    if not table.paper:
      raise app.UsageError(f"table {table.name} has no published numbers")
    print(rows_markdown(table), end="")
    return 0
  seeds = None if _FLAGS["seeds"].value is None else [int(x) for x in _FLAGS["seeds"].value]
  if seeds is not None and not seeds:
    raise app.UsageError("--seeds needs at least one seed")
  try:
    s = settings(
      table,
      _FLAGS["root"].value,
      seeds,
      _FLAGS["epochs"].value,
      _FLAGS["data_dir"].value,
      _FLAGS["override"].value,
    )
    selected = select_rows(table, _FLAGS["rows"].value)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  failed, stopped = [], None
  if _FLAGS["run"].value:
    start = time.perf_counter()
    try:
      failed = run_missing(table, s, selected)
    except Stopped as stop:
      stopped = stop
    print(f"sweep: {(time.perf_counter() - start) / 60:.1f} min wall time", flush=True)
  else:
    print_commands(table, s, selected)
  report = build_report(table, s)
  root = _abs(epath.Path(s.root))
  if root.exists():
    curves = plot_curves(table, s, s.seeds[0])
    report["curves"] = str(curves) if curves else None
    write_report(root, report)
    print(f"# Wrote {root / TABLE_MD} and {root / TABLE_JSON}")
  print(table_markdown(report))
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

"""The sweep's tables (what a table is: spec.py): the paper's rows with the paper's top-1 of each
(paper_results.py), the studies' rows (study_rows.py), and the queries the sweep asks of them.
sweep/__main__.py describes every table; runs.py runs their rows, report.py reads the results
into tables and figures.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from vitboot_jax.tools.sweep import paper_results, study_rows
from vitboot_jax.tools.sweep.spec import CODE, Row, Table
from vitboot_jax.tools.sweep.study_rows import AGENT_RUN

# Which recipe a paper row runs (the report's "recipe" column), beside the authors' code (CODE).
ALIGN = "paper Alg. 1 (Align)"  # Shared with the paper's Align; absent from the authors' code.
PAPER_B = "paper: ViT-B + entmax"  # Table 1's label and parameter count for ViT-B-Sparse.
SHIPPED_S = "authors' yaml: ViT-S shape"  # vit-base-entmax.yaml == vit-small-entmax.yaml.
ABLATION = "authors' code + Table 4 switch"  # No shipped config: one loss switch of Ours-Joint S.
# The paper gives no fine-tuning recipe; the authors' single-model worker runs the ViT recipe.
FINE_TUNE = "ours: authors' ViT recipe from imported weights"

MODEL_LABELS = paper_results.MODEL_LABELS


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


# The study tables log the ViT's CE and hint gradient shares (the paper tables train as users do).
SHARES = "--config.log_hint_shares=true"
_REPLICATION = dict(
  note_header="description",
  seeds=(0, 1),
  epochs=10,
  data_folder=True,
  # Curves per epoch (the quickstart: every 3rd), and the hint's gradient share beside them.
  overrides=("--config.eval_every_epochs=1", SHARES),
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
    study_rows.replication_rows("configs/quickstart.py"),
    root="workdirs/cpu_replication",
    **_REPLICATION,
  ),
  Table(
    "replication_tokens16",
    "CPU-scale replication at 16x16 tokens (CIFAR-10 10%, 32 px, patch 2)",
    study_rows.replication_rows(
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
    study_rows.replication_rows(
      "configs/vits_cifar10.py", ("vit", "agent", "joint", "shared_align", "shared_noalign")
    ),
    note_header="description",
    root="workdirs/rung3_224",
    # The data (an .npz of the 10% subset) and the epochs come from launch/rung3_224.sh.
    overrides=("--config.data.pipeline=device", SHARES),
  ),
)
_TABLES += (
  Table(
    "mechanism",
    "Why the hint costs the ViT: one switch per explanation (8x8 tokens, CIFAR-10 10%, 32 px)",
    study_rows.mechanism_rows("configs/quickstart.py"),
    root="workdirs/mechanism",
    **{**_REPLICATION, "epochs": 5},
  ),
)
_TABLES += (
  Table(
    "mechanism_tokens16",
    "Why the hint costs the ViT, at 16x16 tokens (CIFAR-10 10%, 32 px, patch 2)",
    study_rows.mechanism_rows("configs/cifar10_tokens16.py"),
    root="workdirs/mechanism_tokens16",
    **_REPLICATION,  # 10 epochs, as the 16x16-token replication; on a GPU: launch/rung3_224.sh.
  ),
)
_TABLES += (
  Table(
    "helps",
    "Can the agent help the ViT? Labelled recipes where the agent leads (8x8 tokens, 20 epochs)",
    study_rows.helps_rows("configs/quickstart.py"),
    root="workdirs/helps",
    note_header="description",
    seeds=(0, 1),
    epochs=20,
    data_folder=True,
    overrides=("--config.eval_every_epochs=5",),  # Four points a curve, as the 20-epoch rung.
    reference="vit",
  ),
)
_TABLES += (
  Table(
    "helps_224",
    "Can the agent help the ViT? The paper's ViT-S and Agent-S at 224 px, CIFAR-10 10%",
    study_rows.helps_rows("configs/vits_cifar10.py"),
    root="workdirs/helps_224",
    note_header="description",
    # The data (an .npz of the 10% subset) and the epochs come from launch/rung3_224.sh.
    overrides=("--config.data.pipeline=device",),
    reference="vit",
  ),
)
_TABLES += (
  Table(
    "well_trained",
    "Does the agent help a well-trained ViT? Compute, label smoothing, DeiT's recipe (8x8 tokens)",
    study_rows.well_trained_rows("configs/quickstart.py"),
    root="workdirs/well_trained",
    note_header="description",
    seeds=(0, 1),
    data_folder=True,
    overrides=("--config.eval_every_epochs=5",),  # As helps: its rows' commands are the same.
    reference="vit",
    compute=True,
  ),
)
_TABLES += (
  Table(
    "well_trained_224",
    "Does the agent help a well-trained ViT? DeiT's recipe, the paper's ViT-S and Agent-S, 224 px",
    study_rows.recipe_rows("configs/vits_cifar10.py"),
    root="workdirs/well_trained_224",
    note_header="description",
    # The data (an .npz of the 10% subset) and the epochs come from launch/rung3_224.sh.
    overrides=("--config.data.pipeline=device",),
    compute=True,
  ),
)
# The small-data study's tables share one root, so that a row of one reads the runs of another
# (the students' teachers, the winner's grid run) and reuses them; each writes its own report files.
SMALL_DATA_ROOT = "workdirs/small_data"
_TABLES += (
  Table(
    "baseline",
    "An honest ViT baseline, screened on validation (8x8 tokens, 5,000 images, 100 epochs)",
    study_rows.baseline_rows("configs/quickstart.py"),
    root=SMALL_DATA_ROOT,
    note_header="description",
    seeds=(0,),
    data_folder=True,
    overrides=("--config.eval_every_epochs=5", *study_rows.VALIDATION),
    reference="base_official",
    compute=True,
    choose_within=0.2,
  ),
  Table(
    "teachers",
    "Finished teachers, chosen on validation (5,000 images, 32 px)",
    study_rows.teacher_rows(),
    root=SMALL_DATA_ROOT,
    files="teachers_",
    note_header="description",
    seeds=(0, 1),
    data_folder=True,
    overrides=("--config.eval_every_epochs=5", *study_rows.VALIDATION),
    compute=True,
    choose_teacher_within=0.2,
  ),
)
# The paper's 240-epoch schedule at the 8x8-token rung (issue 83): does the claim hold when the
# rows train as long as the paper trains? The official recipe, every switch off; validation held
# out as the baseline's. On a GPU: launch/gpu_small_data.py (the carried folder of these images).
_TABLES += (
  Table(
    "paper_schedule_240",
    "The paper's 240 epochs at 8x8 tokens: ViT, agent, joint, shared (official recipe, 5,000 imgs)",
    study_rows.replication_rows("configs/quickstart.py", ("vit", "agent", "joint", "shared_align")),
    root="workdirs/paper_schedule_240",
    note_header="description",
    seeds=(0, 1),
    epochs=240,
    data_folder=True,
    overrides=("--config.eval_every_epochs=10", *study_rows.VALIDATION),
    reference="vit",
  ),
)


# The grid's winner by its rule (docs/results.md) and the schedule item 4 chose: set once the
# grid has ended; the seeds' methods then run on it (table baseline_methods).
BASELINE_WINNER: str | None = "aug_light"
BASELINE_SCHEDULE = 2 * study_rows.BASELINE_EPOCHS


def _on_the_winner(
  name: str, title: str, files: str, rows, winner: str, seeds=(0, 1), **choose
) -> Table:
  """A table of rows built on the grid's `winner` (rows(winner_row)), `seeds` (2 by default), in
  the grid's root and with its flags, so the winner's grid run is reused; each row set against
  the winner; `choose` as Table's choose_within, paper_gains, target, choose_switch and
  choose_student_within."""
  grid = TABLES_BY_NAME["baseline"]
  row = next(r for r in grid.rows if r.name == winner)
  return Table(
    name,
    title,
    rows(row),
    root=grid.root,
    files=files,
    note_header="description",
    seeds=seeds,
    data_folder=True,
    overrides=grid.overrides,
    reference=winner,
    compute=True,
    **choose,
  )


# Item 4's rule: the longer schedule wins only if it gains 0.5 point or more on validation. Top-1
# on 5,000 images moves in steps of 0.02 point, so "the shorter within 0.49" is that rule exactly.
SCHEDULE_GAIN_WITHIN = 0.49


def baseline_schedule_table(winner: str, epochs: int = 2 * study_rows.BASELINE_EPOCHS) -> Table:
  """Is the grid's schedule enough? The winner's grid run and the winner at `epochs`, seed 0; the
  shorter schedule is chosen unless the longer gains 0.5 point or more on validation."""
  title = f"Is {study_rows.BASELINE_EPOCHS} epochs enough? The baseline ({winner}) at {epochs}"

  def rows(row: Row) -> tuple[Row, ...]:
    short = study_rows.seed_method_rows(row)[0]
    long = study_rows.seed_method_rows(row, epochs=epochs)[0]
    return short, dataclasses.replace(long, name=long.run_name, note=f"the baseline, {epochs} ep")

  return _on_the_winner(
    "baseline_schedule",
    title,
    "schedule_",
    rows,
    winner,
    seeds=(0,),
    choose_within=SCHEDULE_GAIN_WITHIN,
  )


def baseline_methods_table(winner: str, epochs: int = BASELINE_SCHEDULE) -> Table:
  """The baseline with the seeds' methods (study_rows.seed_method_rows), 2 seeds, in the grid's
  root, so the winner's seed 0 is the grid's own run at the grid's schedule."""
  title = (
    f"The seeds' methods on the baseline ({winner}, {epochs} epochs): mimetic, impulse-3, DrLoc"
  )
  rows = functools.partial(study_rows.seed_method_rows, epochs=epochs)
  gains = tuple(study_rows.SEED_METHOD_PAPER_GAINS.items())
  return _on_the_winner("baseline_methods", title, "methods_", rows, winner, paper_gains=gains)


# The teacher the teachers table chose by its rule (docs/results.md) and the other candidate: set
# once both have finished; the students then run (table students).
TEACHER: str | None = "resnet20"
OTHER_TEACHER: str | None = "agent_e100"


# The students' rule's margin: within 0.2 point of the best student on validation, the cheaper.
STUDENT_WITHIN = 0.2

# Issue 84's target: the ViT at 70% test top-1 on the 5,000 images, its schedule <= 100 epochs.
STUDENT_TARGET = (70.0, study_rows.BASELINE_EPOCHS)


def students_table(winner: str, teacher: str, other: str) -> Table:
  """The students of the baseline (study_rows.student_rows), 2 seeds, in the small-data root, so
  the winner's and the teachers' runs are reused and each student's compute counts its teacher's
  run (the same seed's)."""
  title = (
    f"Students of finished teachers on the baseline ({winner}): {teacher}, {other}, 5,000 images"
  )
  rows = functools.partial(study_rows.student_rows, teacher=teacher, other=other)
  # The teacher predicting in train or evaluation mode (TEACHER_EVAL), read on validation.
  mode = (f"corr_{teacher}", f"corr_{teacher}_eval")
  return _on_the_winner(
    "students",
    title,
    "students_",
    rows,
    winner,
    target=STUDENT_TARGET,
    choose_switch=mode,
    choose_student_within=STUDENT_WITHIN,
  )


# Whether the students' table read the teacher's predictions in evaluation mode better on
# validation (corr_T_eval against corr_T, both seeds; its report's rules.switch line): set once
# both have finished; the students at the baseline's longer schedule then run in that mode
# (table students_long).
TEACHER_EVAL: bool | None = True


def longer_students_table(
  winner: str, teacher: str, other: str, teacher_eval: bool, epochs: int = BASELINE_SCHEDULE
) -> Table:
  """The students at the baseline's schedule where it is longer than the grid's
  (study_rows.longer_student_rows), 2 seeds, in the small-data root."""
  title = f"Students at {epochs} epochs on the baseline ({winner}): {teacher}, {other}"
  rows = functools.partial(
    study_rows.longer_student_rows,
    teacher=teacher,
    other=other,
    epochs=epochs,
    teacher_eval=teacher_eval,
  )
  return _on_the_winner("students_long", title, f"students_e{epochs}_", rows, winner)


TABLES_BY_NAME = {t.name: t for t in _TABLES}
if BASELINE_WINNER:
  _TABLES += (baseline_schedule_table(BASELINE_WINNER), baseline_methods_table(BASELINE_WINNER))
  if TEACHER and OTHER_TEACHER:
    _TABLES += (students_table(BASELINE_WINNER, TEACHER, OTHER_TEACHER),)
    if TEACHER_EVAL is not None and BASELINE_SCHEDULE > study_rows.BASELINE_EPOCHS:
      _TABLES += (longer_students_table(BASELINE_WINNER, TEACHER, OTHER_TEACHER, TEACHER_EVAL),)
TABLES: dict[str, Table] = {t.name: t for t in _TABLES}
PAPER_TABLES = tuple(t.name for t in _TABLES if t.paper)


def teacher_run(row: Row) -> str | None:
  """The run name of the finished run whose agent this row starts from (AGENT_RUN), if any."""
  prefix = f"--config.agent_init_from={AGENT_RUN.split('/')[0]}/"
  for flag in row.overrides:
    if flag.startswith(prefix):
      return flag.removeprefix(prefix).removesuffix("_seed{seed}")
  return None


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

r"""Runs the rows of a paper table, each into its own workdir, and prints ours beside the paper's.

  python -m vitboot_jax.tools.paper_table --table=cifar100 --root=workdirs/table1_c100 --run
  python -m vitboot_jax.tools.paper_table --table=imagenet --root=workdirs/table3 \
    --override=--config.data.dir=/data/tfds            # prints commands + the table so far

Without --run it only prints each row's command and the table from the final.json files that
exist, so it doubles as the report of runs launched elsewhere (SLURM, TPU). Rows run one after
another; a row whose final.json exists is skipped, an interrupted one resumes; rows that share a
config (the two models of a joint run, or recipes that resolve to the same config) share one run.

Every row names the recipe it runs (the report's "recipe" column): the authors' code, which made
the published numbers, unless labelled otherwise. Shared rows run twice: as the authors' code
(`align=none`: one gradient of the summed losses) and as the paper's Algorithm 1 (`align=pcgrad`).
ViT-B-Sparse runs twice: ViT-B with entmax (the paper's label and parameter count) and the
authors' shipped config, which builds the ViT-S shape (288/6/9): which one made the published
numbers is unclear. tests/paper_recipes.py pins every row's resolved recipe.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

from absl import app, flags

# Which recipe a row runs (the report's "recipe" column; README "Paper rows as commands").
CODE = "authors' code"  # The authors' config and code, which made the published numbers.
ALIGN = "paper Alg. 1 (Align)"  # Shared with the paper's Align; absent from the authors' code.
PAPER_B = "paper: ViT-B + entmax"  # Table 1's label and parameter count for ViT-B-Sparse.
SHIPPED_S = "authors' yaml: ViT-S shape"  # vit-base-entmax.yaml == vit-small-entmax.yaml.
ABLATION = "authors' code + Table 4 switch"  # No shipped config: one loss switch of Ours-Joint S.


@dataclasses.dataclass(frozen=True)
class Row:
  name: str  # Row label in the paper.
  config: str  # configs/<file>:<args>
  model: str  # Which model's final top-1 the row reports ("vit", "agent" or "cnn").
  paper: float  # Published final-epoch top-1 (%).
  recipe: str = CODE


def _cifar_rows(dataset: str) -> list[Row]:
  # Paper Table 1 / official README: (CIFAR-10, CIFAR-100) top-1.
  spec = [
    ("Agent-S", "vits", "mode=agent", "agent", 94.18, 74.62, CODE),
    ("Agent-B", "vitb", "mode=agent", "agent", 94.83, 74.78, CODE),
    ("ViT-S", "vits", "mode=vit", "vit", 87.32, 61.25, CODE),
    ("ViT-B", "vitb", "mode=vit", "vit", 79.24, 53.07, CODE),
    ("Ours-Joint S", "vits", "mode=joint", "agent", 94.90, 74.06, CODE),
    ("Ours-Joint S", "vits", "mode=joint", "vit", 95.14, 76.19, CODE),
    ("Ours-Joint B", "vitb", "mode=joint", "agent", 95.06, 76.57, CODE),
    ("Ours-Joint B", "vitb", "mode=joint", "vit", 95.00, 77.83, CODE),
  ]
  for size, shared in (("S", (93.22, 74.06, 93.72, 75.50)), ("B", (92.66, 74.11, 93.34, 75.71))):
    for align, recipe in (("none", CODE), ("pcgrad", ALIGN)):
      spec += [
        (
          f"Ours-Shared {size}",
          f"vit{size.lower()}",
          f"mode=shared,align={align}",
          model,
          *p,
          recipe,
        )
        for model, p in (("agent", shared[:2]), ("vit", shared[2:]))
      ]
  spec += [
    ("ViT-S-SAM", "vits", "mode=vit,sam=1", "vit", 87.77, 62.60, CODE),
    ("ViT-S-Sparse", "vits", "mode=vit,attention=entmax", "vit", 87.43, 62.29, CODE),
    ("ViT-B-SAM", "vitb", "mode=vit,sam=1", "vit", 86.57, 58.18, CODE),
    ("ViT-B-Sparse", "vitb", "mode=vit,attention=entmax", "vit", 83.87, 57.22, PAPER_B),
    # The authors' ViT-B-Sparse config is their ViT-S-Sparse one: the same run as ViT-S-Sparse.
    ("ViT-B-Sparse", "vits", "mode=vit,attention=entmax", "vit", 83.87, 57.22, SHIPPED_S),
  ]
  column = 0 if dataset == "cifar10" else 1
  rows = [
    Row(name, f"configs/{size}_{dataset}.py:{args}", model, (c10, c100)[column], recipe)
    for name, size, args, model, c10, c100, recipe in spec
  ]
  rows += [
    Row(name, f"configs/cnn_baselines.py:model={cnn},dataset={dataset}", "cnn", paper[column])
    for name, cnn, paper in (
      ("ResNet50", "resnet50", (94.92, 77.57)),
      ("EfficientNet-B2", "efficientnet_b2", (94.14, 75.55)),
    )
  ]
  # Fine-tuned from ImageNet-1k weights (the ViT-B row from DeiT-S's; see the config's docstring).
  rows += [
    Row(name, f"configs/pretrained_cifar.py:dataset={dataset},vit={vit}", "vit", paper[column])
    for name, vit, paper in (
      ("Pre-trained ViT-S", "vit_s", (95.70, 80.91)),
      ("Pre-trained ViT-B", "vit_b", (97.17, 84.95)),
    )
  ]
  return rows


def _ablation_rows() -> list[Row]:
  # Paper Table 4 (ablations of Ours-Joint ViT-S on CIFAR-100, ViT top-1) and Table 5 (the
  # ViT-like "base" agent stem). Mutual = KD both ways; Feat = the feature term. AP-2D is listed
  # under "Feat Only" in the table's layout.
  config = "configs/vits_cifar100.py:"
  return [
    Row("T4 Baseline (ViT-S)", config + "mode=vit", "vit", 61.25),
    Row("T4 KD Only", config + "mode=joint,feature=0", "vit", 67.16, ABLATION),
    Row("T4 Feat Only, No Decay", config + "mode=joint,kd=0,decay=none", "vit", 73.59, ABLATION),
    Row("T4 Feat Only", config + "mode=joint,kd=0", "vit", 74.94, ABLATION),
    Row("T4 Feat Only, AP-2D", config + "mode=joint,kd=0,adapt=pool2d", "vit", 71.06, ABLATION),
    Row("T4 Both, No Decay", config + "mode=joint,decay=none", "vit", 75.15, ABLATION),
    Row("T4 Both (Ours-Joint S)", config + "mode=joint", "vit", 76.19),
    Row("T5 Agent-S base", config + "mode=agent,agent=base", "agent", 72.73),
    Row("T5 Joint base", config + "mode=joint,agent=base", "vit", 73.18),
    Row("T5 Joint base", config + "mode=joint,agent=base", "agent", 73.79),
  ]


def _imagenet_rows() -> list[Row]:
  # Paper Table 3, ViT-B on 5% / 10% / 50% of ImageNet-1k.
  spec = [
    ("Agent-B", "vitb", "mode=agent", "agent", (35.28, 47.46, 68.13), CODE),
    ("ViT-B", "vitb", "mode=vit", "vit", (16.60, 28.11, 63.40), CODE),
    ("Ours-Joint", "vitb", "mode=joint", "vit", (36.01, 49.73, 71.36), CODE),
    ("Ours-Shared", "vitb", "mode=shared,align=none", "vit", (33.06, 45.75, 66.48), CODE),
    ("Ours-Shared", "vitb", "mode=shared,align=pcgrad", "vit", (33.06, 45.75, 66.48), ALIGN),
    ("ViT-B-SAM", "vitb", "mode=vit,sam=1", "vit", (16.67, 28.66, 64.37), CODE),
    ("ViT-B-Sparse", "vitb", "mode=vit,attention=entmax", "vit", (10.39, 28.92, 66.01), PAPER_B),
    ("ViT-B-Sparse", "vits", "mode=vit,attention=entmax", "vit", (10.39, 28.92, 66.01), SHIPPED_S),
  ]
  rows = [
    Row(
      f"{name} {int(subset * 100)}%",
      f"configs/{size}_imagenet.py:subset={subset},{args}",
      model,
      p,
      recipe,
    )
    for name, size, args, model, paper, recipe in spec
    for subset, p in zip((0.05, 0.1, 0.5), paper)
  ]
  rows += [
    Row(
      f"ResNet50 {int(subset * 100)}%",
      f"configs/cnn_baselines.py:model=resnet50,dataset=imagenet,subset={subset}",
      "cnn",
      p,
    )
    for subset, p in zip((0.05, 0.1, 0.5), (35.43, 50.86, 70.05))
  ]
  return rows


TABLES = ("cifar10", "cifar100", "imagenet", "ablation")


def rows(table: str) -> list[Row]:
  """The rows of `table`: Table 1 on "cifar10"/"cifar100", Table 3 on "imagenet", Tables 4-5
  (CIFAR-100, ViT-S) on "ablation"."""
  if table == "imagenet":
    return _imagenet_rows()
  if table == "ablation":
    return _ablation_rows()
  return _cifar_rows(table)


def command(row: Row, root: pathlib.Path, overrides: list[str]) -> list[str]:
  # Joint/shared rows report two models of one run: both rows share the run's workdir.
  workdir = root / row.config.split("/")[-1].replace(".py:", "_").replace(",", "_").replace(
    "=", "-"
  )
  return [
    sys.executable,
    "-m",
    "vitboot_jax.main",
    f"--config={row.config}",
    f"--workdir={workdir}",
    *overrides,
  ]


def report(table: str, root: pathlib.Path, overrides: list[str]) -> str:
  lines = [
    "| row | model | recipe | paper top-1 | ours top-1 | epochs | workdir |",
    "|---|---|---|---|---|---|---|",
  ]
  for row in rows(table):
    workdir = pathlib.Path(command(row, root, overrides)[4].split("=", 1)[1])
    final_path = workdir / "final.json"
    ours, epochs = "not run", ""
    if final_path.exists():
      final = json.loads(final_path.read_text())
      ours = f"{100 * final[f'top1_{row.model}']:.2f}"
      epochs = f"{final['epochs']:g}"
    lines.append(
      f"| {row.name} | {row.model} | {row.recipe} | {row.paper:.2f} | {ours} | {epochs} "
      f"| {workdir} |"
    )
  return "\n".join(lines)


_TABLE = None
_ROOT = None
_RUN = None
_OVERRIDES = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _TABLE, _ROOT, _RUN, _OVERRIDES
  _TABLE = flags.DEFINE_enum(
    "table", "cifar100", list(TABLES), "Table 1 (cifar10, cifar100), 3 (imagenet), 4-5 (ablation)."
  )
  _ROOT = flags.DEFINE_string("root", None, "Parent directory of the rows' workdirs.")
  _RUN = flags.DEFINE_bool("run", False, "Run the missing rows (sequentially) before reporting.")
  _OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "Extra flags for every run, e.g. data dir."
  )
  flags.mark_flag_as_required("root")


def main(argv):
  del argv
  root = pathlib.Path(_ROOT.value)
  seen = set()
  for row in rows(_TABLE.value):
    cmd = command(row, root, _OVERRIDES.value)
    if tuple(cmd) in seen:
      continue
    seen.add(tuple(cmd))
    print(" ".join(cmd[1:]) if not _RUN.value else f"running: {' '.join(cmd[1:])}", flush=True)
    if _RUN.value:
      subprocess.run(cmd, check=True)
  print(report(_TABLE.value, root, _OVERRIDES.value))


if __name__ == "__main__":
  define_flags()
  app.run(main)

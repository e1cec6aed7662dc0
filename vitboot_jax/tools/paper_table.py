r"""Runs the rows of a paper table, each into its own workdir, and prints ours beside the paper's.

  python -m vitboot_jax.tools.paper_table --table=cifar100 --root=workdirs/table1_c100 --run
  python -m vitboot_jax.tools.paper_table --table=imagenet --root=workdirs/table3 \
    --override=--config.data.dir=/data/tfds            # prints commands + the table so far

Without --run it only prints each row's command and the table from the final.json files that
exist, so it doubles as the report of runs launched elsewhere (SLURM, TPU). Rows run one after
another; a row whose final.json exists is skipped, an interrupted one resumes.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

from absl import app, flags


@dataclasses.dataclass(frozen=True)
class Row:
  name: str  # Row label in the paper.
  config: str  # configs/<file>:<args>
  model: str  # Which model's final top-1 the row reports ("vit" or "agent").
  paper: float  # Published final-epoch top-1 (%).

  @property
  def workdir_name(self) -> str:
    return f"{self.name.replace(' ', '_').replace('/', '-')}_{self.model}"


def _cifar_rows(dataset: str) -> list[Row]:
  # Paper Table 1 / official README: (CIFAR-10, CIFAR-100) top-1.
  spec = [
    ("Agent-S", "vits", "mode=agent", "agent", 94.18, 74.62),
    ("Agent-B", "vitb", "mode=agent", "agent", 94.83, 74.78),
    ("ViT-S", "vits", "mode=vit", "vit", 87.32, 61.25),
    ("ViT-B", "vitb", "mode=vit", "vit", 79.24, 53.07),
    ("Ours-Joint S", "vits", "mode=joint", "agent", 94.90, 74.06),
    ("Ours-Joint S", "vits", "mode=joint", "vit", 95.14, 76.19),
    ("Ours-Joint B", "vitb", "mode=joint", "agent", 95.06, 76.57),
    ("Ours-Joint B", "vitb", "mode=joint", "vit", 95.00, 77.83),
    ("Ours-Shared S", "vits", "mode=shared", "agent", 93.22, 74.06),
    ("Ours-Shared S", "vits", "mode=shared", "vit", 93.72, 75.50),
    ("Ours-Shared B", "vitb", "mode=shared", "agent", 92.66, 74.11),
    ("Ours-Shared B", "vitb", "mode=shared", "vit", 93.34, 75.71),
  ]
  spec += [
    ("ViT-S-SAM", "vits", "mode=vit,sam=1", "vit", 87.77, 62.60),
    ("ViT-S-Sparse", "vits", "mode=vit,attention=entmax", "vit", 87.43, 62.29),
    ("ViT-B-SAM", "vitb", "mode=vit,sam=1", "vit", 86.57, 58.18),
    ("ViT-B-Sparse", "vitb", "mode=vit,attention=entmax", "vit", 83.87, 57.22),
  ]
  column = 0 if dataset == "cifar10" else 1
  rows = [
    Row(name, f"configs/{size}_{dataset}.py:{args}", model, (c10, c100)[column])
    for name, size, args, model, c10, c100 in spec
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


def _imagenet_rows() -> list[Row]:
  # Paper Table 3, ViT-B on 5% / 10% / 50% of ImageNet-1k.
  spec = [
    ("Agent-B", "mode=agent", "agent", (35.28, 47.46, 68.13)),
    ("ViT-B", "mode=vit", "vit", (16.60, 28.11, 63.40)),
    ("Ours-Joint", "mode=joint", "vit", (36.01, 49.73, 71.36)),
    ("Ours-Shared", "mode=shared", "vit", (33.06, 45.75, 66.48)),
    ("ViT-B-SAM", "mode=vit,sam=1", "vit", (16.67, 28.66, 64.37)),
    ("ViT-B-Sparse", "mode=vit,attention=entmax", "vit", (10.39, 28.92, 66.01)),
  ]
  rows = [
    Row(
      f"{name} {int(subset * 100)}%", f"configs/vitb_imagenet.py:subset={subset},{args}", model, p
    )
    for name, args, model, paper in spec
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


def rows(table: str) -> list[Row]:
  return _imagenet_rows() if table == "imagenet" else _cifar_rows(table)


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
    "| row | model | paper top-1 | ours top-1 | epochs | workdir |",
    "|---|---|---|---|---|---|",
  ]
  for row in rows(table):
    workdir = pathlib.Path(command(row, root, overrides)[4].split("=", 1)[1])
    final_path = workdir / "final.json"
    ours, epochs = "not run", ""
    if final_path.exists():
      final = json.loads(final_path.read_text())
      ours = f"{100 * final[f'top1_{row.model}']:.2f}"
      epochs = f"{final['epochs']:g}"
    lines.append(f"| {row.name} | {row.model} | {row.paper:.2f} | {ours} | {epochs} | {workdir} |")
  return "\n".join(lines)


_TABLE = None
_ROOT = None
_RUN = None
_OVERRIDES = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _TABLE, _ROOT, _RUN, _OVERRIDES
  _TABLE = flags.DEFINE_enum("table", "cifar100", ["cifar10", "cifar100", "imagenet"], "Table.")
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

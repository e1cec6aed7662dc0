"""The paper's published numbers, in one place: final-epoch top-1 (%) per table, row and model.

Source: "Bootstrapping ViTs: Towards Liberating Vision Transformers from Pre-training" (Zhang et
al., CVPR 2022), Tables 1, 3, 4 and 5, which the authors' README repeats. The sweep runner
(`python -m vitboot_jax.tools.sweep --table=NAME`) prints these beside ours; `markdown(...)`
renders them for the README.

A table maps a row label to {model: top-1}, where model is the network whose accuracy the paper
reports: "vit", "agent" or "cnn" (a joint or shared row reports two models of one run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

PAPER = "Bootstrapping ViTs (CVPR 2022)"


@dataclasses.dataclass(frozen=True)
class PaperTable:
  title: str  # What the table measures.
  source: str  # Where in the paper the numbers are printed.
  column: str  # Short header when several tables share one markdown table.
  top1: Mapping[str, Mapping[str, float]]  # row -> model -> final-epoch top-1 (%).


def _table1(column: int) -> dict[str, dict[str, float]]:
  # Table 1 rows as (CIFAR-10, CIFAR-100) pairs per model.
  pairs = {
    "Agent-S": {"agent": (94.18, 74.62)},
    "Agent-B": {"agent": (94.83, 74.78)},
    "ViT-S": {"vit": (87.32, 61.25)},
    "ViT-B": {"vit": (79.24, 53.07)},
    "Ours-Joint S": {"agent": (94.90, 74.06), "vit": (95.14, 76.19)},
    "Ours-Joint B": {"agent": (95.06, 76.57), "vit": (95.00, 77.83)},
    "Ours-Shared S": {"agent": (93.22, 74.06), "vit": (93.72, 75.50)},
    "Ours-Shared B": {"agent": (92.66, 74.11), "vit": (93.34, 75.71)},
    "ViT-S-SAM": {"vit": (87.77, 62.60)},
    "ViT-S-Sparse": {"vit": (87.43, 62.29)},
    "ViT-B-SAM": {"vit": (86.57, 58.18)},
    "ViT-B-Sparse": {"vit": (83.87, 57.22)},
    "ResNet50": {"cnn": (94.92, 77.57)},
    "EfficientNet-B2": {"cnn": (94.14, 75.55)},
    # Fine-tuned from ImageNet-1k weights (ViT-B from DeiT's release, the table's dagger).
    "Pre-trained ViT-S": {"vit": (95.70, 80.91)},
    "Pre-trained ViT-B": {"vit": (97.17, 84.95)},
  }
  return {row: {m: p[column] for m, p in models.items()} for row, models in pairs.items()}


def _table3() -> dict[str, dict[str, float]]:
  # Table 3 rows as (5%, 10%, 50% of the ImageNet-1k training images) per model.
  triples = {
    "Agent-B": ("agent", (35.28, 47.46, 68.13)),
    "ViT-B": ("vit", (16.60, 28.11, 63.40)),
    "Ours-Joint": ("vit", (36.01, 49.73, 71.36)),
    "Ours-Shared": ("vit", (33.06, 45.75, 66.48)),
    "ViT-B-SAM": ("vit", (16.67, 28.66, 64.37)),
    "ViT-B-Sparse": ("vit", (10.39, 28.92, 66.01)),
    "ResNet50": ("cnn", (35.43, 50.86, 70.05)),
  }
  return {
    f"{row} {percent}%": {model: top1[i]}
    for row, (model, top1) in triples.items()
    for i, percent in enumerate((5, 10, 50))
  }


TABLES: dict[str, PaperTable] = {
  "cifar10": PaperTable(
    title="CIFAR-10 from scratch (240 epochs, 224 px), CNNs and pre-trained ViTs",
    source=f"{PAPER}, Table 1",
    column="CIFAR-10",
    top1=_table1(0),
  ),
  "cifar100": PaperTable(
    title="CIFAR-100 from scratch (240 epochs, 224 px), CNNs and pre-trained ViTs",
    source=f"{PAPER}, Table 1",
    column="CIFAR-100",
    top1=_table1(1),
  ),
  "imagenet": PaperTable(
    title="ImageNet-1k with 5%, 10% and 50% of the training images, ViT-B",
    source=f"{PAPER}, Table 3",
    column="ImageNet-1k",
    top1=_table3(),
  ),
  "ablation": PaperTable(
    title="Ablations of Ours-Joint ViT-S on CIFAR-100 (loss terms, decay, adapter, agent stem)",
    source=f"{PAPER}, Table 4 (T4) and Table 5 (T5)",
    column="CIFAR-100",
    top1={
      "T4 Baseline (ViT-S)": {"vit": 61.25},
      "T4 KD Only": {"vit": 67.16},
      "T4 Feat Only, No Decay": {"vit": 73.59},
      "T4 Feat Only": {"vit": 74.94},
      "T4 Feat Only, AP-2D": {"vit": 71.06},
      "T4 Both, No Decay": {"vit": 75.15},
      "T4 Both (Ours-Joint S)": {"vit": 76.19},
      # Table 5 prints Agent-S alone (res-like) as 74.78, Table 1 as 74.62.
      "T5 Agent-S base": {"agent": 72.73},
      "T5 Joint base": {"vit": 73.18, "agent": 73.79},
    },
  ),
}


def top1(table: str, row: str, model: str) -> float | None:
  """The published top-1 (%) of `model` in `row` of `table`, or None where the paper has none."""
  return TABLES[table].top1.get(row, {}).get(model)


MODEL_LABELS = {"vit": "ViT", "agent": "agent", "cnn": "CNN"}


def markdown(*tables: str) -> str:
  """The published top-1 of one or more tables as one markdown table (a column per table).

  markdown("cifar10", "cifar100") is Table 1; rows appear in the order of the first table that
  has them, and a table without a row leaves its cell empty.
  """
  if not tables:
    raise ValueError(f"name at least one table of {list(TABLES)}")
  unknown = [t for t in tables if t not in TABLES]
  if unknown:
    raise ValueError(f"unknown tables {unknown}; choose from {list(TABLES)}")
  keys = []
  for name in tables:
    for row, models in TABLES[name].top1.items():
      keys += [(row, model) for model in models if (row, model) not in keys]
  sources = "; ".join(dict.fromkeys(TABLES[t].source for t in tables))
  header = ["row", "model", *(f"{TABLES[t].column} top-1 (%)" for t in tables)]
  lines = [
    f"Published final-epoch top-1 ({sources}):",
    "",
    "| " + " | ".join(header) + " |",
    "|" + "---|" * len(header),
  ]
  for row, model in keys:
    cells = [top1(t, row, model) for t in tables]
    cells = ["" if c is None else f"{c:.2f}" for c in cells]
    lines.append("| " + " | ".join([row, MODEL_LABELS[model], *cells]) + " |")
  return "\n".join(lines) + "\n"

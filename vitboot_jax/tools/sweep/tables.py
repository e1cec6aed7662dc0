"""What a sweep table is, and the tables' data: rows of config files with their args, the
models whose final top-1 each reports and the paper's top-1 of each (paper_results.py).
sweep/__main__.py describes every table; runs.py runs their rows, report.py reads the results
into tables and figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vitboot_jax.tools.sweep import paper_results

DRLOC_LAMBDA = 0.1

# Which recipe a paper row runs (the report's "recipe" column).
CODE = "authors' code"  # The authors' config and code, which made the published numbers.
ALIGN = "paper Alg. 1 (Align)"  # Shared with the paper's Align; absent from the authors' code.
PAPER_B = "paper: ViT-B + entmax"  # Table 1's label and parameter count for ViT-B-Sparse.
SHIPPED_S = "authors' yaml: ViT-S shape"  # vit-base-entmax.yaml == vit-small-entmax.yaml.
ABLATION = "authors' code + Table 4 switch"  # No shipped config: one loss switch of Ours-Joint S.
# The paper gives no fine-tuning recipe; the authors' single-model worker runs the ViT recipe.
FINE_TUNE = "ours: authors' ViT recipe from imported weights"

MODEL_LABELS = paper_results.MODEL_LABELS


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
  # A row every other row's ViT is set against (difference, pooled std, per seed; sweep_report).
  reference: str | None = None
  # Report each row's training compute in FLOPs from its traced train step (tools/train_compute.py).
  compute: bool = False
  # Pick the winner on the validation split (never the test split): the best mean validation
  # top-1 of the ViT at the final epoch; of the rows within this many points of it, the first in
  # table order (the fewest switches). None: the table chooses nothing.
  choose_within: float | None = None


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
  b2 = ("--config.optim.b2=0.99",)
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
      "joint_corr_form",
      "mode=joint,form=corr",
      "3 form: correlation over positions (no reward for the image's mean target)",
    ),
    row(
      "joint_gate35",
      "mode=joint,gate=0.35",
      "1 teacher: hint on once the agent's train top-1 >= 35%",
    ),
    row("joint_pool2d", "mode=joint,adapt=pool2d", "4 geometry: 2-D pooling of the agent's grid"),
    row("joint_kd_only", "mode=joint,feature=0", "reference: joint without the hint (KD only)"),
    row("shared_noalign", "mode=shared,align=none", "reference: official shared"),
    # Rows the first runs suggested (labelled variants of the recipe, as the switches are).
    row(
      "joint_teacher_frozen_until10",
      "mode=joint,frozen=1,until=0.1",
      "1 teacher + 2 timing: the frozen finished agent, hint in the first 10% of steps only",
      overrides=teacher,
    ),
    row(
      "joint_teacher_frozen_corr",
      "mode=joint,frozen=1,form=corr",
      "1 teacher + 3 form: the frozen finished agent, hint as correlation over positions",
      overrides=teacher,
    ),
    row(
      "vit_lr_half",
      "mode=vit",
      "reference: ViT alone at half the lr (what half of the ViT's step costs)",
      ("vit",),
      overrides=("--config.optim.lr=5e-4",),
    ),
    row(
      "vit_lr_quarter",
      "mode=vit",
      "reference: ViT alone at a quarter of the lr",
      ("vit",),
      overrides=("--config.optim.lr=2.5e-4",),
    ),
    row("vit_b2", "mode=vit", "5 optimizer: ViT alone, Adam b2 0.99", ("vit",), overrides=b2),
    row(
      "joint_b2",
      "mode=joint",
      "5 optimizer: Adam b2 0.99 (remembers the hint's gradients ~100 steps, not ~1000)",
      overrides=b2,
    ),
    row(
      "joint_until10_b2",
      "mode=joint,until=0.1",
      "5 optimizer: hint in the first 10% of steps only, Adam b2 0.99",
      overrides=b2,
    ),
  )


def _helps_rows(config: str) -> tuple[Row, ...]:
  """Can the agent help the ViT: the references, then one labelled candidate recipe a row (each a
  switch of configs/common.py, off by default), where the agent leads the ViT (20 epochs)."""

  def row(name: str, args: str, note: str, models=("vit", "agent"), overrides=()) -> Row:
    return Row(name, f"{config}:{args}", models, note, tuple(overrides), run=name)

  teacher = (f"--config.agent_init_from={AGENT_RUN}",)
  # The agent-alone row is every teacher row's teacher, so it runs before them.
  return (
    row("vit", "mode=vit", "reference: ViT alone", ("vit",)),
    row("agent", "mode=agent", "reference: agent alone (the teacher rows' teacher)", ("agent",)),
    row("joint", "mode=joint", "reference: official joint (ce 1, kd 1, feature 10)"),
    row(
      "kd_teacher",
      "mode=joint,feature=0,frozen=1",
      "1 soft KD only, from the finished agent, frozen",
      overrides=teacher,
    ),
    row(
      "deit_hard",
      "mode=joint,distill=hard,feature=0,kd=0,frozen=1",
      "2 DeiT hard distillation: a distillation token learns the finished frozen agent's argmax",
      overrides=teacher,
    ),
    row(
      "teacher_corr",
      "mode=joint,frozen=1,form=corr",
      "3 KD + the correlation hint, from the finished agent, frozen",
      overrides=teacher,
    ),
    # Ours, after the first results (soft KD from the finished agent led at epochs 5 and 10): the
    # same teacher as it predicts at inference, without dropout noise or moving statistics.
    row(
      "kd_teacher_eval",
      "mode=joint,feature=0,frozen=1,teacher_eval=1",
      "5 (ours) soft KD only, from the finished agent, frozen, predicting in evaluation mode",
      overrides=teacher,
    ),
    row(
      "shared_nohint",
      "mode=shared,align=pcgrad,feature=0",
      "4 shared with Align, no hint (KD both ways)",
    ),
  )


# The compute-matched epochs of the well_trained table, counted from the traced train steps before
# any run (docs/results.md): teacher_corr's 20 epochs with its teacher's 20-epoch run, and without.
MATCHED_TOTAL_EPOCHS = 86
MATCHED_OWN_EPOCHS = 37
DEIT_TEACHER_RUN = "{root}/agent_deit_seed{seed}"
SHORT_TEACHER_RUN = "{root}/agent_e10_seed{seed}"


def _well_trained_rows(config: str) -> tuple[Row, ...]:
  """Does the agent help a well-trained ViT: the helps references and teacher rows (the same
  commands, so their records are reused), the ViT alone with label smoothing and given
  teacher_corr's compute, and the same with the field's recipe (recipe=deit)."""

  def row(name: str, args: str, note: str, models=("vit",), overrides=()) -> Row:
    return Row(name, f"{config}:{args}", models, note, tuple(overrides), run=name)

  teacher = (f"--config.agent_init_from={AGENT_RUN}",)
  total, own = MATCHED_TOTAL_EPOCHS, MATCHED_OWN_EPOCHS
  pair = ("vit", "agent")
  corr, kd = "mode=joint,frozen=1,form=corr,epochs=20", "mode=joint,feature=0,frozen=1,epochs=20"
  return (
    row("vit", "mode=vit,epochs=20", "reference: ViT alone (helps)"),
    row("agent", "mode=agent,epochs=20", "agent alone, the teacher below (helps)", ("agent",)),
    row("teacher_corr", corr, "KD + correlation hint from it, frozen (helps)", pair, teacher),
    row("kd_teacher", kd, "soft KD only from it, frozen (helps)", pair, teacher),
    row("vit_ls", "mode=vit,epochs=20,smoothing=0.1", "1 ViT alone, label smoothing 0.1"),
    row(
      "vit_matched_own",
      f"mode=vit,epochs={own}",
      f"2 ViT alone, {own} epochs: teacher_corr's own compute",
    ),
    row(
      "vit_matched_total",
      f"mode=vit,epochs={total}",
      f"2 ViT alone, {total} epochs: teacher_corr's compute with its teacher's run",
    ),
    *_recipe_rows(config, ",epochs=20", "3 "),
    # Ours, after the first result (the ViT alone at teacher_corr's own compute, 37 epochs, stays
    # below it): can the teacher's run, the larger share of the compute, be shorter?
    row(
      "agent_e10",
      "mode=agent,epochs=10",
      "4 (ours) agent alone, 10 epochs: a shorter teacher",
      ("agent",),
    ),
    row(
      "teacher_corr_short",
      corr,
      "4 (ours) teacher_corr from the 10-epoch agent",
      pair,
      (f"--config.agent_init_from={SHORT_TEACHER_RUN}",),
    ),
    row(
      "vit_deit_matched_total",
      f"mode=vit,epochs={total},recipe=deit",
      f"3 ViT alone, DeiT's recipe, {total} epochs (recounted on the recipe's steps first)",
    ),
  )


def _recipe_rows(config: str, epochs: str = "", label: str = "") -> tuple[Row, ...]:
  """The rows with the field's recipe (recipe=deit): the agent alone (their teacher), the ViT
  alone, and teacher_corr and kd_teacher from that agent; `epochs` (",epochs=N") after each
  row's mode args, else the config's (the 224-px ones take theirs from launch/rung3_224.sh)."""

  def row(name: str, args: str, note: str, models=("vit",), overrides=()) -> Row:
    config_args = f"{config}:{args}{epochs},recipe=deit"
    return Row(name, config_args, models, f"{label}{note}", tuple(overrides), run=name)

  teacher = (f"--config.agent_init_from={DEIT_TEACHER_RUN}",)
  pair = ("vit", "agent")
  corr, kd = "mode=joint,frozen=1,form=corr", "mode=joint,feature=0,frozen=1"
  return (
    row("vit_deit", "mode=vit", "ViT alone, DeiT's recipe"),
    row("agent_deit", "mode=agent", "agent alone, DeiT's recipe: the teacher below", ("agent",)),
    row(
      "teacher_corr_deit",
      corr,
      "KD + correlation hint from it, frozen, DeiT's recipe",
      pair,
      teacher,
    ),
    row("kd_teacher_deit", kd, "soft KD only from it, frozen, DeiT's recipe", pair, teacher),
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
    overrides=("--config.data.pipeline=device", SHARES),
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
_TABLES += (
  Table(
    "mechanism_tokens16",
    "Why the hint costs the ViT, at 16x16 tokens (CIFAR-10 10%, 32 px, patch 2)",
    _mechanism_rows("configs/cifar10_tokens16.py"),
    root="workdirs/mechanism_tokens16",
    **_REPLICATION,  # 10 epochs, as the 16x16-token replication; on a GPU: launch/rung3_224.sh.
  ),
)
_TABLES += (
  Table(
    "helps",
    "Can the agent help the ViT? Labelled recipes where the agent leads (8x8 tokens, 20 epochs)",
    _helps_rows("configs/quickstart.py"),
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
    _helps_rows("configs/vits_cifar10.py"),
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
    _well_trained_rows("configs/quickstart.py"),
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
    _recipe_rows("configs/vits_cifar10.py"),
    root="workdirs/well_trained_224",
    note_header="description",
    # The data (an .npz of the 10% subset) and the epochs come from launch/rung3_224.sh.
    overrides=("--config.data.pipeline=device",),
    compute=True,
  ),
)
# The small-data baseline (8x8 tokens, 5,000 images): every run holds 500 images a class out of
# the rest of the training split and is chosen on them, never on the test split.
VALIDATION = ("--config.data.val_split=held_out", "--config.data.val_fraction=0.1")
BASELINE_EPOCHS = 100
# Warmup, no decay on norms/biases/embeddings, one clipping rule for every arm (big_vision, timm).
HYGIENE = (
  "--config.optim.warmup_epochs=5",
  "--config.optim.decay_all=false",
  "--config.optim.clip_norm=1.0",
)
# The augmentation strengths of the screening, weakest first (DeiT's is recipe=deit).
AUGMENTATION = {
  "light": "randaug=rand-m5-mstd0.5-inc1,smoothing=0.1,drop_path=0.05",
  "medium": "randaug=rand-m9-mstd0.5-inc1,smoothing=0.1,drop_path=0.1",
  "deit": "recipe=deit",
}
# The init of the augmentation rows: the better of base_hygiene and base_hygiene_std on
# validation (docs/results.md, "An honest ViT baseline": the rule, written before the runs).
BASELINE_INIT = "official"


def _baseline_rows(config: str, init: str = BASELINE_INIT) -> tuple[Row, ...]:
  """The screening grid of the ViT alone at 100 epochs: the official recipe and standard init,
  the same with the training hygiene (HYGIENE), then three augmentation strengths."""

  def row(name: str, args: str, note: str, overrides=()) -> Row:
    epochs = f"mode=vit,epochs={BASELINE_EPOCHS}"
    return Row(name, f"{config}:{epochs}{args}", ("vit",), note, tuple(overrides), run=name)

  chosen = "" if init == "official" else f",init={init}"
  return (
    row("base_official", "", "G1 the official recipe (the paper's ViT alone)"),
    row("base_std", ",init=standard", "G2 G1 with standard init (timm's)"),
    row("base_hygiene", "", "G3 G1 + warmup 5, decay mask, clip 1.0", HYGIENE),
    row("base_hygiene_std", ",init=standard", "G4 G3 with standard init", HYGIENE),
    *(
      row(f"aug_{level}", f"{chosen},{args}", f"G{5 + i} G3/G4's winner + {level} aug", HYGIENE)
      for i, (level, args) in enumerate(AUGMENTATION.items())
    ),
  )


_TABLES += (
  Table(
    "baseline",
    "An honest ViT baseline, screened on validation (8x8 tokens, 5,000 images, 100 epochs)",
    _baseline_rows("configs/quickstart.py"),
    root="workdirs/baseline",
    note_header="description",
    seeds=(0,),
    data_folder=True,
    overrides=("--config.eval_every_epochs=5", *VALIDATION),
    reference="base_official",
    compute=True,
    choose_within=0.2,
  ),
  Table(
    "teachers",
    "Finished teachers, chosen on validation (5,000 images, 32 px)",
    (
      Row(
        "agent_e100",
        f"configs/quickstart.py:mode=agent,epochs={BASELINE_EPOCHS}",
        ("agent",),
        "the agent alone, its official recipe, 100 epochs",
        run="agent_e100",
      ),
    ),
    root="workdirs/teachers",
    note_header="description",
    seeds=(0, 1),
    data_folder=True,
    overrides=("--config.eval_every_epochs=5", *VALIDATION),
    compute=True,
  ),
)
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

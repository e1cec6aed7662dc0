"""The rows of the study tables (tables.py gathers them): the CPU-scale replication, the mechanism
study (why the hint costs the ViT), whether the agent helps, and a well-trained ViT with and
without it, with the field's recipe. Each row is a labelled config switch; docs/results.md holds
what they found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vitboot_jax.tools.sweep.spec import Row

DRLOC_LAMBDA = 0.1


def replication_rows(config: str, names: Sequence[str] | None = None) -> tuple[Row, ...]:
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


def mechanism_rows(config: str) -> tuple[Row, ...]:
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


def helps_rows(config: str) -> tuple[Row, ...]:
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


def well_trained_rows(config: str) -> tuple[Row, ...]:
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
    *recipe_rows(config, ",epochs=20", "3 "),
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


def recipe_rows(config: str, epochs: str = "", label: str = "") -> tuple[Row, ...]:
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
# validation (docs/results.md, "An honest ViT baseline": the rule, written before the runs, and
# the two runs it read).
BASELINE_INIT = "standard"


def baseline_rows(config: str, init: str = BASELINE_INIT) -> tuple[Row, ...]:
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


# The DrLoc paper's loss weight for a plain ViT (ViT-B/16, its Supp. C and Table 9); DRLOC_LAMBDA
# is its value for T2T-ViT and CvT (Swin's is 0.5), which the earlier short studies used.
DRLOC_VIT_LAMBDA = 0.01
# The seeds' own methods on the chosen baseline (issue 81, item 5), fixed before their runs: the
# grid's winner, then the same with mimetic init, impulse-3 init and DrLoc at the paper's weight
# for a plain ViT. Registered as the table `baseline_methods` once tables.BASELINE_WINNER names
# the winner.
SEED_METHODS = {
  "mimetic": "init=mimetic",
  "impulse3": "init=impulse3",
  "drloc": f"drloc={DRLOC_VIT_LAMBDA:g}",
}
# What each paper claims over its own baseline, in points of top-1 (the verdict's yardstick):
# structured initialisation's Table 2 against truncated normal (CIFAR-10, 200 epochs, ViT-Tiny
# with patch 2), DrLoc's Table 9 (ViT-B/16, CIFAR-10 at 224 px, 100 epochs).
SEED_METHOD_PAPER_GAINS = {"mimetic": 2.53, "impulse3": 2.99, "drloc": 2.21}


def seed_method_rows(winner: Row, epochs: int = BASELINE_EPOCHS) -> tuple[Row, ...]:
  """The winner at `epochs` (the grid's run of it reused at the grid's schedule), and one row per
  seed method: the winner's config with that one switch (an init replaces the winner's)."""
  path, _, args = winner.config.partition(":")
  kept = [f"epochs={epochs}" if a.startswith("epochs=") else a for a in args.split(",") if a]
  base_run = winner.run_name if epochs == BASELINE_EPOCHS else f"{winner.name}_e{epochs}"

  def row(name: str, own: list[str], note: str, run: str) -> Row:
    return Row(name, f"{path}:{','.join(own)}", winner.models, note, winner.overrides, run=run)

  rows = [row(winner.name, kept, "the baseline (the grid's winner)", base_run)]
  for name, switch in SEED_METHODS.items():
    key = switch.split("=")[0]
    own = [a for a in kept if not a.startswith(f"{key}=")] + [switch]
    rows.append(row(name, own, f"the baseline + {switch}", f"{name}_e{epochs}"))
  return tuple(rows)


# The teachers of the small-data study (issue 84), each trained alone on the same 5,000 images with
# the baseline's validation split: the agent at the baseline's length with its official recipe, and
# He et al.'s CIFAR ResNets with theirs (configs/cifar_resnet.py: 180 epochs here).
TEACHERS = {
  "agent_e100": (
    f"configs/quickstart.py:mode=agent,epochs={BASELINE_EPOCHS}",
    ("agent",),
    f"the agent alone, its official recipe, {BASELINE_EPOCHS} epochs",
  ),
  "resnet20": (
    "configs/cifar_resnet.py:model=resnet20",
    ("cnn",),
    "resnet20 alone, He et al.'s recipe",
  ),
  "resnet56": (
    "configs/cifar_resnet.py:model=resnet56",
    ("cnn",),
    "resnet56 alone, He et al.'s recipe",
  ),
}
# Each teacher's training epochs (of the same 4,992 images an epoch as the ViT's, batch 64 or 128).
TEACHER_EPOCHS = {"agent_e100": BASELINE_EPOCHS, "resnet20": 180, "resnet56": 180}


def teacher_rows(names: Sequence[str] = tuple(TEACHERS)) -> tuple[Row, ...]:
  """The teachers named, each trained alone (its run is every student row's teacher)."""
  return tuple(Row(n, TEACHERS[n][0], TEACHERS[n][1], TEACHERS[n][2], run=n) for n in names)


# The ViT alone given a student row's whole compute (issue 84, item 5), the strict reading: the
# student's 100 epochs of KD + the correlation hint (teacher frozen: its forward only) plus its
# teacher's training run, in epochs of the ViT alone's step. Counted from the traced train steps
# before any run (MACs an image: ViT 216.9M, student from the agent 395.2M, from ResNet-20 260.6M,
# from ResNet-56 345.5M; agent alone 533.1M, ResNet-20 121.2M, ResNet-56 376.0M; tested).
MATCHED_EPOCHS = {"agent_e100": 428, "resnet20": 221, "resnet56": 472}
# The clipping every arm of a student comparison shares where the winner sets none itself (the
# official ViT-alone arm's, configs/quickstart.py; the teacher arms have none there).
STUDENT_CLIP = "--config.optim.clip_norm=0.1"
STUDENTS = {
  "corr": ("mode=joint,frozen=1,form=corr", "KD + the correlation hint"),
  "kd": ("mode=joint,frozen=1,feature=0", "soft KD alone"),
}


def student_rows(winner: Row, teacher: str, other: str) -> tuple[Row, ...]:
  """The students of the baseline (issue 84, items 4-6), fixed before their runs: the winner (its
  grid run reused), both teachers (their runs reused), KD + the correlation hint from `teacher`
  frozen in train mode and in evaluation mode, KD alone from it, the hint from `other`, the ViT
  alone given the first student's compute with its teacher's run, and the paper's joint mode; each
  on the winner's args and flags (its mode replaced), the same clipping in every arm."""
  path, _, args = winner.config.partition(":")
  kept = ",".join(a for a in args.split(",") if a and not a.startswith("mode="))
  flags = winner.overrides
  if not any(f.startswith(STUDENT_CLIP.split("=")[0] + "=") for f in flags):
    flags += (STUDENT_CLIP,)

  def student(kind: str, name: str, extra: str = "", note: str = "") -> Row:
    mode, what = STUDENTS[kind]
    cnn = "" if TEACHERS[name][1] == ("agent",) else f",teacher_cnn={name}"
    config = f"{path}:{mode}{cnn},{kept}{extra}"
    init = (f"--config.agent_init_from={{root}}/{name}_seed{{seed}}",)
    run = f"{kind}_{name}" + ("_eval" if extra else "")
    return Row(run, config, ("vit",), f"{what} from {name}, frozen{note}", flags + init, run=run)

  matched = ",".join(
    f"epochs={MATCHED_EPOCHS[teacher]}" if a.startswith("epochs=") else a for a in kept.split(",")
  )
  return (
    Row(
      winner.name,
      winner.config,
      ("vit",),
      "the baseline: the grid's winner, the ViT alone",
      winner.overrides,
      run=winner.run_name,
    ),
    *teacher_rows((teacher, other)),
    student("corr", teacher),
    student("corr", teacher, ",teacher_eval=1", ", predicting in evaluation mode"),
    student("kd", teacher),
    student("corr", other),
    Row(
      f"vit_matched_{teacher}",
      f"{path}:mode=vit,{matched}",
      ("vit",),
      f"the ViT alone, {MATCHED_EPOCHS[teacher]} epochs: corr_{teacher}'s compute with its "
      "teacher's run",
      winner.overrides,
      run=f"vit_matched_{teacher}",
    ),
    Row(
      "joint",
      f"{path}:mode=joint,{kept}",
      ("vit", "agent"),
      "the paper's joint mode (ViT + agent trained together, official loss weights)",
      flags,
      run="joint",
    ),
  )


def longer_student_rows(
  winner: Row, teacher: str, other: str, epochs: int, teacher_eval: bool
) -> tuple[Row, ...]:
  """The students at the baseline's longer schedule where issue 81's schedule check chose it
  (issue 84, item 4), fixed before their runs: the winner at `epochs` (the schedule check's run
  reused), both teachers (their runs reused), KD + the correlation hint from `teacher` in the mode
  the shorter table chose on validation (`teacher_eval`), KD alone from it and the hint from
  `other`; each a student_rows row with only its epochs changed."""
  shorter = {r.run_name: r for r in student_rows(winner, teacher, other)}
  names = (f"corr_{teacher}" + ("_eval" if teacher_eval else ""), f"kd_{teacher}", f"corr_{other}")

  def longer(row: Row) -> Row:
    path, _, args = row.config.partition(":")
    args = ",".join(f"epochs={epochs}" if a.startswith("epochs=") else a for a in args.split(","))
    run = f"{row.run_name}_e{epochs}"
    return dataclasses.replace(row, name=run, config=f"{path}:{args}", run=run)

  base = seed_method_rows(winner, epochs)[0]
  return (base, *teacher_rows((teacher, other)), *(longer(shorter[n]) for n in names))

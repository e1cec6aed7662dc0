r"""The finished-teacher recipe in one command: the teacher trained alone, then the ViT taught by
it, frozen, with KD and the correlation hint (`teacher_corr` of the helps table).

  python -m vitboot_jax.tools.teach --config=configs/quickstart.py:epochs=20 --workdir=DIR \
    [--teacher=agent|resnet20|resnet32|resnet56|PATH] [--student=corr|kd] [--config.FIELD=VALUE ...]

Stage 1 trains the teacher into DIR/teacher: the config's agent (`mode=agent`, the default), or a
CIFAR ResNet with its own recipe (configs/cifar_resnet.py) on the student's data (its data fields
and image size, so both see the same images); `--teacher=PATH` names a finished run of ours
instead (an agent's or a CNN's) and skips stage 1. Stage 2 trains `mode=joint,frozen=1` and
`form=corr` (or `feature=0`: soft KD alone, `--student=kd`) into DIR/student, its teacher read
from the teacher's run (`config.agent_init_from`, which the student's config.json records; a CNN
as `teacher_cnn=NAME`, its hint from the CNN's stages). The config's args and every --config.*
flag reach both stages (a ResNet teacher takes only the --config.data.*, image_size, seed and
total_steps flags: the rest is the ViT's recipe). Each stage is `python -m vitboot_jax.main`, so
each is what any run is: resumable after a kill at any point, and a finished stage only logs its
results again. Re-running the same command is the whole recovery. SIGTERM or Ctrl-C reaches the
stage in progress, which saves and exits; this command exits with its code. Each stage's command
is printed as it runs (a shell runs it as printed), and the last line gives both models' top-1 on
the evaluation split and the commands that classify images and export the student's ViT.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import sys
from collections.abc import Sequence

from vitboot_jax.base import cli
from vitboot_jax.base.errors import unknown_choice
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import study_rows

# The students' args (KD + the correlation hint, or soft KD alone): the study's, one definition.
STUDENTS = {name: args for name, (args, _) in study_rows.STUDENTS.items()}
# Args the stages set themselves; a user's value would be silently overridden.
_OWN_ARGS = ("mode", "frozen", "teacher", "form", "feature", "teacher_cnn")
USAGE = " ".join(line.strip() for line in __doc__.splitlines()[3:5]).replace("\\ ", "")
# Teachers stage 1 trains: the config's agent, or a CIFAR ResNet with its own recipe.
RESNETS = ("resnet20", "resnet32", "resnet56")
RESNET_CONFIG = cli.CONFIGS_DIR / "cifar_resnet.py"
# What a ResNet teacher takes from the student's config, so both train on the same images, seen
# the same way (the student's batches reach its frozen teacher as they are).
_SAME_DATA = (
  "name", "dir", "train_split", "eval_split", "num_classes", "train_fraction", "val_split",
  "val_fraction", "normalisation", "stored_size", "pipeline",
)  # fmt: skip
# The user's flags a ResNet teacher takes too (a smoke run's step cap among them).
_SHARED_FLAGS = (
  "--config.data.",
  "--config.image_size=",
  "--config.seed=",
  "--config.total_steps=",
)


def stage_dirs(workdir: str, teacher: str = "agent") -> tuple[str, str]:
  """The teacher's and the student's workdirs: DIR/teacher (or the finished run --teacher names)
  and DIR/student, absolute."""
  root = os.path.abspath(workdir)
  trained = teacher == "agent" or teacher in RESNETS
  teacher_dir = os.path.join(root, "teacher") if trained else os.path.abspath(teacher)
  return teacher_dir, os.path.join(root, "student")


def teacher_kind(teacher: str) -> str:
  """ "agent", a CIFAR ResNet's name, or for a finished run (PATH) its mode ("agent", "joint")
  or its CNN's name; ValueError where PATH is not a run of ours."""
  if teacher == "agent" or teacher in RESNETS:
    return teacher
  saved = pathlib.Path(teacher) / workdir_rules.CONFIG_FILE
  if not saved.is_file():
    raise ValueError(
      f"--teacher={teacher} is neither agent, {', '.join(RESNETS)} nor the workdir of a run of "
      f"ours (no {workdir_rules.CONFIG_FILE} there)"
    )
  recorded = json.loads(saved.read_text())
  if recorded.get("mode") == "cnn":
    return recorded["cnn"]["name"]
  if recorded.get("mode") in ("agent", "joint"):
    return "agent"
  raise ValueError(
    f"--teacher={teacher} is a run of mode {recorded.get('mode')!r}, which has no agent or CNN "
    "to teach with; give a run of mode agent or cnn"
  )


def _resnet_stage(config: str, name: str, workdir: str, extra: Sequence[str]) -> list[str]:
  """A ResNet teacher's run: its own recipe on the student's data (the student config's data
  fields and image size as flags, then the user's data, image size and seed flags)."""
  student = cli.load_config(config)
  same = [f"--config.data.{k}={student.data[k]}" for k in _SAME_DATA if student.data[k] is not None]
  shared = [flag for flag in extra if flag.startswith(_SHARED_FLAGS)]
  return [
    f"--config={RESNET_CONFIG}:model={name}",
    f"--workdir={workdir}",
    *same,
    f"--config.image_size={student.image_size}",
    *shared,
  ]


def stage_commands(
  config: str,
  workdir: str,
  student: str = "corr",
  extra: Sequence[str] = (),
  teacher: str = "agent",
) -> list[tuple[str, list[str]]]:
  """[(stage, command)] of the teacher's run (none for a finished run's PATH) and the student's;
  ValueError for a bad request."""
  if student not in STUDENTS:
    raise ValueError(unknown_choice("--student", student, STUDENTS))
  kind = teacher_kind(teacher)
  path, _, args = config.partition(":")
  given = [a.split("=", 1)[0].strip() for a in args.split(",") if a.strip()]
  clash = sorted(set(given) & set(_OWN_ARGS))
  if clash:
    raise ValueError(
      f"--config={config} sets {', '.join(clash)}, which this command sets for each stage; "
      "drop them"
    )
  for flag in extra:
    if flag.split("=", 1)[0] in ("--config.mode", "--config.agent_init_from", "--workdir"):
      raise ValueError(f"{flag}: this command sets it for each stage; drop it")
  path = os.path.abspath(path)  # The stages run from the caller's directory, as given.
  teacher_dir, pupil = stage_dirs(workdir, teacher)

  def spec(stage_args: str) -> str:
    return f"{path}:{','.join(a for a in (args, stage_args) if a)}"

  main = [sys.executable, "-m", "vitboot_jax.main"]
  student_args = STUDENTS[student] + ("" if kind == "agent" else f",teacher_cnn={kind}")
  stages: list[tuple[str, list[str]]] = [
    (
      "student",
      [
        *main,
        f"--config={spec(student_args)}",
        f"--workdir={pupil}",
        f"--config.agent_init_from={teacher_dir}",
        *extra,
      ],
    ),
  ]
  if teacher == "agent":
    own = [f"--config={spec('mode=agent')}", f"--workdir={teacher_dir}", *extra]
  elif teacher in RESNETS:
    own = _resnet_stage(config, teacher, teacher_dir, extra)
  else:
    return stages  # A finished run teaches: nothing to train first.
  return [("teacher", [*main, *own]), *stages]


def _top1(workdir: str, model: str) -> str:
  """A finished stage's top-1 of `model` (final.json), as the progress lines give it, with its
  validation top-1 where the run held a validation split."""
  try:
    final = json.loads((pathlib.Path(workdir) / workdir_rules.FINAL_FILE).read_text())
    top1 = f"{100 * final[f'top1_{model}']:.2f}%"
  except (OSError, ValueError, KeyError):
    return "unknown (no final.json)"
  val = final.get(f"val_top1_{model}")
  return top1 if val is None else f"{top1} (validation {100 * val:.2f}%)"


def summary_line(workdir: str, teacher_arg: str = "agent") -> str:
  """The last line: both stages' top-1 on the evaluation split and what to run next."""
  teacher, pupil = stage_dirs(workdir, teacher_arg)
  recorded = workdir_rules.saved_config(pupil)
  split = recorded.get("data", {}).get("eval_split", "test")
  cnn = recorded.get("cnn", {}).get("name")  # Set in joint mode where a CNN is the teacher.
  model, label = ("cnn", cnn) if cnn else ("agent", "agent")
  tool = lambda name, *args: shlex.join([sys.executable, "-m", f"vitboot_jax.tools.{name}", *args])
  predict = tool("predict", f"--workdir={pupil}") + " IMAGE_OR_FOLDER..."
  export = tool("export", f"--workdir={pupil}", "--format=timm", "--output=vit.safetensors")
  return (
    f"teach: top-1 on {split!r}: teacher ({label}) {_top1(teacher, model)}, student (ViT) "
    f"{_top1(pupil, 'vit')}; classify images: {predict}; export: {export}"
  )


def _parse(argv: Sequence[str]) -> tuple[str, str, str, list[str], str]:
  values: dict[str, str] = {"student": "corr", "teacher": "agent"}
  extra = []
  for arg in argv:
    name, _, value = arg.partition("=")
    if name in ("--config", "--workdir", "--student", "--teacher"):
      values[name.removeprefix("--")] = value
    elif name.startswith("--config."):
      extra.append(arg)
    else:
      cli.fail(f"unexpected argument {arg}; usage: {USAGE}")
  for name in ("config", "workdir"):
    if not values.get(name):
      cli.fail(f"--{name} is required; usage: {USAGE}")
  return values["config"], values["workdir"], values["student"], extra, values["teacher"]


def main(argv: Sequence[str]) -> int:
  config, workdir, student, extra, teacher = _parse(argv)
  try:
    stages = stage_commands(config, workdir, student, extra, teacher)
  except ValueError as error:
    cli.fail(str(error))
  for stage, command in stages:
    print(f"teach: {stage}: {shlex.join(command)}", flush=True)
    code, stop_signal = sweep_runs.run_training(command, cwd=os.getcwd())
    if code == cli.USAGE_EXIT_CODE:
      return code  # The stage printed its one line.
    if code or stop_signal is not None:
      code = code or 128 + stop_signal
      print(
        f"teach: the {stage}'s run ended with exit code {code}; run the same command to go on",
        file=sys.stderr,
        flush=True,
      )
      return code
  print(summary_line(workdir, teacher), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

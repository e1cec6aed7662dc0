r"""The finished-teacher recipe in one command: the agent trained alone (the teacher's run), then
the ViT taught by it, frozen, with KD and the correlation hint (`teacher_corr` of the helps table).

  python -m vitboot_jax.tools.teach --config=configs/quickstart.py:epochs=20 --workdir=DIR \
    [--student=corr|kd] [--config.FIELD=VALUE ...]

Stage 1 trains `mode=agent` into DIR/teacher; stage 2 trains `mode=joint,frozen=1` and
`form=corr` (or `feature=0`: soft KD alone, `--student=kd`) into DIR/student, its agent read
from DIR/teacher (`config.agent_init_from`, which the student's config.json records). The config's
args and every --config.* flag reach both stages. Each stage is `python -m vitboot_jax.main`, so
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

STUDENTS = {
  "corr": "mode=joint,frozen=1,form=corr",  # KD + the correlation hint (teacher_corr).
  "kd": "mode=joint,frozen=1,feature=0",  # Soft KD alone (kd_teacher).
}
# Args the stages set themselves; a user's value would be silently overridden.
_OWN_ARGS = ("mode", "frozen", "teacher", "form", "feature")
USAGE = __doc__.splitlines()[3].strip()


def stage_dirs(workdir: str) -> tuple[str, str]:
  """The teacher's and the student's workdirs: DIR/teacher and DIR/student, absolute."""
  root = os.path.abspath(workdir)
  return os.path.join(root, "teacher"), os.path.join(root, "student")


def stage_commands(
  config: str, workdir: str, student: str = "corr", extra: Sequence[str] = ()
) -> list[tuple[str, list[str]]]:
  """[(stage, command)] of the teacher's run and the student's; ValueError for a bad request."""
  if student not in STUDENTS:
    raise ValueError(unknown_choice("--student", student, STUDENTS))
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
  teacher, pupil = stage_dirs(workdir)

  def spec(stage_args: str) -> str:
    return f"{path}:{','.join(a for a in (args, stage_args) if a)}"

  main = [sys.executable, "-m", "vitboot_jax.main"]
  return [
    ("teacher", [*main, f"--config={spec('mode=agent')}", f"--workdir={teacher}", *extra]),
    (
      "student",
      [
        *main,
        f"--config={spec(STUDENTS[student])}",
        f"--workdir={pupil}",
        f"--config.agent_init_from={teacher}",
        *extra,
      ],
    ),
  ]


def _top1(workdir: str, model: str) -> str:
  """A finished stage's top-1 of `model` (final.json), as the progress lines give it."""
  try:
    final = json.loads((pathlib.Path(workdir) / workdir_rules.FINAL_FILE).read_text())
    return f"{100 * final[f'top1_{model}']:.2f}%"
  except (OSError, ValueError, KeyError):
    return "unknown (no final.json)"


def summary_line(workdir: str) -> str:
  """The last line: both stages' top-1 on the evaluation split and what to run next."""
  teacher, pupil = stage_dirs(workdir)
  split = workdir_rules.saved_config(pupil).get("data", {}).get("eval_split", "test")
  tool = lambda name, *args: shlex.join([sys.executable, "-m", f"vitboot_jax.tools.{name}", *args])
  predict = tool("predict", f"--workdir={pupil}") + " IMAGE_OR_FOLDER..."
  export = tool("export", f"--workdir={pupil}", "--format=timm", "--output=vit.safetensors")
  return (
    f"teach: top-1 on {split!r}: teacher (agent) {_top1(teacher, 'agent')}, student (ViT) "
    f"{_top1(pupil, 'vit')}; classify images: {predict}; export: {export}"
  )


def _parse(argv: Sequence[str]) -> tuple[str, str, str, list[str]]:
  values: dict[str, str] = {"student": "corr"}
  extra = []
  for arg in argv:
    name, _, value = arg.partition("=")
    if name in ("--config", "--workdir", "--student"):
      values[name.removeprefix("--")] = value
    elif name.startswith("--config."):
      extra.append(arg)
    else:
      cli.fail(f"unexpected argument {arg}; usage: {USAGE}")
  for name in ("config", "workdir"):
    if not values.get(name):
      cli.fail(f"--{name} is required; usage: {USAGE}")
  return values["config"], values["workdir"], values["student"], extra


def main(argv: Sequence[str]) -> int:
  config, workdir, student, extra = _parse(argv)
  try:
    stages = stage_commands(config, workdir, student, extra)
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
  print(summary_line(workdir), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

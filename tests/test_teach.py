"""tools/teach.py: the finished-teacher recipe's two stages in one command, resumable after a kill,
the teacher's run named in the student's records."""

import json
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests import runs
from tests.config_files import apply_flags, flat, load_config
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools import teach
from vitboot_jax.tools.sweep import tables as sweep_tables

_FLAGS = (
  "--config.num_epochs=2",
  "--config.checkpoint_every_steps=4",
  "--config.log_every_steps=1",
)


def _teach(workdir, folder, *args):
  return [
    sys.executable,
    "-m",
    "vitboot_jax.tools.teach",
    f"--config={runs.TINY}",
    f"--workdir={workdir}",
    f"--config.data.dir={folder}",
    *_FLAGS,
    *args,
  ]


def test_stage_commands_set_each_stage_and_refuse_what_they_set(tmp_path):
  (_, first), (_, second) = teach.stage_commands("configs/quickstart.py:epochs=20", str(tmp_path))
  assert first[3].endswith("quickstart.py:epochs=20,mode=agent")
  assert first[4] == f"--workdir={tmp_path / 'teacher'}"
  assert second[3].endswith("quickstart.py:epochs=20,mode=joint,frozen=1,form=corr")
  assert f"--config.agent_init_from={tmp_path / 'teacher'}" in second
  (_, _), (_, kd) = teach.stage_commands("configs/quickstart.py", str(tmp_path), "kd")
  assert kd[3].endswith("quickstart.py:mode=joint,frozen=1,feature=0")
  with pytest.raises(ValueError, match="sets mode"):
    teach.stage_commands("configs/quickstart.py:mode=vit", str(tmp_path))
  with pytest.raises(ValueError, match="--student='distil' is unknown"):
    teach.stage_commands("configs/quickstart.py", str(tmp_path), "distil")
  with pytest.raises(ValueError, match="sets it for each stage"):
    teach.stage_commands("configs/quickstart.py", str(tmp_path), extra=["--config.mode=vit"])


def test_the_last_line_gives_both_top1s_and_runnable_next_commands(tmp_path):
  for stage, final in (("teacher", {"top1_agent": 0.4512}), ("student", {"top1_vit": 0.5})):
    (tmp_path / stage).mkdir()
    (tmp_path / stage / "final.json").write_text(json.dumps(final))
  (tmp_path / "student" / "config.json").write_text(json.dumps({"data": {"eval_split": "val"}}))
  line = teach.summary_line(str(tmp_path))
  assert line.startswith("teach: top-1 on 'val': teacher (agent) 45.12%, student (ViT) 50.00%;")
  predict = line.split("classify images: ")[1].split(";")[0]
  export = line.split("export: ")[1]
  student = str(tmp_path / "student")
  assert shlex.split(predict) == [
    sys.executable, "-m", "vitboot_jax.tools.predict", f"--workdir={student}", "IMAGE_OR_FOLDER..."
  ]  # fmt: skip
  assert shlex.split(export)[:4] == [
    sys.executable, "-m", "vitboot_jax.tools.export", f"--workdir={student}"
  ]  # fmt: skip
  assert "teacher (agent) unknown" in teach.summary_line(str(tmp_path / "none"))


@pytest.mark.slow
def test_teach_runs_both_stages_and_resumes_after_a_kill(image_folder, tmp_path):
  workdir = tmp_path / "teach"
  student = workdir / "student"

  def stopped_once(stage_dir):
    """Runs teach until `stage_dir` holds a checkpoint, then SIGTERM: the stage saves and stops,
    and so does teach."""
    proc = subprocess.Popen(
      _teach(workdir, image_folder), env=runs.env(1), stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 900
    while not workdir_rules.has_checkpoint(stage_dir) and proc.poll() is None:
      assert time.monotonic() < deadline, f"{stage_dir} never saved a checkpoint"
      time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "run the same command to go on" in stderr

  stopped_once(workdir / "teacher")  # Mid-teacher: no student yet.
  assert not (workdir / "teacher" / "final.json").exists() and not student.exists()
  stopped_once(student)  # Mid-student: the teacher finished first.
  assert (workdir / "teacher" / "final.json").exists()
  assert not (student / "final.json").exists()

  again = subprocess.run(
    _teach(workdir, image_folder), env=runs.env(1), capture_output=True, text=True, timeout=900
  )
  assert again.returncode == 0, again.stderr[-3000:]
  final = json.loads((student / "final.json").read_text())
  assert final["step"] == 20 and final["resumed_from_step"] > 0
  recorded = json.loads((student / "config.json").read_text())
  assert recorded["agent_init_from"] == str(workdir / "teacher")
  assert recorded["mode"] == "joint" and recorded["agent_frozen"]
  assert recorded["loss"]["feature_loss"] == "corr"
  teacher_launches = (workdir / "teacher" / "launches.jsonl").read_text().splitlines()
  assert len(teacher_launches) == 2  # Resumed once, then never trained again once finished.

  # The commands print as they run, the interpreter first; the last line sums the two up.
  lines = again.stdout.strip().splitlines()
  printed = dict(line.removeprefix("teach: ").split(": ", 1) for line in lines[:2])
  extra = _teach(workdir, image_folder)[5:]
  for stage, command in teach.stage_commands(runs.TINY, str(workdir), extra=extra):
    assert shlex.split(printed[stage]) == command
  final_teacher = json.loads((workdir / "teacher" / "final.json").read_text())
  assert lines[-1].startswith(
    f"teach: top-1 on 'test': teacher (agent) {100 * final_teacher['top1_agent']:.2f}%, "
    f"student (ViT) {100 * final['top1_vit']:.2f}%; classify images: {sys.executable} -m "
    "vitboot_jax.tools.predict"
  )
  as_printed = subprocess.run(  # The finished student, run as printed, logs its results again.
    printed["student"], shell=True, env=runs.env(1), capture_output=True, text=True, timeout=300
  )
  assert as_printed.returncode == 0, as_printed.stderr[-3000:]


def test_a_clashing_arg_is_one_line_and_exit_2(tmp_path):
  proc = subprocess.run(
    [*_teach(tmp_path / "t", tmp_path)[:3], f"--config={runs.TINY}:mode=vit", "--workdir=x"],
    env=runs.env(1),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "sets mode" in lines[0], lines


def test_a_resnet_teacher_trains_on_the_students_data_with_its_own_recipe(tmp_path):
  extra = ["--config.data.dir=/data", "--config.optim.lr=0.5", "--config.seed=3"]
  (_, first), (_, second) = teach.stage_commands(
    f"{runs.TINY}:classes=10", str(tmp_path), extra=extra, teacher="resnet20"
  )
  assert first[3] == f"--config={teach.RESNET_CONFIG}:model=resnet20"
  assert first[4] == f"--workdir={tmp_path / 'teacher'}"
  # The student's data and image size, then the user's data and seed flags; not the ViT's lr.
  for flag in ("--config.data.name=folder", "--config.data.num_classes=10"):
    assert flag in first
  assert "--config.data.normalisation=cifar10" in first and "--config.image_size=32" in first
  assert first[-2:] == ["--config.data.dir=/data", "--config.seed=3"]
  assert "--config.optim.lr=0.5" not in first and "--config.optim.lr=0.5" in second
  assert second[3].endswith(":classes=10,mode=joint,frozen=1,form=corr,teacher_cnn=resnet20")
  assert f"--config.agent_init_from={tmp_path / 'teacher'}" in second


def test_a_finished_run_teaches_without_a_first_stage(tmp_path):
  run = tmp_path / "resnet56_run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"mode": "cnn", "cnn": {"name": "resnet56"}}))
  [(stage, command)] = teach.stage_commands(runs.TINY, str(tmp_path / "w"), teacher=str(run))
  assert stage == "student" and f"--config.agent_init_from={run}" in command
  assert command[3].endswith(",teacher_cnn=resnet56")
  (run / "config.json").write_text(json.dumps({"mode": "agent"}))
  [(_, command)] = teach.stage_commands(runs.TINY, str(tmp_path / "w"), teacher=str(run))
  assert "teacher_cnn" not in command[3]
  (run / "config.json").write_text(json.dumps({"mode": "vit"}))
  with pytest.raises(ValueError, match="which has no agent or CNN"):
    teach.stage_commands(runs.TINY, str(tmp_path / "w"), teacher=str(run))
  with pytest.raises(ValueError, match="neither agent, resnet20, resnet32, resnet56 nor"):
    teach.stage_commands(runs.TINY, str(tmp_path / "w"), teacher=str(tmp_path / "nothing"))
  # The last line names the CNN and reads its top-1.
  (run / "final.json").write_text(json.dumps({"top1_cnn": 0.7, "val_top1_cnn": 0.71}))
  (tmp_path / "w" / "student").mkdir(parents=True)
  student = {"data": {"eval_split": "test"}, "cnn": {"name": "resnet56"}}
  (tmp_path / "w" / "student" / "config.json").write_text(json.dumps(student))
  line = teach.summary_line(str(tmp_path / "w"), str(run))
  assert line.startswith(
    "teach: top-1 on 'test': teacher (resnet56) 70.00% (validation 71.00%), student (ViT) unknown"
  )


@pytest.mark.slow
def test_teach_with_a_resnet_teacher_end_to_end(image_folder, tmp_path):
  workdir = tmp_path / "teach"
  proc = subprocess.run(
    [*_teach(workdir, image_folder, "--teacher=resnet20"), "--config.total_steps=3"],
    env=runs.env(1),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  teacher = json.loads((workdir / "teacher" / "config.json").read_text())
  assert teacher["mode"] == "cnn" and teacher["cnn"]["name"] == "resnet20"
  assert teacher["data"]["dir"] == str(image_folder) and teacher["optim"]["name"] == "sgd"
  student = json.loads((workdir / "student" / "config.json").read_text())
  assert student["cnn"]["name"] == "resnet20" and student["agent_frozen"]
  assert (
    proc.stdout.strip().splitlines()[-1].startswith("teach: top-1 on 'test': teacher (resnet20)")
  )


@pytest.mark.parametrize(
  "row, student, args",
  [
    ("corr_resnet20", "corr", ""),
    ("corr_resnet20_eval", "corr", ",teacher_eval=1"),
    ("kd_resnet20", "kd", ""),
    ("corr_agent_e100", "corr", ""),
  ],
)
def test_one_command_trains_the_small_data_studys_student_field_for_field(
  tmp_path, row, student, args
):
  """The recipe the students' rule picks (issue 84 item 7) is this command with its flags: the
  student's config equals the study row's, its teacher the teachers' table's run (a ResNet this
  command trains; the agent of its own recipe, a finished run named by PATH)."""
  table = sweep_tables.students_table("aug_light", "resnet20", "agent_e100")
  study = {r.name: r for r in table.rows}
  agent_run = tmp_path / "agent_e100_seed0"
  agent_run.mkdir()
  (agent_run / "config.json").write_text(json.dumps({"mode": "agent"}))
  teacher = "resnet20" if "resnet20" in row else str(agent_run)
  stages = dict(
    teach.stage_commands(
      f"configs/quickstart.py:recipe=small_data,epochs=100{args}",
      str(tmp_path / "w"),
      student=student,
      teacher=teacher,
    )
  )

  def config(spec, flags):
    flags = [f for f in flags if f.startswith("--config.") and "agent_init_from" not in f]
    return flat(apply_flags(load_config(spec), flags).to_dict())

  command = stages["student"]
  ours = config(command[3].removeprefix("--config="), command[4:])
  assert ours == config(study[row].config, study[row].overrides)
  if teacher == "resnet20":
    (teacher_row,) = [r for r in table.rows if r.name == "resnet20"]
    command = stages["teacher"]
    ours = config(command[3].removeprefix("--config="), command[4:])
    theirs = config(teacher_row.config, teacher_row.overrides)
    assert {k: v for k, v in ours.items() if not k.startswith("data.")} == {
      k: v for k, v in theirs.items() if not k.startswith("data.")
    }
  else:
    assert "teacher" not in stages

"""tools/teach.py: the finished-teacher recipe's two stages in one command, resumable after a kill,
the teacher's run named in the student's records."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import runs
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools import teach

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


@pytest.mark.slow
def test_teach_runs_both_stages_and_resumes_after_a_kill(image_folder, tmp_path):
  workdir = tmp_path / "teach"
  student = workdir / "student"
  proc = subprocess.Popen(
    _teach(workdir, image_folder), env=runs.env(1), stderr=subprocess.PIPE, text=True
  )
  deadline = time.monotonic() + 900
  while not workdir_rules.has_checkpoint(student) and proc.poll() is None:
    assert time.monotonic() < deadline, "the student never saved a checkpoint"
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)  # Mid-student: the stage saves and stops, and so does teach.
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  assert "run the same command to go on" in stderr
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
  assert len(teacher_launches) == 1  # The finished teacher was not trained again.


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

"""tools/perf/run_cost: a run's own step and evaluations timed, and its idle cost added up."""

import json
import subprocess
import sys

from tests.config_files import load_config
from tests.runs import REPO, env
from vitboot_jax import configlib
from vitboot_jax.tools.perf import run_cost


def test_evaluations_count_every_interval_and_the_last_step():
  assert run_cost.evaluations(30, 10) == 3
  assert run_cost.evaluations(31, 10) == 4  # The last step's own.
  assert run_cost.evaluations(5, 10) == 1


def _run(tmp_path, folder, name, args, **final):
  """A run's workdir as a run leaves it: config.json (and final.json where given)."""
  config = load_config("tiny_config", args)
  config.data.dir = str(folder)
  config.data.update(train_fraction=0.5, val_split="held_out", val_fraction=0.25)
  config.num_epochs = 2
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(config.to_dict()))
  if final:
    (workdir / "final.json").write_text(json.dumps(final))
  return workdir, config


def test_a_runs_idle_cost_is_its_own_step_and_evaluations_summed(image_folder, tmp_path):
  vit, config = _run(tmp_path, image_folder, "vit", "mode=vit", step=10, resumed_from_step=4,
                     train_seconds_this_run=7.5)  # fmt: skip
  # A student of a teacher run that is not there: its weights are not read, only its shape.
  student, _ = _run(tmp_path, image_folder, "student", "mode=joint,frozen=1")
  config_json = json.loads((student / "config.json").read_text())
  config_json["agent_init_from"] = str(tmp_path / "gone")
  (student / "config.json").write_text(json.dumps(config_json))
  printed = []
  run_cost.run([str(vit), str(student)], steps=2, warmup=1, peak_size=128, emit=printed.append)
  peak, *rows = [json.loads(line) for line in printed]
  assert peak["peak_matmul_flops_per_s"] > 0 and len(rows) == 2
  for row, mode in zip(rows, ("vit", "joint"), strict=True):
    assert row["mode"] == mode and row["batch"] == 16 and row["devices"] == 8
    # 8 of 16 training images a class: 80 images, 5 steps an epoch, 2 epochs.
    assert row["total_steps"] == configlib.total_steps(config, 5) == 10
    assert row["evaluations"] == 2  # After each epoch.
    assert row["eval_images"] == 80  # Validation (4 a class) and test (4 a class), once each.
    assert row["loop_step_s"] > row["loop_data_s"] > 0 and row["compile_s"] > 0
    assert row["eval_s_first"] > 0 and row["eval_s"] > 0
    assert row["idle_train_s"] == row["compile_s"] + 10 * row["loop_step_s"]
    assert row["idle_eval_s"] == row["eval_s_first"] + row["eval_s"]
    assert row["idle_total_s"] == row["idle_train_s"] + row["idle_eval_s"]
  assert (rows[0]["train_seconds_this_run"], rows[0]["steps_this_run"]) == (7.5, 6)
  assert (rows[1]["train_seconds_this_run"], rows[1]["steps_this_run"]) == (None, None)


def test_a_folder_that_is_not_a_run_is_refused_in_one_line_before_any_timing(tmp_path):
  run, _ = _run(tmp_path, tmp_path, "run", "mode=vit")
  proc = subprocess.run(  # Checked before the first run is timed.
    [sys.executable, "-m", "vitboot_jax.tools.perf.run_cost", str(run), str(tmp_path / "run2")],
    env=env(1),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
    f"error: {tmp_path / 'run2'} is not the workdir of a run (no config.json there)"
  )

"""Workdir rules: one config per run, finished or not; no checkpoint: any config is accepted."""

import json
import os

import pytest

from vitboot_jax import checkpoint, configlib, errors, workdirs


def _config(**fields):
  c = configlib.base_config()
  c.update(fields)
  return c


def _write_run(workdir, config, *, checkpoint_step=None, finished=False):
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / workdirs.CONFIG_FILE).write_text(config.to_json_best_effort())
  if checkpoint_step is not None:
    step_dir = workdir / workdirs.CHECKPOINT_SUBDIR / str(checkpoint_step)
    step_dir.mkdir(parents=True)
    (step_dir / workdirs.COMMIT_MARKER).write_text("")
  if finished:
    (workdir / workdirs.FINAL_FILE).write_text(json.dumps({"step": 30, "top1_vit": 0.5}))


def test_layout_matches_checkpoint_module():
  assert workdirs.CHECKPOINT_SUBDIR == checkpoint.CHECKPOINT_SUBDIR
  assert workdirs.COMMIT_MARKER == checkpoint.COMMIT_MARKER


def test_fresh_workdir_is_accepted_and_not_created(tmp_path):
  assert workdirs.check(tmp_path / "a" / "b", _config()) is None
  assert not (tmp_path / "a").exists()


def test_without_a_checkpoint_any_config_is_accepted(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5))  # A run that failed before its first save.
  (tmp_path / workdirs.CHECKPOINT_SUBDIR / "4").mkdir(parents=True)  # An unfinished save.
  assert not workdirs.has_checkpoint(tmp_path)
  assert workdirs.check(tmp_path, _config(num_epochs=6)) is None


def test_unfinished_run_refuses_another_config(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5), checkpoint_step=8)
  assert workdirs.check(tmp_path, _config(num_epochs=5, log_every_steps=1)) is None
  with pytest.raises(errors.WorkdirError, match=r"unfinished run .* \(num_epochs: 5 -> 6\)"):
    workdirs.check(tmp_path, _config(num_epochs=6))


def test_finished_run_refuses_another_config_and_returns_its_results(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5), checkpoint_step=30, finished=True)
  assert workdirs.check(tmp_path, _config(num_epochs=5))["top1_vit"] == 0.5
  with pytest.raises(errors.WorkdirError, match=r" finished run .* \(num_epochs: 5 -> 6\)"):
    workdirs.check(tmp_path, _config(num_epochs=6))


def test_changed_fields_name_each_leaf_with_both_values(tmp_path):
  saved = _config(num_epochs=5, mode="shared")
  saved.optim.lr = 0.001
  _write_run(tmp_path, saved, checkpoint_step=8)
  config = _config(num_epochs=5, mode="joint", log_every_steps=7)
  config.optim.lr = 0.002
  assert workdirs.changed_fields(json.loads(saved.to_json_best_effort()), config) == [
    "mode: 'shared' -> 'joint'",
    "optim.lr: 0.001 -> 0.002",
  ]
  with pytest.raises(errors.WorkdirError) as refused:
    workdirs.check(tmp_path, config)
  assert "(mode: 'shared' -> 'joint', optim.lr: 0.001 -> 0.002);" in str(refused.value)


def test_changed_fields_beyond_a_few_are_counted(tmp_path):
  saved = _config()
  _write_run(tmp_path, saved, checkpoint_step=8)
  config = _config(seed=1, image_size=2, batch_size=3, num_epochs=4, total_steps=5, mode="x")
  config.optim.lr = 7.0
  with pytest.raises(errors.WorkdirError, match=r", and 1 more\); use a new --workdir"):
    workdirs.check(tmp_path, config)


def test_workdir_under_a_file(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(errors.WorkdirError, match="is a file"):
    workdirs.check(tmp_path / "file" / "run", _config())


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_workdir_without_write_permission(tmp_path):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  with pytest.raises(errors.WorkdirError, match="cannot be written"):
    workdirs.check(locked / "run", _config())

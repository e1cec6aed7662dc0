"""Workdir rules: one config per run, finished or not; one live run at a time; no resume on other
data; without a checkpoint any config (and any data) is accepted."""

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.checkpoint import checkpointer
from vitboot_jax.run import workdir_claim, workdir_rules


def _config(**fields):
  c = configlib.base_config()
  c.update(fields)
  return c


def _write_run(workdir, config, *, checkpoint_step=None, finished=False):
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / workdir_rules.CONFIG_FILE).write_text(config.to_json_best_effort())
  if checkpoint_step is not None:
    step_dir = workdir / workdir_rules.CHECKPOINT_SUBDIR / str(checkpoint_step)
    step_dir.mkdir(parents=True)
    (step_dir / workdir_rules.COMMIT_MARKER).write_text("")
  if finished:
    (workdir / workdir_rules.FINAL_FILE).write_text(json.dumps({"step": 30, "top1_vit": 0.5}))


def test_layout_is_where_the_checkpointer_writes(tmp_path):
  with checkpointer.Checkpointer(tmp_path, async_save=False) as ckpt:
    assert ckpt.directory == tmp_path / workdir_rules.CHECKPOINT_SUBDIR
    ckpt.save(1, {"w": np.zeros(2)}, force=True)
  assert workdir_rules.has_checkpoint(tmp_path)  # Through COMMIT_MARKER: the name orbax writes.


def test_fresh_workdir_is_accepted_and_not_created(tmp_path):
  assert workdir_rules.check(tmp_path / "a" / "b", _config()) is None
  assert not (tmp_path / "a").exists()


def test_without_a_checkpoint_any_config_is_accepted(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5))  # A run that failed before its first save.
  (tmp_path / workdir_rules.CHECKPOINT_SUBDIR / "4").mkdir(parents=True)  # An unfinished save.
  assert not workdir_rules.has_checkpoint(tmp_path)
  assert workdir_rules.check(tmp_path, _config(num_epochs=6)) is None


def test_unfinished_run_refuses_another_config(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5), checkpoint_step=8)
  assert workdir_rules.check(tmp_path, _config(num_epochs=5, log_every_steps=1)) is None
  with pytest.raises(errors.WorkdirError, match=r"unfinished run .* \(num_epochs: 5 -> 6\)"):
    workdir_rules.check(tmp_path, _config(num_epochs=6))


def test_finished_run_refuses_another_config_and_returns_its_results(tmp_path):
  _write_run(tmp_path, _config(num_epochs=5), checkpoint_step=30, finished=True)
  assert workdir_rules.check(tmp_path, _config(num_epochs=5))["top1_vit"] == 0.5
  with pytest.raises(errors.WorkdirError, match=r" finished run .* \(num_epochs: 5 -> 6\)"):
    workdir_rules.check(tmp_path, _config(num_epochs=6))


@pytest.mark.parametrize("finished", [False, True])
def test_checkpoints_without_config_json_are_refused_unless_adopted(tmp_path, finished):
  _write_run(tmp_path, _config(num_epochs=5), checkpoint_step=30, finished=finished)
  (tmp_path / workdir_rules.CONFIG_FILE).unlink()
  with pytest.raises(errors.WorkdirError) as info:
    workdir_rules.check(tmp_path, _config(num_epochs=6))
  message = str(info.value)
  assert f"--workdir={tmp_path} holds a {'finished' if finished else 'saved'} run" in message
  assert "no config.json" in message and "--adopt_config" in message and "\n" not in message
  adopted = workdir_rules.check(tmp_path, _config(num_epochs=6), adopt_config=True)
  assert (adopted is not None) == finished
  # The run writes it; the check writes none.
  assert not (tmp_path / workdir_rules.CONFIG_FILE).exists()


def test_changed_fields_name_each_leaf_with_both_values(tmp_path):
  saved = _config(num_epochs=5, mode="shared")
  saved.optim.lr = 0.001
  _write_run(tmp_path, saved, checkpoint_step=8)
  config = _config(num_epochs=5, mode="joint", log_every_steps=7)
  config.optim.lr = 0.002
  assert workdir_rules.changed_fields(json.loads(saved.to_json_best_effort()), config) == [
    "mode: 'shared' -> 'joint'",
    "optim.lr: 0.001 -> 0.002",
  ]
  with pytest.raises(errors.WorkdirError) as refused:
    workdir_rules.check(tmp_path, config)
  assert "(mode: 'shared' -> 'joint', optim.lr: 0.001 -> 0.002);" in str(refused.value)


def test_changed_fields_beyond_a_few_are_counted(tmp_path):
  saved = _config()
  _write_run(tmp_path, saved, checkpoint_step=8)
  config = _config(seed=1, image_size=2, batch_size=3, num_epochs=4, total_steps=5, mode="x")
  config.optim.lr = 7.0
  with pytest.raises(errors.WorkdirError, match=r", and 1 more\); use a new --workdir"):
    workdir_rules.check(tmp_path, config)


def test_workdir_under_a_file(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(errors.WorkdirError, match="is a file"):
    workdir_rules.check(tmp_path / "file" / "run", _config())


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_workdir_without_write_permission(tmp_path):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  with pytest.raises(errors.WorkdirError, match="cannot be written"):
    workdir_rules.check(locked / "run", _config())


# ---------------------------------------------------------------------------------------------
# One run per workdir: the claim.


def _foreign_claim(workdir, *, host="other-host", pid=1, heartbeat_age=0.0):
  workdir.mkdir(parents=True, exist_ok=True)
  now = time.time()
  record = {
    "host": host,
    "pid": pid,
    "started": now - 3600,
    "heartbeat": now - heartbeat_age,
    "token": "t-foreign",
  }
  if host == socket.gethostname():
    record.update(workdir_claim._machine(), host=host)
  (workdir / workdir_claim.CLAIM_FILE).write_text(json.dumps(record))
  return record


def test_claim_is_exclusive_and_names_the_holder(tmp_path):
  claim = workdir_claim.acquire(tmp_path)
  record = json.loads((tmp_path / workdir_claim.CLAIM_FILE).read_text())
  assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
  refused = []

  def second():  # Another thread stands for another run: the first is still running.
    # main's check (before JAX loads), then the claim itself.
    for attempt in (
      lambda: workdir_rules.check(tmp_path, _config()),
      lambda: workdir_claim.acquire(tmp_path),
    ):
      try:
        attempt()
      except errors.WorkdirError as error:
        refused.append(str(error))

  thread = threading.Thread(target=second)
  thread.start()
  thread.join()
  assert len(refused) == 2 and refused[0] == refused[1]
  assert f"is in use by another run: pid {os.getpid()} on {socket.gethostname()}" in refused[0]
  assert "own --workdir" in refused[0] and "claim.json" in refused[0]
  claim.release()
  assert not (tmp_path / workdir_claim.CLAIM_FILE).exists()
  workdir_claim.acquire(tmp_path).release()


def test_processes_of_one_multi_process_run_leave_the_claim_to_process_0(tmp_path):
  """Process 0's claim.json is its own run's to the other processes, however late they check
  (CI: a loaded host let process 1 check after process 0 had claimed, and refuse its own run)."""
  claim = workdir_claim.acquire(tmp_path)
  result = []
  thread = threading.Thread(
    target=lambda: result.append(workdir_rules.check(tmp_path, _config(), single_process=False))
  )
  thread.start()
  thread.join()
  assert result == [None]
  claim.release()


def test_live_claim_of_another_host_is_refused(tmp_path):
  _foreign_claim(tmp_path, heartbeat_age=30)
  with pytest.raises(workdir_claim.WorkdirBusyError, match="pid 1 on other-host"):
    workdir_claim.acquire(tmp_path)
  assert json.loads((tmp_path / workdir_claim.CLAIM_FILE).read_text())["token"] == "t-foreign"


def test_stale_claims_are_taken_over(tmp_path, caplog):
  dead = subprocess.Popen(["true"])
  dead.wait()
  cases = {
    "its process no longer exists": dict(host=socket.gethostname(), pid=dead.pid),
    "heartbeat is": dict(heartbeat_age=workdir_claim.STALE_AFTER_SECONDS + 60),
    "its host has rebooted since": dict(host=socket.gethostname(), pid=os.getppid()),
  }
  for i, (why, holder) in enumerate(cases.items()):
    workdir = tmp_path / str(i)
    record = _foreign_claim(workdir, **holder)
    if "rebooted" in why:  # A live pid, but recorded before the host's last boot.
      record["boot_id"] = "an-earlier-boot"
      (workdir / workdir_claim.CLAIM_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
      claim = workdir_claim.acquire(workdir)
    assert why in caplog.text and "Taking over the claim" in caplog.text
    assert json.loads((workdir / workdir_claim.CLAIM_FILE).read_text())["token"] == claim.token
    assert [p.name for p in workdir.iterdir()] == [workdir_claim.CLAIM_FILE]
    claim.release()


def test_an_earlier_in_process_run_leaves_no_lasting_claim(tmp_path):
  workdir_claim.acquire(tmp_path)  # A run on this thread that raised before releasing.
  claim = workdir_claim.acquire(tmp_path)
  assert workdir_claim.held(tmp_path) is claim
  claim.release()


def test_a_failed_run_settles_its_saves_before_letting_go(tmp_path, caplog):
  claim = workdir_claim.acquire(tmp_path)
  path = tmp_path / workdir_claim.CLAIM_FILE
  held_while_settling = []
  claim.settle_first(lambda: held_while_settling.append(path.exists()))

  def failed_save():
    raise OSError("No space left on device")

  claim.settle_first(failed_save)
  claim.release_after_failure()
  assert held_while_settling == [True]  # The save landed before the workdir was let go.
  assert "No space left on device" in caplog.text  # Logged; the run's own error is raised.
  assert workdir_claim.held(tmp_path) is None and not path.exists()


def test_heartbeat_refreshes_and_finds_a_takeover(tmp_path):
  claim = workdir_claim.acquire(tmp_path)
  path = tmp_path / workdir_claim.CLAIM_FILE
  before = json.loads(path.read_text())["heartbeat"]
  time.sleep(0.01)
  claim.refresh()
  assert json.loads(path.read_text())["heartbeat"] > before
  _foreign_claim(tmp_path)  # Another run took the workdir over (e.g. after a long pause).
  claim.refresh()
  with pytest.raises(workdir_claim.WorkdirBusyError, match="taken over by another run"):
    claim.check()
  import jax.numpy as jnp

  with checkpointer.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(workdir_claim.WorkdirBusyError):
      ckpt.save(1, {"w": jnp.ones(2)}, force=True)
  claim.release()
  assert json.loads(path.read_text())["token"] == "t-foreign"  # Not ours: left alone.


# ---------------------------------------------------------------------------------------------
# No resume on other data.


def _data_record(**changes):
  record = {
    "name": "folder",
    "splits": {
      "train": {"examples": 160, "files_sha256": "a"},
      "test": {"examples": 40, "files_sha256": "b"},
    },
    "class_names": ["c0", "c1"],
    "num_train_examples": 160,
    "steps_per_epoch": 10,
  }
  record.update(changes)
  return record


def test_resume_on_other_data_is_refused(tmp_path):
  _write_run(tmp_path, _config(), checkpoint_step=8)
  (tmp_path / workdir_rules.DATA_FILE).write_text(json.dumps(_data_record()))
  workdir_rules.check_data(tmp_path, _data_record())
  fewer = _data_record(
    splits={
      "train": {"examples": 80, "files_sha256": "c"},
      **{"test": _data_record()["splits"]["test"]},
    },
    num_train_examples=80,
    steps_per_epoch=5,
  )
  with pytest.raises(errors.WorkdirError) as info:
    workdir_rules.check_data(tmp_path, fewer)
  message = str(info.value)
  assert "num train examples 160 -> 80" in message and "steps per epoch 10 -> 5" in message
  assert "'train' examples 160 -> 80" in message and "new --workdir" in message
  renamed = _data_record(splits={**_data_record()["splits"], "test": {"examples": 40}})
  with pytest.raises(errors.WorkdirError, match="'test' files differ"):
    workdir_rules.check_data(tmp_path, renamed)
  # Without a checkpoint nothing is resumed: the run starts afresh on the new data.
  shutil.rmtree(tmp_path / workdir_rules.CHECKPOINT_SUBDIR)
  workdir_rules.check_data(tmp_path, fewer)


# ---------------------------------------------------------------------------------------------
# Metrics on an object store: appends buffered, never a read and a rewrite per line.


def test_remote_metrics_are_flushed_in_chunks(tmp_path, monkeypatch):
  from etils import epath

  from vitboot_jax.base import files
  from vitboot_jax.run import metrics

  monkeypatch.setattr(files, "is_local", lambda path: False)  # As for gs://: no appends.
  writes, reads = [], []
  real_write, real_read = files.write_atomically, epath.Path.read_text
  # Only this test's files count: a claim's heartbeat thread left by an earlier test in this
  # worker process reads its own claim.json meanwhile.
  ours = lambda path: str(path).startswith(str(tmp_path))  # noqa: E731

  def write(path, text):
    if ours(path):
      writes.append(text)
    return real_write(path, text)

  def read(self, *args, **kwargs):
    if ours(self):
      reads.append(self)
    return real_read(self, *args, **kwargs)

  monkeypatch.setattr(files, "write_atomically", write)
  monkeypatch.setattr(epath.Path, "read_text", read)
  (tmp_path / metrics.METRICS_FILE).write_text('{"step": 1, "train/loss": 3.0}\n')
  writer = metrics.MetricWriter(tmp_path, asynchronous=False, flush_every_steps=50)
  writer.truncate_after(1)  # A resumed run: the file is read once, here.
  reads.clear()
  for step in range(2, 101):
    writer.write(step, {"train/loss": 1.0 / step})
    if step == 30:
      writer.write(step, {"eval/top1": 0.5})
  writer.close()
  assert reads == []  # Never read back while training.
  # Flushes after the evaluation (30), at the checkpoint steps (50, 100), and none per line.
  assert len(writes) == 3, [text.count("\n") for text in writes]
  steps = [r["step"] for r in metrics.read_metrics(tmp_path)]
  assert steps == [1, *range(2, 31), 30, *range(31, 101)]


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
  """gs://bucket/... served from tmp_path/bucket through epath's own API (its test mock)."""
  from etils.epath import gpath, testing

  root = tmp_path / "bucket"
  root.mkdir()

  def local(path):
    path = os.fspath(path)
    return str(root) + path[len("gs://bucket") :] if path.startswith("gs://bucket") else path

  def one(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  def two(fn, path, dst, *args, **kwargs):
    return fn(local(path), local(dst), *args, **kwargs)

  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # Else gs:// goes to tf.io.gfile.
  names = ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rmtree")
  mocks = {name: one for name in (*names, "stat", "walk")}
  with testing.mock_epath(**mocks, rename=two, replace=two, copy=two):
    yield root


def test_plot_and_sweep_read_a_bucket_workdir(fake_bucket):
  from vitboot_jax.tools import plot
  from vitboot_jax.tools.sweep import report as sweep_report
  from vitboot_jax.tools.sweep import runs as sweep_runs
  from vitboot_jax.tools.sweep import tables as sweep_tables

  run = fake_bucket / "runs" / "a"
  run.mkdir(parents=True)
  lines = [{"step": 5, "epoch": 0.5, "train/loss_vit": 2.0}, {"step": 10, "eval/top1_vit": 0.25}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  loaded = plot.load_run("gs://bucket/runs/a")
  assert os.fspath(loaded.workdir) == "gs://bucket/runs/a" and loaded.label == "a"
  assert [r["step"] for r in loaded.train] == [5] and [r["step"] for r in loaded.eval] == [10]

  table = sweep_tables.TABLES["cifar100"]
  s = sweep_runs.settings(table, root="gs://bucket/sweep")
  assert s.root == "gs://bucket/sweep"
  row = next(r for r in table.rows if r.name == "Ours-Shared S")
  workdir = sweep_runs.workdir(s, row, 0)
  assert os.fspath(workdir) == "gs://bucket/sweep/vits_cifar100_mode-shared_align-none_seed0"
  local = fake_bucket / "sweep" / "vits_cifar100_mode-shared_align-none_seed0"
  local.mkdir(parents=True)
  (local / "final.json").write_text(json.dumps({"top1_vit": 0.7512, "epochs": 240}))
  entry = next(e for e in sweep_report.aggregate(table, s) if e["name"] == "Ours-Shared S")
  assert entry["status"] == "done" and entry["top1"]["vit"]["mean"] == pytest.approx(75.12)
  assert f"--workdir={workdir}" in entry["commands"][0]


def test_startup_of_a_finished_run_logs_its_results_and_touches_no_data(tmp_path, caplog):
  from tests.config_files import load_config
  from vitboot_jax.run import startup

  config = load_config("tiny_config")
  config.data.pipeline = "device"  # An image folder needs no TensorFlow on this pipeline.
  config.data.dir = str(tmp_path / "no_data_here")  # Never looked at: nothing is left to do.
  _write_run(tmp_path / "run", config, finished=True)
  with caplog.at_level(logging.INFO):
    final = startup.check(config, tmp_path / "run", single_process=True)
  assert final == {"step": 30, "top1_vit": 0.5}
  assert "Final top-1 (step 30): vit 50.00%." in caplog.text
  with pytest.raises(errors.DataError):  # The same config in a fresh workdir needs its data.
    startup.check(config, tmp_path / "fresh", single_process=True)
  assert not (tmp_path / "fresh").exists()


def test_a_field_added_at_its_default_is_no_change():
  # A config.json written before a field existed: the field at its default resumes, otherwise not.
  config = _config(mode="joint")
  saved = json.loads(config.to_json_best_effort())
  del saved["loss"]["feature_until"], saved["agent_frozen"]
  assert workdir_rules.changed_fields(saved, config) == []
  config.loss.feature_until = 0.5
  assert workdir_rules.changed_fields(saved, config) == ["loss.feature_until: (unset) -> 0.5"]


def test_a_run_written_before_a_field_existed_reads_back_with_its_default(tmp_path):
  from tests.config_files import load_config

  config = load_config("tiny_config", "mode=joint")
  config.loss.feature = 3.0
  saved = json.loads(config.to_json_best_effort())
  del saved["loss"]["feature_until"], saved["log_every_steps"]  # As an older version wrote it.
  (tmp_path / workdir_rules.CONFIG_FILE).write_text(json.dumps(saved))
  read = workdir_rules.read_config(tmp_path)
  defaults = configlib.base_config()
  assert read.loss.feature_until == defaults.loss.feature_until
  assert read.log_every_steps == defaults.log_every_steps
  assert read.loss.feature == 3.0 and read.mode == "joint"  # What the run saved stays.
  configlib.validate(read)  # Tools validate what they read.
  expected = json.loads(config.to_json_best_effort())
  expected["log_every_steps"] = defaults.log_every_steps
  assert json.loads(read.to_json_best_effort()) == expected  # Nothing else added or changed.

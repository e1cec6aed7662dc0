"""Faults: kills at random moments, SIGTERM/SIGINT, non-finite losses, bad images, a full disk.

The end-to-end tests re-run the same command after every fault, as a user would, and compare
with the uninterrupted run of the same config (conftest's `uninterrupted`).
"""

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from tests import runs
from tests.config_files import load_config
from tests.runs import command, env, metrics, run
from vitboot_jax import train
from vitboot_jax.base import files
from vitboot_jax.checkpoint import checkpointer, failures, step_dirs
from vitboot_jax.data import splits, tfdata_pipeline
from vitboot_jax.run import metrics as metrics_lib
from vitboot_jax.run import preemption, workdir_rules

# Triggers of runs.WatchedRun besides runs.after_step: its log line, or its checkpoint directory.


def _during_eval(line, workdir):
  return line is not None and "Evaluating at step" in line


def _during_save(line, workdir):
  ckpt_dir = None if workdir is None else workdir / "checkpoints"
  return ckpt_dir is not None and any(".orbax-checkpoint-tmp" in n for n in _names(ckpt_dir))


def _names(directory):
  try:
    return os.listdir(directory)
  except FileNotFoundError:
    return []


def _assert_same_run(workdir, reference):
  want = json.loads((reference / "final.json").read_text())
  got = json.loads((workdir / "final.json").read_text())
  for key in ("step", "top1_vit", "top1_agent", "top5_vit", "ce_vit", "ce_agent", "count"):
    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
  records = metrics(workdir)
  train_steps = [r["step"] for r in records if "train/loss_vit" in r]
  assert train_steps == list(range(1, 31)), "every step exactly once, in order"
  assert [r["step"] for r in records if "eval/top1_vit" in r] == [10, 20, 30]
  reference_records = {r["step"]: r for r in metrics(reference) if "train/loss_vit" in r}
  for r in records:
    if "train/loss_vit" in r:
      want = reference_records[r["step"]]
      for key in ("train/loss_vit", "train/loss_agent", "train/feature"):
        assert r[key] == pytest.approx(want[key], rel=1e-5), (r["step"], key)


@pytest.mark.slow
def test_kills_at_random_moments_resume_to_the_uninterrupted_result(
  uninterrupted, image_folder, tmp_path
):
  workdir = tmp_path / "faulted"
  rng = np.random.default_rng(19)
  after_steps = sorted(rng.choice(np.arange(2, 29), size=2, replace=False).tolist())
  faults = [
    runs.after_step(after_steps[0]),
    _during_save,
    _during_eval,
    runs.after_step(after_steps[1]),
  ]
  fired = []
  for trigger in faults:
    watched = runs.WatchedRun(workdir, image_folder, trigger)
    code = watched.wait()
    fired.append(watched.fired)
    if code == 0:
      break  # The run ended before this fault could fire: nothing left to interrupt.
    assert code == -signal.SIGKILL, "".join(watched.log)[-3000:]
    if watched.fired == "_during_save":
      # The case: a `<step>` directory without its commit marker, as a kill mid-save can
      # leave it, must not stop the resumed run from saving that step.
      complete = sorted(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit())
      if complete:
        nxt = workdir / "checkpoints" / str(complete[-1] + 4)
        if not nxt.exists():
          (nxt / "default").mkdir(parents=True)
  if not (workdir / "final.json").exists():
    run(workdir, image_folder)
  assert sum(f is not None for f in fired) >= 3, fired
  _assert_same_run(workdir, uninterrupted)
  assert not list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_exits_cleanly_and_resumes(uninterrupted, image_folder, tmp_path):
  workdir = tmp_path / "terminated"
  watched = runs.WatchedRun(workdir, image_folder, runs.after_step(13), sig=signal.SIGTERM)
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  log = "".join(watched.log)
  assert "Traceback" not in log
  stopped = [line for line in watched.log if "Stopped by SIGTERM after step" in line]
  assert len(stopped) == 1 and "Re-run the same command to resume" in stopped[0]
  step = int(stopped[0].split("after step ")[1].split(":")[0])
  assert 13 <= step < 30  # Mid-epoch: the step in flight finished, then it saved and stopped.
  assert (workdir / "checkpoints" / str(step) / workdir_rules.COMMIT_MARKER).exists()
  assert max(r["step"] for r in metrics(workdir)) == step
  assert not (workdir / "final.json").exists()
  proc = run(workdir, image_folder)
  assert f"Resuming from the checkpoint of step {step}" in proc.stderr
  _assert_same_run(workdir, uninterrupted)


@pytest.mark.slow
def test_sigterm_during_an_evaluation_saves_the_step_unevaluated_and_resumes(
  uninterrupted, image_folder, tmp_path
):
  """The stop does not wait for the evaluation; the resumed run evaluates that step first."""
  workdir = tmp_path / "terminated_in_eval"
  one_image_batches = ("--config.data.eval_batch_size=1",)  # 40 batches: a signal lands mid-way.
  watched = runs.WatchedRun(
    workdir, image_folder, _during_eval, sig=signal.SIGTERM, overrides=one_image_batches
  )
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  log = "".join(watched.log)
  assert "Traceback" not in log
  assert "The evaluation of step 10 stopped early; it runs again on resume." in log
  assert "Stopped by SIGTERM after step 10" in log
  assert (workdir / "checkpoints" / "10" / workdir_rules.COMMIT_MARKER).exists()
  assert not [r for r in metrics(workdir) if "eval/top1_vit" in r]
  proc = run(workdir, image_folder, *one_image_batches)
  assert "Resuming from the checkpoint of step 10" in proc.stderr
  assert proc.stderr.index("Evaluating at step 10") < proc.stderr.index("step 11/30")
  _assert_same_run(workdir, uninterrupted)


# ---------------------------------------------------------------------------------------------
# In-process faults.


def test_stop_signals_are_recorded_and_handlers_restored():
  before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
  for sig in (signal.SIGTERM, signal.SIGINT):
    with preemption.StopSignals() as stop:
      assert not stop.reached(1)
      os.kill(os.getpid(), sig)
      assert stop.reached(2) and stop.received == signal.Signals(sig).name
  assert {sig: signal.getsignal(sig) for sig in before} == before
  stopped = preemption.Preempted("SIGINT", 7, "/w/checkpoints/7")
  assert stopped.exit_code == 130 and "after step 7" in str(stopped)


def test_a_stop_signal_cuts_an_evaluation_short():
  with preemption.StopSignals() as stop:
    assert list(stop.interrupting(iter([1, 2]))) == [1, 2]
    batches = stop.interrupting(iter([1, 2, 3]))
    assert next(batches) == 1
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(preemption.EvaluationInterrupted):
      next(batches)


def _tiny_config(folder):
  config = load_config("tiny_config")
  config.data.dir = str(folder)
  config.num_epochs = 1
  return config


@pytest.mark.slow
def test_non_finite_loss_stops_before_saving_it(image_folder, tmp_path, monkeypatch):
  """A NaN loss at a checkpoint step (8) stops training; steps 4 survives, 8 is never written."""
  runs.poison_ce_vit(monkeypatch, lambda step: step == 8)
  workdir = tmp_path / "nan"
  with pytest.raises(train.NonFiniteError) as info:
    train.train_and_evaluate(_tiny_config(image_folder), str(workdir))
  message = str(info.value)
  assert "Non-finite ce_vit at step 8" in message
  assert f"newest complete checkpoint is step 4 ({workdir / 'checkpoints' / '4'})" in message
  assert "loss_vit=" in message and "config.optim.lr" in message
  assert sorted(os.listdir(workdir / "checkpoints")) == ["4"]


@pytest.mark.slow
def test_a_full_disk_under_the_metrics_is_one_line(image_folder, tmp_path, monkeypatch):
  """The disk may fill under metrics.jsonl before any save notices: one line, the file, the fix
  and the checkpoint a re-run resumes from (step 4 of 10)."""
  real_open = open

  def full_after_step_5(file, mode="r", *args, **kwargs):
    # /dev/full fails as a full disk does: at the flush on close, naming no file.
    if str(file).endswith("metrics.jsonl") and "a" in mode and os.path.exists(file):
      with real_open(file) as f:
        if '"step": 5,' in f.read():
          file = "/dev/full"
    return real_open(file, mode, *args, **kwargs)

  monkeypatch.setattr(files, "open", full_after_step_5, raising=False)
  workdir = tmp_path / "full"
  with pytest.raises(train.WriteError) as info:
    train.train_and_evaluate(_tiny_config(image_folder), str(workdir))
  message = str(info.value)
  assert "\n" not in message and f"Writing {workdir / 'metrics.jsonl'} failed" in message
  assert message.count("metrics.jsonl") == 1, message
  assert "No space left on device" in message and "Free disk space" in message
  assert "newest complete checkpoint (step 4), which is intact" in message


def test_a_write_failing_at_its_flush_names_its_file(tmp_path, monkeypatch):
  """A full disk fails a write at its flush, with no file in the error: the error names it."""
  with pytest.raises(OSError) as info:
    files.append_text("/dev/full", "a line\n")  # Fails as a full disk does, at close.
  assert info.value.errno == 28 and info.value.filename == "/dev/full"

  target = tmp_path / "final.json"
  target.write_text("old")

  def full(fd):
    raise OSError(28, os.strerror(28))

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError) as info:
    files.write_atomically(target, "new")
  assert info.value.errno == 28 and info.value.filename == str(target)
  assert target.read_text() == "old" and os.listdir(tmp_path) == ["final.json"]


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_unreadable_image_is_named(image_folder, tmp_path, damage):
  import shutil

  folder = tmp_path / "data"
  shutil.copytree(image_folder, folder)
  bad = folder / "train" / "class3" / "007.png"
  data = bad.read_bytes()
  bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
  config = _tiny_config(folder)
  with pytest.raises(splits.UnreadableImageError) as info:
    for _ in tfdata_pipeline.train_batches(config):
      pass
  message = str(info.value)
  assert message.startswith(f"Cannot read image file {bad}: ")
  assert "Replace or delete" in message
  assert ("0 bytes" if damage == "empty" else "Invalid PNG data") in message


def _tmpfs(mount_point, size):
  """A tmpfs of `size` at `mount_point` (needs root, as on our VMs and CI), unmounted after the
  test; skips the test where mounting is not allowed."""
  mount_point.mkdir()
  mounted = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True
  )
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def disk_64k(tmp_path):
  yield from _tmpfs(tmp_path / "disk_64k", "64k")


@pytest.mark.skipif(metrics_lib.RecordWriter is None, reason="no tensorboard package")
def test_a_full_disk_under_the_event_file_names_it(disk_64k):
  """A full disk fails the event file's write or flush, naming no file: the error names it."""
  disk = disk_64k
  events = metrics_lib._EventWriter(str(disk))
  try:
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:  # The disk fills up.
      f.write(b"x" * 65536)
    with pytest.raises(OSError) as info:
      for step in range(1, 1000):  # Past the page the file has.
        events.write_scalars(step, {"train/loss": 1.0, "train/lr": 0.1})
        events.flush()
    assert info.value.errno == 28
    assert os.path.basename(info.value.filename).startswith("events.out.tfevents.")
  finally:
    with contextlib.suppress(OSError):
      events.close()


@pytest.fixture
def small_disk(tmp_path):
  """A 3 MB disk."""
  yield from _tmpfs(tmp_path / "disk", "3m")


@pytest.fixture
def tiny_disk(tmp_path):
  """A 400 KB disk: too small for one checkpoint of the tiny config (about 600 KB)."""
  yield from _tmpfs(tmp_path / "tiny_disk", "400k")


# Orbax logs the failed background write itself; the error below is what the user acts on.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_full_disk_save_fails_clearly_and_keeps_the_older_checkpoint(small_disk):
  state = {"w": jax.random.normal(jax.random.key(0), (500, 1000))}  # 2 MB, incompressible.
  with checkpointer.Checkpointer(small_disk) as ckpt:
    assert ckpt.save(1, state, force=True)
    ckpt.wait()
    with pytest.raises(failures.CheckpointSaveError) as info:
      ckpt.save(2, {"w": state["w"] + 1}, force=True)
      deadline = time.time() + 60
      while time.time() < deadline:  # The loop asks every step: the failure shows at once.
        ckpt.should_save(3)
        time.sleep(0.01)
  message = str(info.value)
  assert "Saving a checkpoint under" in message and "\n" not in message
  assert "No space left on device" in message and "Free disk space" in message
  assert "newest complete checkpoint (step 1), which is intact" in message
  with checkpointer.Checkpointer(small_disk) as ckpt:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    restored, step = ckpt.restore_latest(abstract)
  assert step == 1
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))


@pytest.mark.slow
def test_a_failed_save_is_one_line_from_main(image_folder, tiny_disk):
  """Orbax, tensorstore and asyncio log a failed background write hundreds of lines deep; the
  user sees our line alone, and the exit code of a failed save (1)."""
  proc = subprocess.run(
    command(tiny_disk / "run", image_folder), env=env(1), capture_output=True, text=True
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  log = proc.stderr
  assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
  errors = [line for line in log.splitlines() if not line.startswith(("I1", "I0"))]
  assert len(errors) == 1 and log.rstrip().endswith(errors[0]), log[-3000:]
  # The background write of step 4 fails, or metrics.jsonl does first; either names its files.
  saving = r"Saving (a checkpoint|step \d+) under .*/run/checkpoints failed"
  assert re.search(rf"{saving}|Writing .*/run/metrics\.jsonl failed", errors[0]), errors[0]
  assert "No space left on device" in errors[0] and "Free disk space" in errors[0]


def _overwrite_4k_of_the_largest_data_file(step_dir):
  """Bit rot or a bad copy, as a user met it: 4 KiB of random bytes mid-file, the size unchanged."""
  files = [p for p in (step_dir / "default").rglob("*") if p.is_file() and "/d/" in str(p)]
  path = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  data[middle : middle + 4096] = np.random.default_rng(5).bytes(len(data[middle : middle + 4096]))
  path.write_bytes(bytes(data))


def _garble_metadata(step_dir):
  path = step_dir / "default" / "_METADATA"
  path.write_bytes(path.read_bytes().replace(b'"', b"'", 3))


def _truncate_a_file(step_dir):
  path = next(p for p in (step_dir / "default").rglob("*") if p.is_file() and "/d/" in str(p))
  with open(path, "r+b") as f:
    f.truncate(path.stat().st_size // 2)


def _remove_a_file(step_dir):
  next(p for p in (step_dir / "default").rglob("*") if p.is_file() and "/d/" in str(p)).unlink()


@pytest.mark.slow
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
  uninterrupted, image_folder, tmp_path
):
  """The issue's case: SIGTERM after a save, 4 KiB of the newest step overwritten, the same
  command re-run. It sets the step aside with one warning and ends as if never interrupted."""
  import shutil

  workdir = tmp_path / "rotted"
  watched = runs.WatchedRun(workdir, image_folder, runs.after_step(9), sig=signal.SIGTERM)
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  root = workdir / "checkpoints"
  steps = sorted(int(n) for n in os.listdir(root) if n.isdigit())
  assert len(steps) == 3, steps  # 4, 8 and the step it stopped at.
  shutil.copytree(workdir, tmp_path / "all_damaged")  # For the test below, damaged otherwise.
  _overwrite_4k_of_the_largest_data_file(root / str(steps[-1]))

  proc = run(workdir, image_folder)
  assert "Traceback" not in proc.stderr
  (warning,) = [line for line in proc.stderr.splitlines() if " is damaged (" in line]
  assert warning.startswith("W") and f"Checkpoint step {steps[-1]} is damaged (" in warning
  assert "fails its CRC32 check" in warning and str(root / "damaged" / f"{steps[-1]}-") in warning
  assert f"Resuming from the checkpoint of step {steps[-2]}" in proc.stderr
  _assert_same_run(workdir, uninterrupted)
  assert [n.split("-")[0] for n in os.listdir(root / "damaged")] == [str(steps[-1])]

  # Every step damaged, each in another way, and config.json lost too.
  workdir = tmp_path / "all_damaged"
  root = workdir / "checkpoints"
  for step, damage in zip(steps, (_garble_metadata, _truncate_a_file, _remove_a_file)):
    damage(root / str(step))
  (workdir / "config.json").unlink()
  before = {n: sorted(os.listdir(root / n)) for n in os.listdir(root)}
  refused = subprocess.run(
    command(workdir, image_folder), env=env(1), capture_output=True, text=True
  )
  assert refused.returncode == 2, refused.stderr[-3000:]
  line = _refusal(refused)
  assert "holds a saved run but no config.json" in line and "--adopt_config" in line
  assert {n: sorted(os.listdir(root / n)) for n in os.listdir(root)} == before  # Untouched.
  adopted = subprocess.run(
    command(workdir, image_folder, "--adopt_config"), env=env(1), capture_output=True, text=True
  )
  assert adopted.returncode == 2, adopted.stderr[-3000:]
  line = _refusal(adopted)
  assert f"No checkpoint in {root} is intact" in line
  assert all(f"step {s} (" in line for s in steps), line
  assert "Re-run the same command to train from step 0" in line
  assert sorted(n.split("-")[0] for n in os.listdir(root / "damaged")) == sorted(map(str, steps))
  assert not [n for n in os.listdir(root) if n.isdigit()]


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_the_same_step(uninterrupted, image_folder, tmp_path):
  """Multi-process: JAX's preemption sync picks one step; every process saves it and exits."""
  workdir = tmp_path / "pod"
  port = _free_port()

  def start(*overrides):
    return _start_two(workdir, image_folder, port, *overrides)

  procs = start()
  deadline = time.time() + 300
  while time.time() < deadline and not runs.after_step(9)(None, workdir):
    assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
    time.sleep(0.01)
  procs[1].send_signal(signal.SIGTERM)
  logs = [p.communicate(timeout=300)[1] for p in procs]
  stopped_at = []
  both_logs = "\n".join(f"process {i}: {log[-3000:]}" for i, log in enumerate(logs))
  for proc, log in zip(procs, logs):
    assert proc.returncode == 128 + signal.SIGTERM, both_logs
    line = next(x for x in log.splitlines() if "Stopped by SIGTERM after step" in x)
    stopped_at.append(int(line.split("after step ")[1].split(":")[0]))
  assert stopped_at[0] == stopped_at[1] and 9 <= stopped_at[0] < 30, stopped_at
  assert (workdir / "checkpoints" / str(stopped_at[0]) / workdir_rules.COMMIT_MARKER).exists()

  procs = start()
  for proc in procs:
    _, log = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
  got = json.loads((workdir / "final.json").read_text())
  assert got["resumed_from_step"] == stopped_at[0] and got["step"] == 30 and got["count"] == 40
  # The same losses as the single-process run, before and after the stop (1e-3: 2 processes sum
  # gradients in another order, and the difference grows over 30 steps).
  want = {r["step"]: r["train/loss_vit"] for r in metrics(uninterrupted) if "train/loss_vit" in r}
  got = {r["step"]: r["train/loss_vit"] for r in metrics(workdir) if "train/loss_vit" in r}
  assert sorted(got) == list(range(1, 31))
  for step in got:
    assert got[step] == pytest.approx(want[step], rel=1e-3), step


def test_the_ending_begins_once_and_an_error_after_it_is_its_echo(monkeypatch, caplog):
  """Once one thread began ending the process, a failure any other thread meets (a read its
  leaving cancelled) waits for the exit: it reads nothing and says nothing."""
  import threading

  from vitboot_jax.run import failing

  state = failing._Ending()
  monkeypatch.setattr(failing, "_STATE", state)
  monkeypatch.setattr(failing, "_multi_process", lambda: True)
  reads = []
  monkeypatch.setattr(failing, "_published", reads.append)
  assert state.begin() and not state.begin()
  cancelled = RuntimeError("CANCELLED: GetKeyValueAsync() was cancelled.")
  for call in (lambda: failing.fail_unforeseen(cancelled), lambda: failing.fail("a line", 1)):
    thread = threading.Thread(target=call, daemon=True)  # Left waiting, as in a real ending.
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()
  assert not reads and not caplog.records


def test_errors_of_a_peer_are_told_from_others():
  from vitboot_jax.run import failing

  for status in ("CANCELLED", "UNAVAILABLE", "DEADLINE_EXCEEDED"):
    assert failing.is_peer_error(RuntimeError(f"{status}: the store's read"))
  try:
    try:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC")
    except RuntimeError as error:
      raise failures.CheckpointSaveError("Saving step 4 failed") from error
  except failures.CheckpointSaveError as error:
    assert failing.is_peer_error(error)
  gloo = "UNKNOWN: Gloo all-reduce failed: [pair.cc:547] Connection closed by peer [::1]:4567"
  assert failing.is_peer_error(RuntimeError(gloo))
  assert not failing.is_peer_error(ValueError("DATA_LOSS: a file cannot be read"))


def test_an_exchange_one_process_alone_made_shifts_only_its_own_name(monkeypatch):
  """Two processes, faked as threads over one store: process 1 makes an exchange process 0
  never makes (it gives up); their next exchange of another name still pairs."""
  import collections
  import threading

  from jax._src import distributed

  from vitboot_jax import sharding

  store, changed, local = {}, threading.Condition(), threading.local()

  class Store:
    def key_value_set(self, key, value):
      with changed:
        store[key] = value
        changed.notify_all()

    def blocking_key_value_get(self, key, timeout_ms):
      with changed:
        if not changed.wait_for(lambda: key in store, timeout_ms / 1000):
          raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
        return store[key]

  class PerProcess(collections.Counter):  # Each faked process counts its own exchanges.
    def __getitem__(self, name):
      return super().__getitem__((local.index, name))

    def __setitem__(self, name, value):
      super().__setitem__((local.index, name), value)

  monkeypatch.setattr(distributed.global_state, "client", Store())
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: local.index)
  monkeypatch.setattr(sharding, "_EXCHANGES", PerProcess())
  got = {}

  def process(index, calls):
    local.index = index
    for name, value, timeout_s in calls:
      try:
        got[index] = sharding.exchange(name, value, timeout_s=timeout_s)
      except RuntimeError as error:
        got[index] = str(error)

  threads = [
    threading.Thread(target=process, args=(1, [("latest", "1", 0.2), ("verify", "v1", 30)])),
    threading.Thread(target=process, args=(0, [("verify", "v0", 30)])),
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert got == {0: ["v0", "v1"], 1: ["v0", "v1"]}


def _free_port():
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_two(workdir, folder, port, *overrides, fault=None, fault0=None):
  """The two processes of one run; `fault` and `fault0` (tests/one_process_faults.py) hit
  process 1 and process 0 alone."""
  procs = []
  for pid, faults in enumerate((fault0, fault)):
    variables = env(2)
    cmd = command(workdir, folder, *overrides) + [
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={pid}",
    ]
    if faults:
      cmd[1:3] = ["-m", "tests.one_process_faults"]
      variables["VITBOOT_TEST_FAULT"] = faults
    procs.append(
      subprocess.Popen(
        cmd, env=variables, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
      )
    )
  return procs


def _ended_together(procs, timeout=240):
  """(exit code, the one line) that every process ended with; fails, not hangs, if one waits."""
  try:
    logs = [p.communicate(timeout=timeout)[1] for p in procs]
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    logs = [p.communicate()[1] for p in procs]
    pytest.fail(f"a process still waited after {timeout} s:\n{_both(logs)}")
  ends = set()
  for proc, log in zip(procs, logs):
    assert "Traceback" not in log, _both(logs)
    # The line: main's "error: ..." (exit 2) or our logged ERROR (absl's prefix dropped).
    lines = [x for x in log.splitlines() if x.startswith("error: ")]
    lines += [x.split("] ", 1)[1] for x in log.splitlines() if _OUR_ERROR.match(x)]
    assert len(lines) == 1, _both(logs)
    ends.add((proc.returncode, lines[0]))
  assert len(ends) == 1 and min(p.returncode for p in procs) >= 0, _both(logs)  # No abort.
  return ends.pop(), logs


_OUR_ERROR = re.compile(r"^E\d{4} [\d:.]+\s+\d+ (main|failing)\.py:\d+\] ")


def _both(logs):
  return "\n".join(f"process {i}: {log[-3000:]}" for i, log in enumerate(logs))


@pytest.fixture(scope="module")
def saved_run(image_folder, tmp_path_factory):
  """A run of 8 steps with checkpoints 4 and 8, its final.json removed: a run to resume."""
  workdir = tmp_path_factory.mktemp("saved") / "run"
  run(workdir, image_folder, "--config.total_steps=8")
  (workdir / "final.json").unlink()
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize(
  "fault, fault0", [(None, "unreadable"), ("unreadable", None), ("restore", None)]
)
def test_a_restore_failing_on_one_process_ends_every_process(
  saved_run, image_folder, tmp_path, fault, fault0
):
  """A step process 0 finds damaged is set aside by all (none intact: one line, exit 2); one
  that only process 1 cannot read is not damage (process 0, which would move it, reads it): one
  line, exit 1, nothing moved; a restore failing on one process on intact files is one line and
  exit 1 on every process."""
  import shutil

  workdir = tmp_path / "run"
  shutil.copytree(saved_run, workdir)
  root = workdir / "checkpoints"
  procs = _start_two(
    workdir, image_folder, _free_port(), "--config.total_steps=8", fault=fault, fault0=fault0
  )
  (code, line), logs = _ended_together(procs)
  assert not (workdir / "claim.json").exists()  # Released: a re-run takes nothing over.
  if fault0 == "unreadable":
    assert code == 2 and line.startswith(f"error: No checkpoint in {root} is intact"), line
    for step in (8, 4):
      assert f"step {step} (ValueError: DATA_LOSS: injected: a file of step {step}" in line
    assert sorted(n.split("-")[0] for n in os.listdir(root / "damaged")) == ["4", "8"]
    assert logs[0].count(" is damaged (ValueError: DATA_LOSS: injected") == 2  # Moved by 0.
  elif fault == "unreadable":
    assert code == 1 and line.startswith(
      f"Checkpoint {root / '8'} (step 8) cannot be read on "
      "process 1 (ValueError: DATA_LOSS: injected"
    ), line
    assert "but process 0 reads it intact" in line and "Nothing was moved" in line
    assert sorted(os.listdir(root)) == ["4", "8"]
  else:
    assert code == 1 and line.startswith(f"Checkpoint {root / '8'} is intact"), line
    assert "cannot be restored as requested: ValueError: injected: the arrays of step 8" in line
    assert sorted(os.listdir(root)) == ["4", "8"]  # Intact files are never moved.


@pytest.mark.slow
@pytest.mark.parametrize(
  "fault, fault0",
  [
    ("save", None),
    # Process 0 still in the save's agreement when process 1's line comes, and slow to leave:
    # its main thread meets the cancelled read of its own leaving before it exits.
    ("save", "slow_agreement,slow_leaving"),
    # Process 1 fails before the agreement: process 0 is certainly blocked in its read.
    ("save_before_agreement", "slow_leaving"),
  ],
)
def test_a_save_failing_on_one_process_ends_every_process(image_folder, tmp_path, fault, fault0):
  workdir = tmp_path / "run"
  procs = _start_two(workdir, image_folder, _free_port(), fault=fault, fault0=fault0)
  (code, line), _ = _ended_together(procs)
  root = workdir / "checkpoints"
  assert code == 1, line
  assert line.startswith(f"Saving step 4 under {root} failed: No space left on device"), line
  assert "resumes from the newest complete checkpoint (none yet)" in line
  assert not step_dirs.complete_steps(root)
  assert not (workdir / "claim.json").exists()


@pytest.mark.slow
def test_a_background_save_failing_on_one_process_ends_every_process(image_folder, tmp_path):
  """Process 1 learns of its failed background save at the next step's should_save; process 0,
  saving every step, waits for it in that step's agreement until its line comes."""
  workdir = tmp_path / "run"
  overrides = ("--config.total_steps=8", "--config.checkpoint_every_steps=1")
  procs = _start_two(
    workdir, image_folder, _free_port(), *overrides, fault="background_save", fault0="slow_leaving"
  )
  (code, line), _ = _ended_together(procs)
  root = workdir / "checkpoints"
  assert code == 1, line
  assert line.startswith(f"Saving a checkpoint under {root} failed: No space left on device"), line
  assert not (workdir / "claim.json").exists()


@pytest.mark.slow
def test_the_claim_failing_on_process_0_ends_every_process(image_folder, tmp_path):
  """Process 1 waits for process 0's verdict on the claim: a full disk is one too."""
  workdir = tmp_path / "run"
  procs = _start_two(workdir, image_folder, _free_port(), fault0="claim")
  (code, line), _ = _ended_together(procs)
  assert code == 2, line
  assert line.startswith(f"error: Claiming --workdir={workdir} failed: No space left on device"), (
    line
  )
  assert f"({workdir}/claim.json)" in line and "Free disk space" in line
  assert not (workdir / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["in a train step", "in an agreement"])
def test_a_peer_killed_without_a_word_ends_the_survivor_in_bounded_time(
  image_folder, tmp_path, where
):
  """Process 1 SIGKILLed (as the OOM killer does) while process 0 is in a train step's collective
  (it fails at once) or in an agreement (its read never returns): process 0 ends with one line
  naming process 1 and the fix, before jax's own heartbeat check would abort it (100 s)."""
  workdir = tmp_path / "run"
  fault = "killed_before_agreement" if where == "in an agreement" else None
  procs = _start_two(workdir, image_folder, _free_port(), fault=fault)
  if fault is None:
    deadline = time.time() + 300
    while time.time() < deadline and not runs.after_step(6)(None, workdir):
      assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
      time.sleep(0.01)
    procs[1].kill()
  assert procs[1].wait(timeout=300) == -signal.SIGKILL
  killed = time.time()
  _, log = procs[0].communicate(timeout=120)
  waited = time.time() - killed
  assert procs[0].returncode == 1, log[-3000:]
  assert "Traceback" not in log, log[-3000:]
  lines = [x.split("] ", 1)[1] for x in log.splitlines() if _OUR_ERROR.match(x)]
  assert len(lines) == 1, log[-3000:]
  assert lines[0].startswith("Process 1 of this run stopped without a word (no sign of life"), lines
  assert "Relaunch every process with the same command" in lines[0]
  assert waited < 90, waited  # _SILENT_S, then leaving (10 s), on a loaded host.


@pytest.mark.slow
def test_process_0_killed_ends_the_others_at_once_by_jax(image_folder, tmp_path):
  """Process 0 hosts the coordination service: its loss is met by jax's own client, which aborts
  the others at once with its fatal line (its Python callback for that cannot be used: jaxlib
  cannot hand it the status). What README promises: nonzero, at once, and that line."""
  workdir = tmp_path / "run"
  procs = _start_two(workdir, image_folder, _free_port())
  deadline = time.time() + 300
  while time.time() < deadline and not runs.after_step(6)(None, workdir):
    assert all(p.poll() is None for p in procs), procs[1].stderr.read()[-3000:]
    time.sleep(0.01)
  procs[0].kill()
  procs[0].wait(timeout=60)
  killed = time.time()
  _, log = procs[1].communicate(timeout=120)
  assert procs[1].returncode != 0 and time.time() - killed < 30, log[-3000:]
  assert "another task died" in log, log[-3000:]


@pytest.mark.slow
def test_final_json_failing_on_process_0_ends_every_process(image_folder, tmp_path):
  """Process 0 alone writes final.json: process 1 waits to learn how that went, and both end
  with its line, not 1 and 0."""
  workdir = tmp_path / "run"
  procs = _start_two(workdir, image_folder, _free_port(), "--config.total_steps=4", fault0="final")
  (code, line), _ = _ended_together(procs)
  assert code == 1, line
  assert line.startswith(f"Writing {workdir / 'final.json'} failed: No space left on device"), line
  assert "resumes from the newest complete checkpoint (step 4)" in line
  assert not (workdir / "final.json").exists() and not (workdir / "claim.json").exists()


# ---------------------------------------------------------------------------------------------
# The workdir as a contract: one run at a time, no resume on other data.


def _refusal(proc_or_log):
  """The one error line of a run that exited 2, checked to be its last line and alone."""
  log = proc_or_log if isinstance(proc_or_log, str) else proc_or_log.stderr
  assert "Traceback" not in log, log[-3000:]
  errors = [line for line in log.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and log.rstrip().endswith(errors[0]), log[-3000:]
  return errors[0]


@pytest.mark.slow
def test_second_run_on_a_held_workdir_refuses_and_the_first_is_intact(image_folder, tmp_path):
  workdir = tmp_path / "held"

  def start():
    cmd = command(workdir, image_folder)
    return subprocess.Popen(cmd, env=env(1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

  together = [start(), start()]  # A requeued job starting beside its predecessor.
  deadline = time.time() + 300
  while all(p.poll() is None for p in together) and time.time() < deadline:
    time.sleep(0.05)
  loser = next(p for p in together if p.poll() is not None)
  winner = next(p for p in together if p is not loser)
  log = loser.stderr.read().decode()
  assert loser.returncode == 2, log[-3000:]
  line = _refusal(log)
  assert f"--workdir={workdir} is in use by another run: pid {winner.pid}" in line
  assert "own --workdir" in line

  while not runs.after_step(6)(None, workdir):  # Then one launched while the first trains.
    assert winner.poll() is None, winner.stderr.read().decode()[-3000:]
    time.sleep(0.05)
  late = subprocess.run(command(workdir, image_folder), env=env(1), capture_output=True, text=True)
  assert late.returncode == 2 and f"pid {winner.pid}" in _refusal(late)

  _, log = winner.communicate(timeout=600)
  assert winner.returncode == 0, log.decode()[-3000:]
  records = metrics(workdir)
  assert [r["step"] for r in records if "train/loss_vit" in r] == list(range(1, 31))
  assert [r["step"] for r in records if "eval/top1_vit" in r] == [10, 20, 30]
  root = workdir / "checkpoints"
  assert sorted(os.listdir(root)) == ["24", "28", "30"]  # keep 3; nothing moved aside.
  assert all((root / s / workdir_rules.COMMIT_MARKER).exists() for s in os.listdir(root))
  assert not (workdir / "claim.json").exists()
  assert json.loads((workdir / "final.json").read_text())["resumed_from_step"] == 0


@pytest.mark.slow
def test_resume_after_the_data_changed_is_refused(image_folder, tmp_path):
  import shutil

  folder = tmp_path / "data"
  shutil.copytree(image_folder, folder)
  workdir = tmp_path / "changed"
  watched = runs.WatchedRun(workdir, folder, runs.after_step(5), sig=signal.SIGTERM)
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  before = sorted(os.listdir(workdir / "checkpoints"))
  for png in sorted(folder.glob("train/*/*.png"))[::2]:  # Half the training images deleted.
    png.unlink()
  proc = subprocess.run(command(workdir, folder), env=env(1), capture_output=True, text=True)
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = _refusal(proc)
  assert "trained on other data" in line and "'train' examples 160 -> 80" in line
  assert "steps per epoch 10 -> 5" in line and "new --workdir" in line
  assert sorted(os.listdir(workdir / "checkpoints")) == before
  assert max(r["step"] for r in metrics(workdir)) >= 5


# ---------------------------------------------------------------------------------------------
# Bad data: one line naming the file(s), exit 2 (errors.UsageError).


@pytest.fixture
def data_copy(image_folder, tmp_path):
  import shutil

  folder = tmp_path / "data"
  shutil.copytree(image_folder, folder)
  return folder


def test_a_class_in_only_one_split_is_a_data_error(data_copy):
  import shutil

  from vitboot_jax.base import errors

  extra = data_copy / "test" / "zebra"
  shutil.copytree(data_copy / "test" / "class0", extra)
  with pytest.raises(errors.DataError, match=r"classes \['zebra'\] are only in 'test'"):
    tfdata_pipeline.dataset_info(_tiny_config(data_copy))
  shutil.rmtree(extra)
  shutil.rmtree(data_copy / "test" / "class3")
  with pytest.raises(errors.DataError, match=r"\['class3'\] of the training split have no folder"):
    tfdata_pipeline.dataset_info(_tiny_config(data_copy))


def test_unsupported_files_are_counted_and_named(data_copy, caplog):
  for name in ("a.bmp", "b.webp", "c.tif"):
    (data_copy / "train" / "class1" / name).write_bytes(b"not used")
  with caplog.at_level("WARNING"):
    info = tfdata_pipeline.dataset_info(_tiny_config(data_copy))
  assert info.num_train_examples == 160
  assert "Skipping 3 file(s)" in caplog.text
  assert str(data_copy / "train" / "class1" / "b.webp") in caplog.text


@pytest.mark.parametrize("pipeline", ["tfdata", "device"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "wrong size"])
def test_a_bad_test_image_stops_the_run_before_training(data_copy, damage, pipeline):
  import tensorflow as tf

  from vitboot_jax import sharding
  from vitboot_jax.base import errors
  from vitboot_jax.data import loop_feed, tfdata_undecodable

  config = _tiny_config(data_copy)
  config.data.pipeline = pipeline  # Suspects are decoded by TensorFlow or by PIL.
  config.image_size = 64  # Stored at 32, resized on the device: every image must be 32x32.
  config.data.stored_size = 32
  bad = data_copy / "test" / "class2" / "001.png"
  data = bad.read_bytes()
  if damage == "truncated":
    bad.write_bytes(data[: len(data) // 2])
  elif damage == "empty":
    bad.write_bytes(b"")
  else:
    bad.write_bytes(tf.io.encode_png(np.zeros((40, 36, 3), np.uint8)).numpy())
  if pipeline == "tfdata":
    check = functools.partial(tfdata_undecodable.check_split, config, "test")
  else:  # Loading decodes every image and checks its size: train.py checks nothing after it.
    check = functools.partial(loop_feed.open_feed, config, sharding.make_mesh())
  with pytest.raises(errors.UsageError) as info:  # main: one line, exit 2.
    check()
  message = str(info.value)
  assert str(bad) in message and "\n" not in message
  if damage == "wrong size":
    assert "stored_size=32 but image file" in message and "(40x36) is not 32x32" in message
  # The same file met while evaluating is named too (larger splits are not checked up front).
  if damage != "empty" and pipeline == "tfdata":
    with pytest.raises(errors.UsageError, match=str(bad)):
      for _ in tfdata_pipeline.eval_batches(config):
        pass

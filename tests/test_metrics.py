"""Tests for vitboot_jax.run.metrics: metrics.jsonl, resume truncation, TensorBoard, atomic JSON."""

import glob
import json
import math
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitboot_jax.run import metrics as metrics_lib


def test_write_appends_json_lines_with_python_numbers(tmp_path):
  with metrics_lib.MetricWriter(tmp_path) as writer:
    writer.write(1, {"loss": jnp.float32(2.5), "acc": np.float64(0.25), "lr": 1e-3})
    writer.write(2, {"loss": jnp.asarray([1.5]), "epoch": np.int32(0), "nan": float("nan")})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert json.loads(lines[0]) == {"step": 1, "loss": 2.5, "acc": 0.25, "lr": 1e-3}
  assert list(json.loads(lines[0])) == ["step", "loss", "acc", "lr"]
  records = metrics_lib.read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2]
  assert records[1]["loss"] == 1.5 and isinstance(records[1]["epoch"], int)
  assert math.isnan(records[1]["nan"])


def test_rejects_non_scalars_and_the_reserved_step_key(tmp_path):
  with metrics_lib.MetricWriter(tmp_path) as writer:
    with pytest.raises(ValueError, match="scalar"):
      writer.write(1, {"loss": np.zeros(3)})
    with pytest.raises(ValueError, match="reserved"):
      writer.write(1, {"step": 1})
    with pytest.raises(TypeError, match="real number"):
      writer.write(1, {"name": "abc"})
  assert metrics_lib.read_metrics(tmp_path) == []


def test_resume_drops_lines_after_the_restored_step(tmp_path):
  with metrics_lib.MetricWriter(tmp_path) as writer:
    for step in range(1, 6):
      writer.write(step, {"loss": float(step)})
  # The killed run checkpointed at step 3; its steps 4-5 are written again after the resume.
  with metrics_lib.MetricWriter(tmp_path) as writer:
    assert writer.truncate_after(3) == 2
    assert writer.truncate_after(3) == 0
    for step in range(4, 7):
      writer.write(step, {"loss": 10.0 + step})
  records = metrics_lib.read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  assert records[3]["loss"] == 14.0


def test_torn_last_line_is_dropped_on_read_and_resume(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
  assert metrics_lib.read_metrics(tmp_path) == [{"step": 1, "loss": 1.0}]
  with metrics_lib.MetricWriter(tmp_path) as writer:
    writer.truncate_after(1)
    writer.write(2, {"loss": 2.0})
  assert path.read_text() == '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 2.0}\n'


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
    metrics_lib.read_metrics(tmp_path)


def test_fresh_start_and_missing_file(tmp_path):
  assert metrics_lib.read_metrics(tmp_path / "nowhere") == []
  with metrics_lib.MetricWriter(tmp_path / "run") as writer:
    assert writer.truncate_after(-1) == 0
    writer.write(0, {"loss": 1.0})
    assert writer.truncate_after(-1) == 1
  assert metrics_lib.read_metrics(tmp_path / "run") == []


def test_tensorboard_events_hold_the_scalars(tmp_path):
  with metrics_lib.MetricWriter(tmp_path) as writer:
    writer.write(3, {"train/loss": 0.75})
    writer.flush()
  (event_file,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
  import tensorflow as tf  # Only to read the event file back.

  found = {}
  for event in tf.compat.v1.train.summary_iterator(event_file):
    for value in event.summary.value:
      found[(event.step, value.tag)] = float(tf.make_ndarray(value.tensor))
  assert found == {(3, "train/loss"): 0.75}


@pytest.mark.skipif(metrics_lib.RecordWriter is None, reason="no tensorboard package")
def test_tensorboard_sees_scalars_without_an_explicit_flush(tmp_path, monkeypatch):
  """Writes flush every EVENTS_FLUSH_SECONDS, in the caller's thread: a writer thread's failure
  (a full disk) would print a traceback instead of the run's one line."""
  threads = threading.active_count()
  writer = metrics_lib.MetricWriter(tmp_path)
  assert threading.active_count() == threads
  (event_file,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
  size = os.path.getsize(event_file)
  writer.write(1, {"train/loss": 0.5})
  assert os.path.getsize(event_file) == size  # Not yet due.
  monkeypatch.setattr(metrics_lib, "EVENTS_FLUSH_SECONDS", 0.0)
  writer.write(2, {"train/loss": 0.25})
  assert os.path.getsize(event_file) > size
  writer.close()


def test_only_process_zero_writes_files(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with metrics_lib.MetricWriter(tmp_path) as writer:
    writer.write(1, {"loss": 1.0})
    assert writer.truncate_after(0) == 0
  assert os.listdir(tmp_path) == []


def test_write_json_is_atomic_and_handles_numpy(tmp_path):
  path = tmp_path / "sub" / "final.json"
  metrics_lib.write_json(path, {"acc": np.float32(0.5), "shape": np.arange(3), "dir": tmp_path})
  metrics_lib.write_json(path, {"acc": jnp.float32(0.75), "steps": (1, 2)})
  assert json.loads(path.read_text()) == {"acc": 0.75, "steps": [1, 2]}
  assert os.listdir(path.parent) == ["final.json"]  # No temporary file left behind.
  with pytest.raises(TypeError, match="not JSON serialisable"):
    metrics_lib.write_json(path, {"bad": object()})
  assert json.loads(path.read_text())["acc"] == 0.75  # The old file survives a failed write.


@pytest.mark.skipif(metrics_lib.RecordWriter is None, reason="no tensorboard package")
def test_two_writers_in_one_second_keep_two_event_files(tmp_path):
  metrics_lib.MetricWriter(tmp_path / "warm").close()  # TensorFlow's import takes seconds.
  for step in (1, 2):
    with metrics_lib.MetricWriter(tmp_path / "run") as writer:
      writer.write(step, {"train/loss": 0.5})
  assert len(glob.glob(os.path.join(tmp_path, "run", "events.out.tfevents.*"))) == 2

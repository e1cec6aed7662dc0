"""End-to-end training: outputs, resume after SIGKILL, 1 vs 8 devices, 2 processes, bad input."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.config_files import load_config
from tests.runs import REPO
from tests.runs import command as _command
from tests.runs import env as _env
from tests.runs import metrics as _metrics
from tests.runs import run as _run
from tests.runs import train_losses as _train_losses
from vitboot_jax.cpu import host_memory
from vitboot_jax.run import provenance


@pytest.mark.slow
def test_end_to_end_outputs(uninterrupted):
  workdir = uninterrupted
  for name in ("config.json", "metrics.jsonl", "final.json"):
    assert (workdir / name).exists(), name
  assert list(workdir.glob("events.out.tfevents*"))
  final = json.loads((workdir / "final.json").read_text())
  assert final["step"] == 30 and final["count"] == 40.0 and final["resumed_from_step"] == 0
  (launch,) = provenance.launches(workdir)
  assert launch["start_step"] == 0 and launch["devices"] >= 1 and launch["software"]["jax"]
  # The allocator main re-executed under, or this environment's where it does not re-execute.
  reexec = host_memory.preload_environment(dict(os.environ))
  assert launch["host_allocator"] == (
    reexec[host_memory.PRELOADED] if reexec else host_memory.description()
  )
  assert final["code"] == launch["code"] == provenance.code()
  for model in ("vit", "agent"):
    assert 0.0 <= final[f"top1_{model}"] <= 1.0 and final[f"top5_{model}"] >= final[f"top1_{model}"]
  records = _metrics(workdir)
  steps = [r["step"] for r in records if "train/loss_vit" in r]
  assert steps == list(range(1, 31))
  evals = [r for r in records if "eval/top1_vit" in r]
  assert [r["step"] for r in evals] == [10, 20, 30]  # Exact eval at the end of every epoch.
  assert {"train/align_cosine", "train/feature_weight", "train/lr"} <= set(records[0])
  # Per-epoch feature decay (official): 1, 1 - 1/3, 1 - 2/3.
  weights = {r["step"]: r["train/feature_weight"] for r in records if "train/feature_weight" in r}
  assert weights[1] == 1.0 and abs(weights[15] - 2 / 3) < 1e-6 and abs(weights[25] - 1 / 3) < 1e-6
  checkpoints = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert checkpoints[-1] == 30 and len(checkpoints) <= 3


@pytest.mark.slow
def test_rerunning_a_finished_run_exits_at_once(uninterrupted, image_folder):
  before = (uninterrupted / "metrics.jsonl").read_text()
  proc = _run(uninterrupted, image_folder)
  assert "already holds a finished run" in proc.stderr
  assert (uninterrupted / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted(uninterrupted, image_folder, tmp_path):
  workdir = tmp_path / "killed"
  proc = subprocess.Popen(
    _command(workdir, image_folder), env=_env(1), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
  )
  deadline = time.time() + 300
  ckpt_dir = workdir / "checkpoints"
  # Kill it hard once a checkpoint past step 8 exists: mid-training, mid-epoch.
  while time.time() < deadline and proc.poll() is None:
    done = (
      [int(p.name) for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
    )
    if any(s >= 12 for s in done):
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.05)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
  assert not (workdir / "final.json").exists()
  _run(workdir, image_folder)
  want = json.loads((uninterrupted / "final.json").read_text())
  got = json.loads((workdir / "final.json").read_text())
  assert got["resumed_from_step"] >= 12
  # Each launch left its line: the killed one from step 0, the resume from its checkpoint.
  starts = [launch["start_step"] for launch in provenance.launches(workdir)]
  assert starts == [0, got["resumed_from_step"]]
  for key in ("top1_vit", "top1_agent", "ce_vit", "ce_agent"):
    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
  # Same train losses at every step, no duplicated steps after the resume.
  want_losses, got_losses = _train_losses(_metrics(uninterrupted)), _train_losses(_metrics(workdir))
  assert sorted(got_losses) == list(range(1, 31))
  for step, loss in want_losses.items():
    assert got_losses[step] == pytest.approx(loss, rel=1e-5), step


def _assert_same_train_losses(reference, records, steps):
  want = {r["step"]: r for r in reference if "train/loss_vit" in r}
  got = {r["step"]: r for r in records if "train/loss_vit" in r}
  assert sorted(got) == list(steps)
  for step in steps:
    for key in ("train/loss_vit", "train/loss_agent", "train/ce_vit", "train/feature"):
      assert got[step][key] == pytest.approx(want[step][key], rel=1e-4), (step, key)


@pytest.mark.slow
def test_eight_devices_match_one(uninterrupted, image_folder, tmp_path):
  # The uninterrupted run used 1 device; the same first 3 steps on 8 devices.
  _run(tmp_path / "eight", image_folder, "--config.total_steps=3", devices=8)
  _assert_same_train_losses(_metrics(uninterrupted), _metrics(tmp_path / "eight"), range(1, 4))


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_and_agree(uninterrupted, image_folder, tmp_path):
  port = _free_port()
  procs = []
  for pid in range(2):
    cmd = _command(tmp_path / "run", image_folder, "--config.total_steps=3") + [
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={pid}",
    ]
    procs.append(
      subprocess.Popen(
        cmd, env=_env(2), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
      )
    )
  errs = [proc.communicate(timeout=600)[1] for proc in procs]
  both_logs = "\n".join(f"process {i}: {e[-3000:]}" for i, e in enumerate(errs))
  for proc in procs:  # Both logs: one process's fault ends both.
    assert proc.returncode == 0, both_logs
  finals = []
  for pid, err in enumerate(errs):
    assert f"process {pid}/2, 2 local / 4 global devices" in err
    line = next(x for x in err.splitlines() if "Finished: " in x)
    finals.append(json.loads(line.split("Finished: ", 1)[1]))
  for key in ("top1_vit", "top1_agent", "ce_vit", "ce_agent", "count"):
    assert finals[0][key] == finals[1][key], key
  assert finals[0]["count"] == 40.0  # Every test example exactly once over both processes.
  # Process 0 wrote the metrics: the same losses as the single-process, single-device run.
  _assert_same_train_losses(_metrics(uninterrupted), _metrics(tmp_path / "run"), range(1, 4))


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.mode=bootstrap", "config.mode"),
    ("--config.image_size=30", "config.image_size=30 is not divisible"),
    ("--config.data.dir=/nonexistent/cifar", "config.data.dir"),
    ("--config.data.train_fraction=1.5", "config.data.train_fraction"),
    ("--config.batch_size=12", "config.batch_size=12 is not divisible by the 8 devices"),
    ("--config.eval_every_epochs=0", "config.eval_every_epochs=0 must be a positive integer"),
  ],
)
def test_bad_input_fails_fast_naming_the_field(override, message, tmp_path):
  from vitboot_jax import train

  sys.path.insert(0, str(REPO))

  config = load_config("tiny_config")
  config.data.dir = "/nonexistent/cifar"
  key, value = override.removeprefix("--config.").split("=")
  target = config
  *groups, field = key.split(".")
  for g in groups:
    target = target[g]
  target[field] = type(target[field])(value) if target[field] is not None else value
  with pytest.raises((ValueError, FileNotFoundError), match=message.replace("(", r"\(")):
    train.train_and_evaluate(config, str(tmp_path / "bad"))
  assert not (tmp_path / "bad").exists()  # Nothing is written before the run is known to start.


@pytest.mark.slow
def test_end_to_end_on_tfds_mock_data(tmp_path, monkeypatch):
  """A tiny shared-mode run on a tfds dataset (tfds.testing.mock_data: no download, no files)."""
  import functools

  import tensorflow_datasets as tfds

  from vitboot_jax import train
  from vitboot_jax.checkpoint import checkpointer
  from vitboot_jax.data import prepare

  # mock_data swaps in a fake filesystem (process-wide) while tfds builds a dataset; an orbax
  # save running in a background thread at that moment would write into it. Save synchronously.
  monkeypatch.setattr(
    train.checkpointer,
    "Checkpointer",
    functools.partial(checkpointer.Checkpointer, async_save=False),
  )
  # mock_data's download_and_prepare is a no-op; the network probe before it would fail offline.
  monkeypatch.setattr(prepare, "_reachable", lambda host: True)

  config = load_config("tiny_config", "data=cifar10")
  config.num_epochs = 2  # 48 examples / batch 16: 3 steps per epoch, 6 in all; stop at 4.
  config.total_steps = 4
  config.checkpoint_every_steps = 2
  config.eval_every_epochs = 2  # Every 6 steps: only the last step (4) is evaluated.
  with tfds.testing.mock_data(num_examples=48):
    final = train.train_and_evaluate(config, str(tmp_path / "mock"))
  assert final["step"] == 4 and final["count"] == 48.0
  assert {"top1_vit", "top1_agent", "top5_vit", "top5_agent"} <= set(final)
  records = _metrics(tmp_path / "mock")
  assert [r["step"] for r in records if "train/loss_vit" in r] == [1, 2, 3, 4]
  assert records[-1]["eval/count"] == 48.0
  assert [r["step"] for r in records if "eval/count" in r] == [4]


def test_eval_interval_counts_steps_or_epochs():
  import ml_collections

  from vitboot_jax import train

  config = ml_collections.ConfigDict({"eval_every_steps": -1, "eval_every_epochs": 1})
  assert train.eval_interval(config, steps_per_epoch=78) == 78
  config.eval_every_epochs = 2
  assert train.eval_interval(config, steps_per_epoch=78) == 156
  config.eval_every_steps = 100  # An explicit step interval wins.
  assert train.eval_interval(config, steps_per_epoch=78) == 100

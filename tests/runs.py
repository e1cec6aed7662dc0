"""Subprocess runs of `python -m vitboot_jax.main` on the tiny test config, for end-to-end tests,
and the faults those tests inject."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = str(REPO / "tests" / "tiny_config.py")


def env(devices: int) -> dict[str, str]:
  """The environment of a run on `devices` fake CPU devices, importing this checkout."""
  variables = dict(os.environ)
  variables["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  variables["JAX_PLATFORMS"] = "cpu"
  variables["PYTHONPATH"] = str(REPO) + os.pathsep + variables.get("PYTHONPATH", "")
  return variables


def command(workdir, folder, *overrides, config=TINY):
  return [
    sys.executable,
    "-m",
    "vitboot_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.data.dir={folder}",
    "--config.num_epochs=3",
    "--config.checkpoint_every_steps=4",
    "--config.log_every_steps=1",
    *overrides,
  ]


def run(workdir, folder, *overrides, devices=1, config=TINY, timeout=600):
  proc = subprocess.run(
    command(workdir, folder, *overrides, config=config),
    env=env(devices),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


class WatchedRun:
  """Runs the tiny config (or `config`) in a subprocess and sends `sig` once
  `trigger(line, workdir)` holds: on a line of its log, or (line None) on its workdir."""

  def __init__(self, workdir, folder, trigger, sig=signal.SIGKILL, overrides=(), config=TINY):
    self.workdir, self.trigger, self.sig = workdir, trigger, sig
    self.fired = None
    self.log: list[str] = []
    self.proc = subprocess.Popen(
      command(workdir, folder, *overrides, config=config),
      env=env(1),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    self._lock = threading.Lock()
    threading.Thread(target=self._read_log, daemon=True).start()
    threading.Thread(target=self._poll_directory, daemon=True).start()

  def _fire(self, why: str) -> None:
    with self._lock:
      if self.fired is None and self.proc.poll() is None:
        self.proc.send_signal(self.sig)
        self.fired = why

  def _read_log(self) -> None:
    for line in self.proc.stderr:
      self.log.append(line)
      if self.trigger(line, None):
        self._fire(self.trigger.__name__)

  def _poll_directory(self) -> None:
    while self.proc.poll() is None and self.fired is None:
      if self.trigger(None, self.workdir):
        self._fire(self.trigger.__name__)
      time.sleep(0.001)

  def wait(self, timeout=600) -> int:
    return self.proc.wait(timeout=timeout)


def after_step(k):
  """A WatchedRun trigger: once step k's training metrics are on disk."""

  def after_step(line, workdir):
    path = None if workdir is None else workdir / "metrics.jsonl"
    return path is not None and path.exists() and f'{{"step": {k}, "epoch"' in path.read_text()

  return after_step


def metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def train_losses(records):
  return {r["step"]: r["train/loss_vit"] for r in records if "train/loss_vit" in r}


def poison_ce_vit(monkeypatch, poisoned):
  """Makes train/ce_vit NaN at the steps where `poisoned(step)` (traced) holds, in every train
  step built from now on (one step a call or several)."""
  import jax.numpy as jnp

  from vitboot_jax.method import steps

  make_step = steps.make_train_step

  def make_poisoned(*args, **kwargs):
    step_fn = make_step(*args, **kwargs)

    def step(state, batch):
      new_state, out = step_fn(state, batch)
      poison = jnp.where(poisoned(new_state.step), jnp.nan, 1.0)
      return new_state, {**out, "train/ce_vit": out["train/ce_vit"] * poison}

    return step

  monkeypatch.setattr(steps, "make_train_step", make_poisoned)

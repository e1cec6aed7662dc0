"""The console of a run: compact lines, an ETA that counts evaluations, no library chatter."""

import logging
import subprocess
import sys

import pytest

from tests.runs import TINY
from tests.runs import env as _env
from vitboot_jax.base import library_logs
from vitboot_jax.run import progress


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _progress(clock, lines, **kwargs):
  args = dict(
    total_steps=100,
    steps_per_epoch=20,
    batch_size=10,
    start_step=0,
    eval_every=40,
    num_eval_examples=300,
    clock=clock,
    log=lambda fmt, *a: lines.append(fmt % a),
  )
  args.update(kwargs)
  return progress.Progress(**args)


def _trained_to_20(clock, lines, **kwargs):
  """Steps 1-10 (compilation) in 10 s, then steps 11-20 at 1 s/step."""
  p = _progress(clock, lines, **kwargs)
  clock.now = 10.0
  p.step(10, {})
  clock.now = 20.0
  p.step(20, {})
  return p


def test_the_first_line_times_steps_from_the_compiled_call():
  clock, lines = FakeClock(), []
  p = _progress(clock, lines)
  clock.now = 30.0  # The first call returns once compiled (30 s).
  p.compiled(0)
  clock.now = 40.0  # Steps 1-10 then run at 1 s/step.
  p.step(10, {})
  # 90 steps at 1 s, and 3 evaluations of 300 images at a fifth of a training image's cost.
  assert lines[-1] == f"step 10/100 ep 0.50  10 img/s  ETA {progress.duration(90 + 3 * 6)}"


def test_duration_and_evaluation_count():
  assert [progress.duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
  # Evaluations at 40, 80 and the last step 100.
  assert [progress.evaluations_after(s, 100, 40) for s in (0, 39, 40, 80, 99, 100)] == [
    3,
    3,
    2,
    1,
    1,
    0,
  ]
  assert progress.evaluations_after(0, 80, 40) == 2  # The last step is an evaluation step.


def test_eta_counts_remaining_evaluations_at_their_measured_cost():
  clock, lines = FakeClock(), []
  p = _progress(clock, lines)
  clock.now = 30.0  # Steps 1-10 hold compilation: 3 s/step, left out once others exist.
  p.step(10, {"train/loss_vit": 2.0})
  clock.now = 40.0  # 1 s/step from here on.
  p.step(20, {})
  # 80 steps at 1 s; 3 evaluations of 300 images at a fifth of 0.1 s per training image.
  assert p.eta(20) == pytest.approx(80 + 3 * 6)
  clock.now = 60.0
  p.step(40, {})
  with p.evaluating(40):
    clock.now = 100.0  # The evaluation takes 40 s.
  p.evaluated(40, {"eval/top1_vit": 0.25, "eval/top1_agent": 0.5, "eval/ce_vit": 2.0})
  assert p.eval_seconds == 40.0
  assert p.eta(40, evaluated=True) == pytest.approx(60 + 2 * 40)
  assert p.eta(40) == pytest.approx(60 + 3 * 40)  # A line at step 40 comes before its evaluation.
  assert (p.eta(100), p.eta(100, evaluated=True)) == (40.0, 0.0)  # The last step's evaluation.
  clock.now = 120.0  # 20 steps in 20 s of training, the evaluation's 40 s left out.
  p.step(60, {"train/loss_vit": 1.5, "train/loss_agent": 1.25, "train/grad_norm": 3.0})
  assert p.seconds_per_step() == pytest.approx(1.0)
  assert p.eta(60) == pytest.approx(40 + 2 * 40)
  line = lines[-1]
  assert line.startswith("step 60/100 ep 3.00  total loss agent 1.250 vit 1.500")
  assert "top-1 agent 50.0% vit 25.0%" in line and "  10 img/s" in line and "ETA 2m00s" in line
  assert "grad_norm" not in line and len(line) < 130
  # 300 images at a fifth of 0.1 s.
  assert "Evaluating at step 40 (about 6s plus compilation, the first time)." in lines
  assert "eval at step 40: top-1 agent 50.00% vit 25.00% (40s)" in lines


def test_the_eta_follows_the_rate_of_the_last_ten_minutes():
  clock, lines = FakeClock(), []
  p = _progress(clock, lines, total_steps=10_000, eval_every=10_000)
  clock.now = 10.0
  p.step(10, {})  # The first interval (compilation) is left out.
  for step in range(20, 1_010, 10):  # 1,000 steps at 1 s/step (a busy machine) ...
    clock.now += 10.0
    p.step(step, {})
  assert p.seconds_per_step() == pytest.approx(1.0)
  for step in range(1_010, 2_410, 10):  # ... then 1,400 at 0.5 s/step (700 s, freed).
    clock.now += 5.0
    p.step(step, {})
  # Only the last RATE_WINDOW_S (600 s) of intervals count: the freed machine's rate.
  assert p.seconds_per_step() == pytest.approx(0.5)
  # 7,600 steps at 0.5 s, and the last step's evaluation: 300 images at a fifth of 0.05 s.
  assert p.eta(2_400) == pytest.approx(7_600 * 0.5 + 3.0)


def test_a_line_during_a_long_evaluation():
  clock, lines = FakeClock(), []
  p = _trained_to_20(clock, lines)
  clock.now = 40.0
  p.step(40, {})

  def batches():
    for i in range(10):
      clock.now += 7.0  # 70 s in all: a line once 30 s have passed, then again.
      yield i

  with p.evaluating(40):
    assert list(p.eval_batches(batches(), num_batches=10)) == list(range(10))
  during = [line for line in lines if line.startswith("evaluating at step 40")]
  assert len(during) == 2
  # 4 of 10 batches in 35 s: 52.5 s left of it, then 60 steps and 2 evaluations estimated at 6 s.
  assert during[0] == "evaluating at step 40: batch 4/10  ETA 2m04s"


def test_a_later_evaluation_line_trusts_the_last_evaluation_time():
  clock, lines = FakeClock(), []
  p = _trained_to_20(clock, lines, eval_every=20, total_steps=40)

  def batches(seconds):
    for i in range(10):
      clock.now += seconds[i]
      yield i

  uneven = [1.0] * 8 + [40.0, 40.0]  # Fast first batches, then slow ones: 88 s in all.
  with p.evaluating(20):
    list(p.eval_batches(batches(uneven), num_batches=10))
  clock.now += 10.0
  p.step(30, {})
  clock.now += 10.0
  p.step(40, {})
  with p.evaluating(40):
    list(p.eval_batches(batches([4.0] * 8 + [40.0, 40.0]), num_batches=10))
  last = [line for line in lines if line.startswith("evaluating at step 40")][0]
  # 32 s in, 7 batches done: they alone would say 14 s left; the last evaluation took 88 s.
  assert last == "evaluating at step 40: batch 7/10  ETA 56s", last


def test_library_info_is_dropped_and_warnings_kept():
  libraries = library_logs._QuietLibraries()

  def record(path, level, message="message"):
    return logging.LogRecord("absl", level, path, 1, message, None, None)

  assert not libraries.filter(record("/site-packages/orbax/checkpoint/manager.py", logging.INFO))
  assert not libraries.filter(record("/site-packages/tensorflow_datasets/core/x.py", logging.INFO))
  assert libraries.filter(record("/site-packages/orbax/checkpoint/manager.py", logging.WARNING))
  assert not libraries.filter(record("/site-packages/jax/_src/xla_bridge.py", logging.INFO))
  assert libraries.filter(record("/vitboot_jax/train.py", logging.INFO))
  # orbax's warnings on a read-only checkpoint (what the tools ask for) go; its others stay.
  manager = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  note = "Given directory is read only=/tmp/run/checkpoints"
  assert not libraries.filter(record(manager, logging.WARNING, note))
  note = "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0."
  assert not libraries.filter(record(manager, logging.WARNING, note))
  assert libraries.filter(record(manager, logging.WARNING, "Checkpoint step 5 already exists."))


@pytest.mark.slow
def test_tensorflow_starts_quietly():
  code = (
    "from vitboot_jax.base import library_logs; library_logs.import_tensorflow(); print('imported')"
  )
  variables = _env(1)
  variables.pop("TF_CPP_MIN_LOG_LEVEL", None)
  proc = subprocess.run(
    [sys.executable, "-c", code], env=variables, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 0 and proc.stdout == "imported\n", proc.stderr
  assert "oneDNN" not in proc.stderr and "absl::InitializeLog" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_summary_prints_no_backend_probe():
  variables = _env(1)
  variables.pop("JAX_PLATFORMS")  # As a user runs it: JAX probes every backend, libtpu included.
  proc = subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.summary", f"--config={TINY}"],
    env=variables,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("{"), proc.stderr
  assert "libtpu" not in proc.stderr and "xla_bridge" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_console_of_a_run_is_compact(uninterrupted):
  """The tiny end-to-end run (30 steps, a line every step, 3 evaluations)."""
  console = (uninterrupted.parent / "uninterrupted.console.txt").read_text()
  lines = console.splitlines()
  step_lines = [line for line in lines if "] step " in line]
  assert len(step_lines) == 30
  assert all("img/s  ETA " in line and len(line) < 200 for line in step_lines)
  assert sum("] eval at step" in line for line in lines) == 3
  for chatter in ("train/grad_norm", "train/lr", "oneDNN", "orbax", "absl::InitializeLog"):
    assert chatter not in console, chatter
  assert len(lines) < 60, console


def test_the_first_evaluations_compilation_is_left_out_of_the_next_estimates():
  clock, lines = FakeClock(), []
  p = _trained_to_20(clock, lines, eval_every=20, total_steps=60)

  def consumed(batches, compile_seconds):
    """Runs the batches as evaluate.evaluate does: batch 0's call compiles, then 2 s each."""
    for i, _ in enumerate(batches):
      clock.now += compile_seconds if i == 0 else 2.0

  with p.evaluating(20):
    consumed(p.eval_batches(range(10), num_batches=10), compile_seconds=25.0)
  p.evaluated(20, {"eval/top1_vit": 0.5})
  assert lines[-1] == "eval at step 20: top-1 vit 50.00% (43s)"  # 25 s + 9 batches of 2 s.
  assert p.eval_seconds == pytest.approx(18.0)  # What the next evaluations cost.
  # 40 steps at 1 s and the evaluations at 40 and 60, without the compilation.
  assert p.eta(20, evaluated=True) == pytest.approx(40 + 2 * 18)
  clock.now += 10.0
  p.step(30, {})
  assert p.seconds_per_step() == pytest.approx(1.0)  # The evaluation is not training time.
  assert lines[-1].endswith("ETA 1m06s")  # 30 steps and 2 evaluations of 18 s.

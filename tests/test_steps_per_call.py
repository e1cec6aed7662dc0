"""config.steps_per_call: K optimiser steps in one jitted call are K single steps, and a run
with K > 1 evaluates, logs, checkpoints, stops and resumes on the same steps as K = 1."""

import json
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import runs
from tests.config_files import load_config
from tests.runs import TINY, metrics, run
from vitboot_jax import configlib, sharding, train
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.method import steps
from vitboot_jax.run import workdir_claim, workdir_rules


def test_call_lengths_end_on_every_boundary():
  # 30 steps, evaluations every 10, checkpoints every 4, 4 steps a call.
  step, ends = 0, []
  while step < 30:
    step += train.call_length(step, 4, 30, 10, 4)
    ends.append(step)
  assert ends == [4, 8, 9, 10, 11, 12, 16, 20, 24, 28, 29, 30]
  # Short of a boundary one step a call: two compiled calls, whatever the remainders.
  assert {b - a for a, b in zip([0, *ends], ends, strict=False)} == {4, 1}
  assert train.call_length(0, 1, 30, 10, 4) == 1
  assert train.call_length(5, 25, 30, 0, -1) == 25  # No intervals: only the end cuts.
  assert train.call_length(5, 100, 30, 0, -1) == 1
  assert train.call_length(27, 8, 30, 10) == 1


def test_multi_step_scans_host_batches_or_the_carried_state():
  def step_fn(state, x):
    x = state["n"] if x is None else x  # No batch given: derive it from the state.
    return {"n": state["n"] + 1, "sum": state["sum"] + x}, {"x": x, "n": state["n"]}

  state = {"n": jnp.int32(0), "sum": jnp.float32(0)}
  out, m = jax.jit(steps.make_multi_step(step_fn, 3))(state, jnp.array([1.0, 2.0, 4.0]))
  assert int(out["n"]) == 3 and float(out["sum"]) == 7.0
  np.testing.assert_array_equal(m["x"], [1.0, 2.0, 4.0])
  np.testing.assert_array_equal(m["n"], [0, 1, 2])
  out, m = jax.jit(steps.make_multi_step(step_fn, 4))(state)
  assert int(out["n"]) == 4 and float(out["sum"]) == 0 + 1 + 2 + 3
  with pytest.raises(ValueError, match="num_steps=0"):
    steps.make_multi_step(step_fn, 0)


@pytest.mark.parametrize("value", [-2, True])
def test_steps_per_call_must_be_a_non_negative_integer(value):
  config = load_config("tiny_config")
  config.steps_per_call = value
  with pytest.raises(ConfigError, match="config.steps_per_call"):
    configlib.validate(config)


def test_zero_steps_per_call_is_several_on_accelerators_and_one_on_cpus():
  config = load_config("tiny_config")
  assert config.steps_per_call == 0  # The default: chosen by the platform.
  configlib.validate(config)
  k = configlib.ACCELERATOR_STEPS_PER_CALL
  assert k > 1
  assert [configlib.steps_per_call(config, p) for p in ("cpu", "gpu", "tpu")] == [1, k, k]
  config.steps_per_call = 3  # Given: kept everywhere.
  assert [configlib.steps_per_call(config, p) for p in ("cpu", "gpu", "tpu")] == [3, 3, 3]
  del config["steps_per_call"]  # A config.json written before the field.
  assert configlib.steps_per_call(config, "gpu") == 1


def _single_and_multi(config, num_steps=4):
  """`num_steps` single steps and one call of `num_steps` from the same fresh state, on the same
  batches sharded over every device: (single state, its metrics, multi state, its metrics)."""
  mesh = sharding.make_mesh()
  trainer = trainer_lib.build(config, mesh, steps_per_epoch=num_steps)
  rng = np.random.default_rng(0)
  local = [
    {
      "image": rng.normal(size=(16, 32, 32, 3)).astype(np.float32),
      "label": rng.integers(0, 10, 16).astype(np.int32),
    }
    for _ in range(num_steps)
  ]
  single, single_metrics = trainer.fresh_state(), []
  for batch in local:
    single, m = trainer.train_step(single, sharding.global_batch(batch, mesh))
    single_metrics.append(jax.device_get(m))
  batches = sharding.global_batches(local, mesh)
  assert batches["image"].shape == (num_steps, 16, 32, 32, 3)
  assert batches["image"].sharding.spec == jax.sharding.PartitionSpec(None, sharding.DATA_AXIS)
  multi, multi_metrics = trainer.multi_step(num_steps)(trainer.fresh_state(), batches)
  assert trainer.multi_step(num_steps) is trainer.multi_step(num_steps)  # Compiled once a length.
  assert int(multi.step) == int(single.step) == num_steps
  multi_metrics = jax.device_get(multi_metrics)
  assert set(multi_metrics) == set(single_metrics[0])
  # The losses moved: the comparison is not of copies of the initial state.
  assert not np.allclose(multi_metrics["train/loss_vit"][0], multi_metrics["train/loss_vit"][-1])
  return single, single_metrics, multi, multi_metrics


@pytest.mark.slow
def test_k_steps_in_one_call_are_k_single_steps():
  """Shared mode with dropout, batches sharded over 8 devices: same metrics and parameters.

  SGD keeps float32 rounding from being amplified (Adam divides near-zero gradient entries by
  their own size): the scan's body is compiled with other fusions than the single step, so
  values agree to float32 rounding (measured: parameters 1e-7 apart after 4 steps), not bits.
  """
  config = load_config("tiny_config", "mode=shared")
  config.model.dropout = 0.1
  config.optim.update(name="sgd", lr=0.05, weight_decay=5e-4, momentum=0.0)
  single, single_metrics, multi, multi_metrics = _single_and_multi(config)
  for key, stacked in multi_metrics.items():
    if key == "train/align_conflict_fraction":  # Counts signs of near-zero products.
      continue
    want = np.array([m[key] for m in single_metrics])
    np.testing.assert_allclose(stacked, want, rtol=1e-4, atol=1e-6, err_msg=key)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), multi.params, single.params
  )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vit", "shared"])
def test_k_steps_in_one_call_are_k_single_steps_under_adamw(mode):
  """The recipes' optimizer as users train: AdamW (lr 1e-3, decay 0.05 on every leaf), the ViT
  alone clipped at global norm 0.1 (tests/tiny_config.py mirrors configs/), dropout on.

  Adam amplifies float32 rounding where a gradient entry is near zero: its first update is
  lr * g / (|g| + eps), so an entry whose gradient differs by rounding between the scan's fusions
  and the single step's moves by up to ~lr. Measured after 4 steps: vit bit-identical, shared
  0.2% of the entries more than lr/1000 apart (max 0.57 lr). Bugs move nearly every entry by
  lr/1000 or more: the clipping left out 96% of them, two batches swapped 99%. Hence the test
  allows 1% of the entries beyond lr/1000; the losses and gradient norms, smooth in every entry,
  to 1e-4.
  """
  config = load_config("tiny_config", f"mode={mode}")
  config.model.dropout = 0.1
  assert config.optim.name == "adamw" and config.optim.clip_norm == (0.1 if mode == "vit" else 0)
  single, single_metrics, multi, multi_metrics = _single_and_multi(config)
  for key in ("train/loss_vit", "train/grad_norm", "train/lr"):
    want = np.array([m[key] for m in single_metrics])
    np.testing.assert_allclose(multi_metrics[key], want, rtol=1e-4, err_msg=key)
  lr = config.optim.lr
  apart = np.concatenate(
    [np.abs(a - b).ravel() for a, b in zip(*map(jax.tree.leaves, (multi.params, single.params)))]
  )
  assert np.mean(apart > lr / 1000) <= 0.01, (np.mean(apart > lr / 1000), apart.max() / lr)


# ViT alone: XLA:CPU runs the scanned shared step tens of times slower than the single step on
# one device (docs/performance.md), the loop logic is the same for every mode.
VIT = f"{TINY}:mode=vit"
K4 = ("--config.steps_per_call=4",)


@pytest.fixture(scope="module")
def vit_runs(image_folder, tmp_path_factory):
  """The tiny ViT trained start to end with 1 (config.steps_per_call=0, the CPU's choice) and
  with 4 steps a call; each run's log beside its workdir (k1.log, k4.log)."""
  root = tmp_path_factory.mktemp("steps_per_call")
  for name, overrides in (("k1", ()), ("k4", K4)):
    proc = run(root / name, image_folder, *overrides, config=VIT)
    (root / f"{name}.log").write_text(proc.stderr)
  return root / "k1", root / "k4"


def _checkpoints(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _train_records(workdir):
  return {r["step"]: r for r in metrics(workdir) if "train/loss_vit" in r}


@pytest.mark.slow
def test_four_steps_a_call_leave_the_run_of_one(vit_runs):
  """Same metrics steps, evaluations, checkpoints and final.json as one step a call; values to
  float32 rounding, which Adam amplifies on near-zero gradient entries over 30 steps."""
  k1, k4 = vit_runs
  assert [r["step"] for r in metrics(k4)] == [r["step"] for r in metrics(k1)]
  assert [r["step"] for r in metrics(k4) if "eval/top1_vit" in r] == [10, 20, 30]
  assert _checkpoints(k4) == _checkpoints(k1)
  want, got = _train_records(k1), _train_records(k4)
  assert sorted(got) == list(range(1, 31))
  for step, record in got.items():
    assert set(record) == set(want[step])
    for key in ("train/loss_vit", "train/grad_norm", "train/lr"):
      assert record[key] == pytest.approx(want[step][key], rel=1e-3), (step, key)
  final_k1, final_k4 = (json.loads((w / "final.json").read_text()) for w in (k1, k4))
  assert final_k4["step"] == final_k1["step"] == 30
  assert final_k4["count"] == final_k1["count"]
  assert final_k4["ce_vit"] == pytest.approx(final_k1["ce_vit"], rel=1e-3)


@pytest.mark.slow
def test_the_resolved_steps_per_call_is_logged_and_recorded(vit_runs):
  """config.steps_per_call=0 is recorded as what the run did (1 on CPUs), in its first log line
  and its config.json; a resumed run compares configs without it (workdir_rules.VOLATILE_FIELDS)."""
  for workdir, k in zip(vit_runs, (1, 4), strict=True):
    assert json.loads((workdir / "config.json").read_text())["steps_per_call"] == k
    log = workdir.with_name(f"{workdir.name}.log").read_text()
    assert f"up to {k} a call) on 1 devices" in log, log[-3000:]


@pytest.mark.slow
def test_sigterm_saves_within_one_call_and_resumes(vit_runs, image_folder, tmp_path):
  """The stop lands on the end of a call and the resumed run repeats the uninterrupted one."""
  _, k4 = vit_runs
  workdir = tmp_path / "k4_terminated"
  watched = runs.WatchedRun(
    workdir, image_folder, runs.after_step(13), sig=signal.SIGTERM, overrides=K4, config=VIT
  )
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  stopped = [line for line in watched.log if "Stopped by SIGTERM after step" in line]
  assert len(stopped) == 1, "".join(watched.log)[-3000:]
  step = int(stopped[0].split("after step ")[1].split(":")[0])
  # Calls end at 16, 20, 24, 28 after step 13's: the signal's call, or the next if it came late.
  assert step in (16, 20, 24, 28)
  assert (workdir / "checkpoints" / str(step) / workdir_rules.COMMIT_MARKER).exists()
  proc = run(workdir, image_folder, *K4, config=VIT)
  assert f"Resuming from the checkpoint of step {step}" in proc.stderr
  want, got = _train_records(k4), _train_records(workdir)
  assert sorted(got) == list(range(1, 31))
  for s, record in got.items():
    assert record["train/loss_vit"] == pytest.approx(want[s]["train/loss_vit"], rel=1e-5), s
  final, want_final = (json.loads((w / "final.json").read_text()) for w in (workdir, k4))
  for key in ("step", "top1_vit", "ce_vit", "count"):
    assert final[key] == pytest.approx(want_final[key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
def test_non_finite_step_inside_a_call_is_named(image_folder, tmp_path, monkeypatch):
  """A NaN at step 6 of the call of steps 5-8: step 6 is named, checkpoint 4 stays the newest."""
  runs.poison_ce_vit(monkeypatch, lambda step: step >= 6)
  config = load_config("tiny_config", "mode=vit")
  config.data.dir = str(image_folder)
  config.num_epochs = 1
  config.steps_per_call = 4
  workdir = tmp_path / "nan"
  with pytest.raises(train.NonFiniteError, match="Non-finite ce_vit at step 6;"):
    train.train_and_evaluate(config, str(workdir))
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4"]
  # The process lives on (a notebook): the run let go of its workdir, heartbeat and all.
  assert workdir_claim.held(workdir) is None and not (workdir / workdir_claim.CLAIM_FILE).exists()


def test_a_run_resumes_under_another_steps_per_call_and_from_older_config_files():
  config = load_config("tiny_config")
  saved = json.loads(config.to_json_best_effort())
  config.steps_per_call = 8
  assert workdir_rules.changed_fields(saved, config) == []
  del saved["steps_per_call"]  # config.json of a run from before the field existed.
  assert workdir_rules.changed_fields(saved, config) == []
  config.optim.lr = 0.5
  assert workdir_rules.changed_fields(saved, config) == ["optim.lr: 0.001 -> 0.5"]


@pytest.mark.slow
def test_four_steps_a_call_on_the_device_pipeline_leave_the_run_of_one(image_folder, tmp_path):
  """With the dataset on the devices a call of K steps makes each batch from the carried step:
  the same batches, losses and evaluations as one step a call."""
  device = ("--config.data.pipeline=device", "--config.total_steps=12")
  run(tmp_path / "k1", image_folder, *device, config=VIT)
  run(tmp_path / "k4", image_folder, *device, *K4, config=VIT)
  k1, k4 = tmp_path / "k1", tmp_path / "k4"
  assert [r["step"] for r in metrics(k4)] == [r["step"] for r in metrics(k1)]
  want, got = _train_records(k1), _train_records(k4)
  assert sorted(got) == list(range(1, 13))
  for step, record in got.items():
    for key in ("train/loss_vit", "train/grad_norm"):
      assert record[key] == pytest.approx(want[step][key], rel=1e-3), (step, key)
  finals = [json.loads((w / "final.json").read_text()) for w in (k1, k4)]
  assert finals[1]["ce_vit"] == pytest.approx(finals[0]["ce_vit"], rel=1e-3)

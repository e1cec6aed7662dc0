"""evaluate.evaluate: exact per-example means, and the device kept busy while the host fetches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import hlo
from tests.config_files import load_config
from vitboot_jax import evaluate, sharding
from vitboot_jax.tools.perf import benchmark


def _step(params, batch_stats, batch):
  del params, batch_stats
  mask = batch["mask"]
  correct = (batch["pred"] == batch["label"]).astype(jnp.float32)
  return {
    "count": jnp.sum(mask),
    "vit": {"top1": jnp.sum(mask * correct), "top5": jnp.sum(mask), "ce": jnp.sum(mask * 0.5)},
  }


def _batches(num, size, rng):
  for _ in range(num):
    yield {
      "pred": jnp.asarray(rng.integers(0, 3, size)),
      "label": jnp.asarray(rng.integers(0, 3, size)),
      "mask": jnp.asarray((rng.random(size) < 0.8).astype(np.float32)),
    }


def test_means_are_exact_over_real_examples():
  batches = list(_batches(7, 16, np.random.default_rng(0)))
  out = evaluate.evaluate(_step, None, None, iter(batches))
  mask = np.concatenate([np.asarray(b["mask"]) for b in batches])
  correct = np.concatenate([np.asarray(b["pred"] == b["label"]) for b in batches])
  assert out["eval/count"] == mask.sum()
  assert out["eval/top1_vit"] == pytest.approx((mask * correct).sum() / mask.sum(), abs=1e-12)
  assert out["eval/top5_vit"] == 1.0 and out["eval/ce_vit"] == pytest.approx(0.5)


def test_sums_are_fetched_behind_the_dispatch_and_the_run_ahead_is_bounded(monkeypatch):
  """A fetch per batch would make the host wait for the device before preparing the next batch
  (on a GPU, the input pipeline and the forward passes would never overlap)."""
  yielded, fetched_at = [0], []
  device_get = jax.device_get

  def counting_batches():
    for batch in _batches(6, 8, np.random.default_rng(1)):
      yielded[0] += 1
      yield batch

  def recording_get(tree):
    fetched_at.append(yielded[0])
    return device_get(tree)

  monkeypatch.setattr(evaluate.jax, "device_get", recording_get)
  evaluate.evaluate(_step, None, None, counting_batches(), in_flight=2)
  assert len(fetched_at) == 6
  assert fetched_at[0] == 3
  outstanding = [at - k for k, at in enumerate(fetched_at)]
  assert max(outstanding) <= 3


def test_an_empty_split_is_refused():
  with pytest.raises(ValueError, match="evaluation split is empty"):
    evaluate.evaluate(_step, None, None, iter([]))


def test_label_rank_orders_as_top_k_ties_included():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.integers(0, 4, (256, 10)).astype(np.float32))  # Many ties.
  labels = jnp.asarray(rng.integers(0, 10, 256))
  rank = evaluate.label_rank(logits, labels)
  top5 = jax.lax.top_k(logits, 5)[1]
  np.testing.assert_array_equal(rank == 0, top5[:, 0] == labels)
  np.testing.assert_array_equal(rank < 5, jnp.any(top5 == labels[:, None], axis=-1))
  bad = logits.at[0, 3].set(jnp.nan).at[1, 0].set(jnp.inf)
  assert not jnp.any(evaluate.label_rank(bad, labels)[:2] < 5)


@pytest.mark.slow
def test_sharded_eval_step_gathers_nothing():
  """Every model's sums need only an all-reduce over the batch shards."""
  if jax.device_count() < 2:
    pytest.skip("one device: an evaluation has nothing to communicate")
  config = load_config("tiny_config")
  step = benchmark.compile_mode_step(config, "shared", sharding.make_mesh(), batch=16)
  compiled, _ = benchmark.eval_forward(step)
  ops = hlo.opcodes(compiled)
  assert not ops & hlo.GATHERS_AND_EXCHANGES
  assert "all-reduce" in ops


class _FixedLogits:
  """A stand-in ModelSet whose models return fixed logits, whatever the images."""

  def __init__(self, logits):
    self.logits = logits

  def apply(self, variables, images, train):
    del variables, images, train
    return {name: (logits, {}) for name, logits in self.logits.items()}, {}


@pytest.mark.parametrize("keep", [0.7, 0.0])
def test_eval_step_sums_the_masked_cross_entropy_of_every_model(keep):
  rng = np.random.default_rng(3)
  logits = {m: rng.normal(0, 3, (32, 10)).astype(np.float32) for m in ("vit", "agent")}
  labels = rng.integers(0, 10, 32)
  mask = (rng.random(32) < keep).astype(np.float32)
  step = evaluate.make_eval_step(_FixedLogits({m: jnp.asarray(v) for m, v in logits.items()}))
  batch = {"image": jnp.zeros((32, 1)), "label": jnp.asarray(labels), "mask": jnp.asarray(mask)}
  sums = step(None, None, batch)
  assert float(sums["count"]) == mask.sum()
  for name, x in logits.items():
    x = x.astype(np.float64)
    log_probs = x - x.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll = -log_probs[np.arange(32), labels]
    assert float(sums[name]["ce"]) == pytest.approx((mask * nll).sum(), rel=1e-5, abs=1e-6)
    top1 = (x.argmax(-1) == labels) * mask
    assert float(sums[name]["top1"]) == top1.sum()

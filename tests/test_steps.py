"""The training step: official loss terms and gradients, Align, private leaves, modes, sharding."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import golden, hlo, tolerances, without_tensorflow
from tests.config_files import load_config
from tests.tiny_steps import batch_of, gradients, jitted_gradients, setup
from vitboot_jax import kernel_sets, sharding
from vitboot_jax.method import steps
from vitboot_jax.models import convert, sharing
from vitboot_jax.models.build import build_models
from vitboot_jax.tools.perf import benchmark

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


# ---------------------------------------------------------------- fidelity to the official code


@pytest.mark.parametrize(
  "name, kernels",
  [
    ("shared_res_h9", "xla"),
    ("shared_vitstem_h9", "xla"),
    ("shared_res_h6", "xla"),
    ("shared_res_h9", "cpu"),
    ("shared_res_h6", "cpu"),
  ],
)
@pytest.mark.slow
def test_official_loss_terms_and_gradients(golden_dir, name, kernels):
  data, sd, images, index = golden.load(golden_dir, name)
  config = golden.shared_config(index)
  config.align = "none"
  config.kernels = kernels
  models = build_models(config, kernel_sets.for_config(config))
  variables = convert.import_shared(sd, config.model.depth, config.model.num_heads)
  batch = {"image": jnp.asarray(images), "label": jnp.asarray(data["labels"], jnp.int32)}
  grads, _, terms = jitted_gradients(
    config, models, variables, batch, jax.random.key(0), jnp.float32(1.0)
  )
  expected = {
    "ce_vit": "joint.cls_vit",
    "ce_agent": "joint.cls_cnn",
    "kd_vit": "joint.kd_vit.cnn",
    "kd_agent": "joint.kd_cnn.vit",
  }
  expected.update({f"feature_{i}": f"joint.hint_vit.cnn_layer_{i}" for i in range(3)})
  for ours, theirs in expected.items():
    assert golden.rel_err(terms[ours], data[f"loss/{theirs}"]) < 1e-4, ours
  total = terms["loss_vit"] + terms["loss_agent"]
  assert golden.rel_err(total, data["loss/total_weighted"]) < 1e-4

  # align="none": the update direction is g_V + g_A, the gradient of the official weighted sum.
  grad_sd = {k[len("grad/") :]: v for k, v in data.items() if k.startswith("grad/")}
  want = convert.import_shared(grad_sd, config.model.depth, config.model.num_heads, stats=False)
  got = jax.tree.map(jnp.add, grads["vit"], grads["agent"])
  flat_want = dict(jax.tree_util.tree_leaves_with_path(want["params"]))
  flat_got = dict(jax.tree_util.tree_leaves_with_path(got))
  assert flat_want.keys() == flat_got.keys()
  # The stem's last bias has an analytically zero gradient (train-mode BatchNorm and the
  # residual stream carry a per-channel shift to the head BatchNorm, which removes it); both sides
  # hold float noise ~1e-8 there, so such tensors must be ~0 on our side too.
  zero = 1e-6 * max(float(np.abs(v).max()) for v in flat_want.values())
  for path, value in flat_want.items():
    got_leaf = np.asarray(flat_got[path])
    if np.abs(value).max() < zero:
      assert np.abs(got_leaf).max() < zero, jax.tree_util.keystr(path)
    else:
      assert golden.rel_err(got_leaf, value) < 1e-3, jax.tree_util.keystr(path)


# ---------------------------------------------------------------- Algorithm 1


def _np_pcgrad(g_a, g_v):
  dot = float(np.dot(g_a, g_v))
  return g_a - dot / float(np.dot(g_v, g_v)) * g_v if dot < 0 else g_a


def _flat(tree, mask):
  """Concatenated masked entries of every leaf (the shared vector), numpy float64."""
  parts = jax.tree.map(
    lambda x, m: np.asarray(x, np.float64)[np.broadcast_to(np.asarray(m), x.shape) > 0], tree, mask
  )
  return np.concatenate([p.ravel() for p in jax.tree.leaves(parts)])


@pytest.mark.slow
def test_shared_update_is_algorithm_1():
  # A large Adam epsilon keeps the first AdamW step smooth in g (with eps=1e-8 it is
  # ~lr * sign(g), which turns float noise in near-zero gradients into full-size steps).
  config, models, tx, state, step = setup("shared", **{"optim.eps": 1e-3})
  batch = batch_of()
  grads, _, _ = gradients(config, models, state, batch, weight=1.0)
  mask = sharing.shared_mask(state.params)
  g_v, g_a = _flat(grads["vit"], mask), _flat(grads["agent"], mask)
  expected_shared = (g_v + _np_pcgrad(g_a, g_v)) / 2

  # Private leaves see only their own model's gradient: the agent's loss gives exactly zero to
  # the ViT's Q/K, b_V, norms, embeddings and head; the ViT's loss gives zero to agent leaves.
  inv = jax.tree.map(lambda m: 1.0 - m, mask)
  private_a_on_vit = _flat(grads["agent"]["vit"], inv["vit"])
  assert np.abs(private_a_on_vit).max() == 0.0
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(grads["vit"]["agent"])) == 0.0
  assert np.abs(_flat(grads["vit"]["vit"], inv["vit"])).max() > 0

  # The step's update equals AdamW applied to the hand-combined gradient.
  combined = jax.tree.map(lambda v, a: v + a, grads["vit"], grads["agent"])  # private entries
  flat_mask_leaves = jax.tree.leaves(mask)
  offset = 0
  leaves, treedef = jax.tree.flatten(combined)
  new_leaves = []
  for leaf, m in zip(leaves, flat_mask_leaves):
    full_m = np.broadcast_to(np.asarray(m), leaf.shape) > 0
    leaf = np.array(leaf, np.float64)
    n = int(full_m.sum())
    leaf[full_m] = expected_shared[offset : offset + n]
    offset += n
    new_leaves.append(jnp.asarray(leaf, jnp.float32))
  hand = jax.tree.unflatten(treedef, new_leaves)
  updates, _ = tx.update(hand, state.opt_state, state.params)
  want = optax.apply_updates(state.params, updates)

  state_copy = jax.tree.map(jnp.copy, state)
  new_state, metrics = jax.jit(step)(state_copy, batch)
  tolerances.assert_trees_close_to_scale(new_state.params, want, 1e-5, "params", floor=1e-7)
  cos = float(np.dot(g_a, g_v) / np.linalg.norm(g_a) / np.linalg.norm(g_v))
  assert abs(float(metrics["train/align_cosine"]) - cos) < 1e-4
  assert float(metrics["train/align_conflict"]) == float(cos < 0)


@pytest.mark.slow
def test_align_changes_the_update_only_when_gradients_conflict():
  config, models, tx, state, step = setup("shared")
  config_none, _, _, _, step_none = setup("shared", align="none")
  batch = batch_of()
  new_pc, m_pc = jax.jit(step)(jax.tree.map(jnp.copy, state), batch)
  new_none, _ = jax.jit(step_none)(jax.tree.map(jnp.copy, state), batch)
  # Private ViT leaves (cls) get the same gradient either way; the two updates differ on
  # shared leaves because pcgrad halves the combined shared direction (and projects it).
  np.testing.assert_allclose(new_pc.params["vit"]["cls"], new_none.params["vit"]["cls"], rtol=1e-6)
  assert not np.allclose(
    new_pc.params["vit"]["block_0"]["mlp"]["fc1"]["kernel"],
    new_none.params["vit"]["block_0"]["mlp"]["fc1"]["kernel"],
  )
  assert 0.0 <= float(m_pc["train/align_conflict_fraction"]) <= 1.0


@pytest.mark.slow
def test_align_none_is_the_gradient_of_the_summed_loss():
  config, models, _, state, _ = setup("shared", align="none")
  batch = batch_of()
  grads, _, _ = gradients(config, models, state, batch, weight=0.7)

  def summed_loss(params):  # Independent path: one forward of both models, summed losses.
    outputs, _ = models.apply(
      {"params": params, "batch_stats": state.batch_stats},
      batch["image"],
      train=True,
      rng=jax.random.key(3),
    )
    lv, _ = steps.model_loss(config, "vit", outputs, batch["label"], jnp.float32(0.7))
    la, _ = steps.model_loss(config, "agent", outputs, batch["label"], jnp.float32(0.7))
    return lv + la

  want = jax.jit(jax.grad(summed_loss))(state.params)
  got = jax.tree.map(jnp.add, grads["vit"], grads["agent"])
  tolerances.assert_trees_close_to_scale(got, want, 1e-4, "gradient", floor=1e-6)


@pytest.mark.slow
def test_joint_models_never_read_each_other():
  config, models, _, state, step = setup("joint")
  grads, _, terms = gradients(config, models, state, batch_of())
  assert "kd_vit" in terms and "feature" in terms and "kd_agent" in terms
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(grads["vit"]["agent"])) == 0.0
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(grads["agent"]["vit"])) == 0.0
  new_state, metrics = jax.jit(step)(state, batch_of())
  assert np.isfinite(float(metrics["train/loss_vit"]))


@pytest.mark.parametrize("mode", ["vit", "agent"])
@pytest.mark.parametrize("kernels", ["xla", "cpu"])
@pytest.mark.slow
def test_single_model_modes(mode, kernels):
  _, models, _, state, step = setup(mode, kernels=kernels)
  assert models.kernels.name == kernels
  new_state, metrics = jax.jit(step)(state, batch_of())
  assert set(new_state.params) == {mode}
  assert f"train/ce_{mode}" in metrics and "train/kd_vit" not in metrics
  assert int(new_state.step) == 1


@pytest.mark.slow
def test_step_compiles_once_and_trains():
  config, models, tx, state, step = setup("shared")
  traced = chex.assert_max_traces(step, n=1)
  jitted = jax.jit(traced, donate_argnums=0)
  batch = batch_of(16)
  first = None
  for _ in range(8):
    state, metrics = jitted(state, batch)
    first = first if first is not None else float(metrics["train/loss_vit"])
  assert float(metrics["train/loss_vit"]) < first  # Fits a fixed batch.
  assert int(state.step) == 8
  # Per-epoch decay: steps 0-3 weight 1, steps 4-7 weight 1 - 1/2.
  assert float(metrics["train/feature_weight"]) == 0.5


@pytest.mark.slow
def test_no_decay_keeps_the_feature_weight_past_the_first_epoch():
  """Table 4's "No Decay": loss.feature_decay="none" weighs the feature term 1 at every step."""
  _, _, _, state, step = setup("joint", **{"loss.feature_decay": "none"})
  jitted = jax.jit(step)
  for _ in range(6):  # Into the second of 2 epochs of 4 steps (decayed: weight 0.5).
    state, metrics = jitted(state, batch_of())
  assert int(state.step) == 6 and float(metrics["train/feature_weight"]) == 1.0


@pytest.mark.parametrize("kernels", ["xla", "cpu"])
@pytest.mark.slow
def test_sharded_batch_matches_single_device(kernels):
  """Dropout on in both models: each kernel set draws the same masks on 1 and on 8 devices."""
  assert jax.device_count() == 8
  config, models, tx, state, step = setup(
    "shared", kernels=kernels, **{"model.dropout": 0.1, "agent.mlp_dropout": 0.1}
  )
  assert models.kernels.name == kernels
  batch = batch_of(16)
  _, single = jax.jit(step)(jax.tree.map(jnp.copy, state), batch)
  mesh = sharding.make_mesh()
  replicated = sharding.replicated(mesh)
  sharded_batch = sharding.global_batch(jax.device_get(batch), mesh)
  assert len(sharded_batch["image"].addressable_shards) == 8
  sharded_state = jax.device_put(state, replicated)
  new_state, multi = jax.jit(step, out_shardings=(replicated, replicated))(
    sharded_state, sharded_batch
  )
  for key in ("train/loss_vit", "train/loss_agent", "train/feature", "train/grad_norm"):
    np.testing.assert_allclose(multi[key], single[key], rtol=1e-5, err_msg=key)
  # BatchNorm statistics are global-batch statistics, not per-device ones.
  _, single_stats, _ = gradients(config, models, state, batch)
  got = new_state.batch_stats["agent"]["stem"]["bn"]["mean"]
  want = single_stats["agent"]["stem"]["bn"]["mean"]
  tolerances.assert_close_to_scale(got, want, 1e-4, "BatchNorm mean")
  _, per_device_stats, _ = gradients(config, models, state, jax.tree.map(lambda x: x[:2], batch))
  assert not np.allclose(per_device_stats["agent"]["stem"]["bn"]["mean"], want, rtol=1e-2)


def _step_mismatches(config, metrics_a, metrics_b, params_a, params_b, num_shared):
  """Keys on which two runs of one shared step disagree beyond float32 rounding (tests/tolerances):
  loss terms and gradient norms relative to their value, the Align cosine and the distillation
  KL absolutely (near zero, only their summands' scale bounds the rounding), parameters relative
  to each leaf's scale. Sign counts of near-zero cosines are left out: rounding flips them."""
  bad = []
  for key in metrics_a:
    if "conflict" in key:
      continue
    if key not in metrics_b:
      bad.append(key)
      continue
    a, b = float(metrics_a[key]), float(metrics_b[key])
    if key == "train/align_cosine":
      ok = abs(a - b) <= tolerances.cosine_atol(num_shared)
    elif key.startswith("train/kd_"):
      ok = abs(a - b) <= tolerances.kl_atol(config.loss.temperature, config.data.num_classes)
    else:
      ok = abs(a - b) <= tolerances.STEP_RTOL * abs(a)
    if not ok:
      bad.append(key)
  for path, a in jax.tree_util.tree_flatten_with_path(params_a)[0]:
    b = params_b
    for k in path:
      b = b[k.key]
    try:
      tolerances.assert_close_to_scale(b, a, tolerances.STEP_RTOL)
    except AssertionError:
      bad.append(jax.tree_util.keystr(path))
  return bad


@pytest.mark.parametrize("kernels", ["xla", "cpu"])
@pytest.mark.slow
def test_optimised_build_computes_the_same_step(kernels):
  """The suite compiles with XLA's backend optimisations off (conftest), users with XLA's
  defaults: both builds of one lowered shared step agree to float32 rounding, so what the tests
  show holds for users; the same comparison tells apart a step whose feature term was dropped."""
  from jax._src.lib import xla_client

  if not jax.config.read("jax_disable_most_optimizations"):
    pytest.skip("the suite runs optimised (JAX_DISABLE_MOST_OPTIMIZATIONS=0): one build to test")
  defaults = xla_client.CompileOptions().executable_build_options.debug_options
  users = {
    "xla_backend_optimization_level": defaults.xla_backend_optimization_level,
    "xla_llvm_disable_expensive_passes": defaults.xla_llvm_disable_expensive_passes,
  }
  assert users["xla_backend_optimization_level"] > 0  # Otherwise both builds are the same.
  # Adam's large epsilon: see test_shared_update_is_algorithm_1.
  updates = {"model.dropout": 0.1, "optim.eps": 1e-3}
  config, _, _, state, step = setup("shared", kernels=kernels, **updates)
  assert config.loss.feature_vit > 0
  # Upper bound on the Align vectors' length: every ViT parameter.
  num_shared = sum(x.size for x in jax.tree.leaves(state.params["vit"]))
  batch = batch_of()
  lowered = jax.jit(step).lower(state, batch)
  tests_build, users_build = lowered.compile(), lowered.compile(users)
  state_a, metrics_a = tests_build(jax.tree.map(jnp.copy, state), batch)
  state_b, metrics_b = users_build(jax.tree.map(jnp.copy, state), batch)
  same = _step_mismatches(config, metrics_a, metrics_b, state_a.params, state_b.params, num_shared)
  assert same == []
  # A realistic bug, the feature term dropped: the same tolerances see it in the cosine, the
  # ViT's gradient norm and its parameters.
  *_, dropped = setup("shared", kernels=kernels, **updates, **{"loss.feature_vit": 0.0})
  state_c, metrics_c = jax.jit(dropped)(jax.tree.map(jnp.copy, state), batch)
  bad = _step_mismatches(config, metrics_a, metrics_c, state_a.params, state_c.params, num_shared)
  assert {"train/align_cosine", "train/grad_norm_vit"} <= set(bad), bad
  assert any(k.startswith("['vit']") for k in bad), bad


@pytest.mark.parametrize(
  "mode, kernels",
  [
    pytest.param(
      mode, kernels, marks=() if (mode, kernels) == ("agent", "cpu") else pytest.mark.slow
    )
    for mode in benchmark.ALL_MODES
    for kernels in ("cpu", "xla")
  ],
)
def test_data_parallel_step_communicates_only_by_all_reduce(mode, kernels):
  """Sharded over the batch, a step needs one kind of collective: all-reduces of gradients and
  BatchNorm statistics. Halo exchanges or gathers would mean an op split the batch badly."""
  if jax.device_count() < 2:
    pytest.skip("one device: a step has nothing to communicate")
  config = load_config("tiny_config", f"mode={mode.removesuffix('_noalign')}")
  config.kernels = kernels
  step = benchmark.compile_mode_step(config, mode, sharding.make_mesh(), batch=16)
  found = hlo.opcodes(step.compiled)
  collectives = found & hlo.GATHERS_AND_EXCHANGES
  assert not collectives, f"{mode} ({kernels} kernels): {sorted(collectives)}"
  assert "all-reduce" in found


def test_steps_and_benchmark_need_no_tensorflow():
  """TensorFlow is only the input pipeline: an accelerator host without it still builds, jits
  and benchmarks every step (launch/accelerator_check.sh)."""
  proc = without_tensorflow.run(
    "import vitboot_jax.trainer, vitboot_jax.method.steps, vitboot_jax.tools.perf.benchmark\n"
    "import vitboot_jax.tools.perf.lowering\n"
    "assert 'tensorflow' not in sys.modules\n"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]

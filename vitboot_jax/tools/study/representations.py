r"""What a run's ViT holds in each layer at its checkpoints: how diverse its tokens are.

  python -m vitboot_jax.tools.study.representations --workdir=workdirs/quickstart --steps=last
  python -m vitboot_jax.tools.study.representations --workdir=RUN_A --workdir=RUN_B --steps=200,390

On --images evaluation images drawn uniformly (seeded; evaluation preprocessing, train=False),
for each checkpoint step and each ViT block's output (the features the hint compares):
  token_rank      effective rank of the patch tokens (all images and positions, centred): the
                  participation ratio (sum s)^2 / sum s^2 of their covariance's eigenvalues s;
  token_cosine    mean cosine between two different patch tokens of one image (1: all alike);
  token_spread    the share of the patch tokens' variance that lies between positions of one
                  image rather than between images (0: every position of an image alike);
  cls_rank        effective rank of the class tokens across images;
  entropy         mean entropy of the attention rows (nats; uniform attention: log tokens);
and, where the run has an agent, the first three for each agent block's feature map (its
positions as tokens), and per layer pair the official hint's loss beside its floor: the loss of
the best token shared by every position of an image (a ViT that regresses to the image's mean
target sits there; tokens unrelated to the target give about 2).
Tokens that all become alike (rank collapse, over-smoothing) leave the classifier little to read
and the gradient few directions; the mechanism study (docs/results.md) reads the hint's effect
with it. One line per step, then one JSON list. Reads only.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from vitboot_jax import configlib, sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base import cli, errors, library_logs
from vitboot_jax.checkpoint import checkpointer, reader
from vitboot_jax.method import losses
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools import visualize


def effective_rank(x: np.ndarray) -> float:
  """Participation ratio of the covariance of the rows of `x` [n, d]: d for isotropic rows, 1
  for rows on one line, 0 when all rows are equal."""
  x = np.asarray(x, np.float64)
  s = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
  return float(s.sum() ** 2 / (s**2).sum()) if s.sum() > 0 else 0.0


def token_stats(tokens: np.ndarray) -> dict[str, float]:
  """token_rank, token_cosine and token_spread of `tokens` [B, N, D] (N positions per image)."""
  tokens = np.asarray(tokens, np.float64)
  n = tokens.shape[1]
  unit = tokens / np.maximum(np.linalg.norm(tokens, axis=-1, keepdims=True), 1e-12)
  gram = np.einsum("bnd,bmd->bnm", unit, unit)
  cosine = (gram.sum((1, 2)) - np.trace(gram, axis1=1, axis2=2)) / (n * (n - 1))
  total = tokens.reshape(-1, tokens.shape[-1]).var(0).sum()
  within = tokens.var(1).sum(-1).mean()
  return {
    "token_rank": effective_rank(tokens.reshape(-1, tokens.shape[-1])),
    "token_cosine": float(cosine.mean()),
    "token_spread": float(within / total) if total > 0 else 0.0,
  }


def layer_stats(features: np.ndarray, attention: np.ndarray) -> dict[str, float]:
  """The measures of one ViT block: `features` [B, 1 + N, D] (class token first), `attention`
  [B, heads, T, T] probabilities."""
  f = np.asarray(features, np.float64)
  p = np.asarray(attention, np.float64)
  return {
    **token_stats(f[:, 1:]),
    "cls_rank": effective_rank(f[:, 0]),
    "entropy": float(-(p * np.log(np.maximum(p, 1e-30))).sum(-1).mean()),
    "entropy_uniform": float(np.log(p.shape[-1])),
  }


def feature_loss_floor(
  agent_map: jax.Array, vit_tokens: int, *, adapt: str = "seq1d", ln_eps: float = 1e-5
) -> jax.Array:
  """The official hint's loss (losses.feature_loss, formula "official") of a ViT that gives every
  position of an image the same token, the best such token: where regressing to the image's mean
  target leaves it. `vit_tokens` is the ViT's number of patch tokens; float32 scalar."""
  b, h, w, d = agent_map.shape
  agent = agent_map.astype(jnp.float32).reshape(b, h * w, d)
  _, agent = losses.adapt_tokens(jnp.zeros((b, vit_tokens, d), jnp.float32), agent, (h, w), adapt)
  target = losses.layer_norm(agent, ln_eps)
  best = losses.layer_norm(jnp.mean(target, axis=1, keepdims=True), ln_eps)  # Maximises <mean, t>.
  return jnp.mean(jnp.square(target - best))


def hint_fit(vit_features: jax.Array, agent_map: jax.Array, adapt: str) -> dict[str, float]:
  """The official hint's loss of one layer pair (the ViT's raw tokens: a projector aside) beside
  its floor, the loss of the best token shared by all positions of an image: a loss at its floor
  is a ViT that matches only the image's mean target (tokens unrelated to it give about 2)."""
  n = vit_features.shape[1] - 1
  return {
    "loss": float(losses.feature_loss(vit_features, agent_map, adapt=adapt)),
    "floor": float(feature_loss_floor(agent_map, n, adapt=adapt)),
  }


def read_workdir(
  workdir: str, steps: Sequence[int | str] | None, images: int, seed: int = 0
) -> list[dict]:
  """The rows of `workdir`'s checkpoints (every complete one, or `steps`), oldest first."""
  root, steps = reader.steps_to_read(workdir, steps)
  config = visualize.inspection_config(workdir_rules.read_config(root))
  configlib.validate(config)
  trainer = trainer_lib.build(config, sharding.make_mesh(), steps_per_epoch=1)
  if "vit" not in trainer.models.names:
    raise errors.UsageError(f"--workdir={workdir} trains {list(trainer.models.names)}: no ViT")
  x, y = visualize.sample_images(config, images, seed)
  forward = jax.jit(functools.partial(vit_lib.attention_of, trainer.models.vit))
  agent = None
  if "agent" in trainer.models.names:
    agent = jax.jit(
      lambda v, x: trainer.models.apply(v, x, train=False, names=("agent",))[0]["agent"][1][
        "features"
      ]
    )
  rows = []
  with checkpointer.Checkpointer(root, keep=None, async_save=False, read_only=True) as ckpt:
    for step in steps:
      state = ckpt.restore(trainer.abstract_state, step)
      (logits, out), probs = forward({"params": state.params["vit"]}, x)
      layers = [layer_stats(f, p) for f, p in zip(out["features"], probs)]
      top1 = float(np.mean(np.asarray(logits).argmax(-1) == y))
      row = {"workdir": workdir, "step": int(step), "top1": top1, "layers": layers}
      if agent is not None:  # The hint's other side: the same measures of its feature maps.
        maps = agent({"params": state.params, "batch_stats": state.batch_stats}, x)
        row["agent_layers"] = [token_stats(m.reshape(m.shape[0], -1, m.shape[-1])) for m in maps]
        if len(maps) == len(out["features"]):
          row["hint"] = [hint_fit(f, m, config.loss.adapt) for f, m in zip(out["features"], maps)]
      rows.append(row)
  return rows


_WORKDIRS = _STEPS = _IMAGES = _SEED = None


def define_flags() -> None:
  global _WORKDIRS, _STEPS, _IMAGES, _SEED
  _WORKDIRS = flags.DEFINE_multi_string("workdir", None, "A run directory (repeat for several).")
  _STEPS = flags.DEFINE_list(
    "steps", None, "Checkpoint steps to read, numbers or last (the newest); default: every one."
  )
  _IMAGES = flags.DEFINE_integer("images", 256, "Evaluation images drawn for the measures.")
  _SEED = flags.DEFINE_integer("seed", 0, "Seed of the image sample.")
  flags.mark_flag_as_required("workdir")


def print_row(r: dict) -> None:
  """A row's readable lines: the ViT's measures per block, the agent's, the hint's fit."""
  line = lambda key, fmt, layers: f"{key} " + " ".join(format(x[key], fmt) for x in layers)
  keys = [("token_rank", ".2f"), ("token_cosine", ".3f"), ("token_spread", ".3f")]
  vit = [line(k, f, r["layers"]) for k, f in keys + [("cls_rank", ".2f"), ("entropy", ".2f")]]
  head = f"{r['workdir']}  step {r['step']:6d}"
  print(f"{head}  top-1 {r['top1']:.3f}  vit  " + "  ".join(vit))
  if "agent_layers" in r:
    print(f"{head}  agent  " + "  ".join(line(k, f, r["agent_layers"]) for k, f in keys))
  if "hint" in r:
    pairs = " ".join(f"{h['loss']:.3f}/{h['floor']:.3f}" for h in r["hint"])
    print(f"{head}  hint loss/floor per layer  {pairs}")
  sys.stdout.flush()


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  library_logs.libraries()  # Reading a checkpoint logs orbax INFO lines.
  rows = []
  try:
    for workdir in _WORKDIRS.value:  # Each run's lines once read: a time box keeps them.
      for r in read_workdir(workdir, _STEPS.value, _IMAGES.value, _SEED.value):
        print_row(r)
        rows.append(r)
  except errors.UsageError as error:
    cli.fail(str(error))
  print(json.dumps(rows))


if __name__ == "__main__":
  define_flags()
  app.run(main)

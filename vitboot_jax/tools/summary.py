r"""Prints each model's parameter and MAC counts for a config.

  python -m vitboot_jax.tools.summary --config=configs/vits_cifar100.py
  python -m vitboot_jax.tools.summary --config=configs/vitb_cifar100.py:mode=joint

The last line is one JSON object: {"vit": {"params", "params_private", "macs_per_image"},
"agent": {...}}. "params" counts every weight the model's forward reads (a shared agent reads
the ViT's W_V, W_O, b_O and MLP); "params_private" only the weights no other model reads.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import app
from ml_collections import config_flags

from vitboot_jax import configlib, kernel_sets
from vitboot_jax.base import library_logs
from vitboot_jax.models import costs, sharing
from vitboot_jax.models.build import build_models


def summarise(config: ml_collections.ConfigDict) -> dict[str, dict[str, int]]:
  # MACs of the plain XLA kernels: the CPU set's matmul convolutions skip unused CONV taps.
  configlib.validate(config)
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.kernels = "xla"
  models = build_models(config, kernel_sets.for_config(config))
  image_shape = (config.image_size, config.image_size, 3)
  variables = jax.eval_shape(
    models.init, jax.random.key(0), jax.ShapeDtypeStruct((1, *image_shape), jnp.float32)
  )
  params = variables["params"]
  shared_count = costs.count_params(params, sharing.shared_mask(params)) if models.shared else 0
  summary: dict[str, dict[str, Any]] = {}
  for name in models.names:

    def forward(variables, images, name=name):
      return models.apply(variables, images, train=False, names=(name,))[0][name][0]

    own = costs.count_params(params[name])
    uses_shared = models.shared and name == "agent"
    summary[name] = {
      "params": own + shared_count if uses_shared else own,
      "params_private": own - shared_count if models.shared and name == "vit" else own,
      "macs_per_image": costs.macs_per_image(forward, image_shape, variables),
    }
  return summary


_CONFIG = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _CONFIG
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)


def main(argv):
  del argv
  library_logs.libraries()  # JAX's backend start-up logs its probe of libtpu.
  summary = summarise(_CONFIG.value)
  for name, row in summary.items():
    print(
      f"{name:6s} params {row['params'] / 1e6:8.3f}M  private {row['params_private'] / 1e6:8.3f}M"
      f"  MACs/image {row['macs_per_image'] / 1e9:7.3f}G"
    )
  print(json.dumps(summary))


if __name__ == "__main__":
  define_flags()
  app.run(main)

r"""Attention and feature-map figures of a run, as the paper's appendix.

  python -m vitboot_jax.tools.visualize --workdir=workdirs/quickstart --num_images=4
  python -m vitboot_jax.tools.visualize --config=configs/quickstart.py --out=/tmp/vis \
    --images=cat.png,dog.jpg          # Freshly initialised model (seeded by config.seed).

A run is read with its own config (RUN/config.json: model, data and all) and its newest
checkpoint; --config instead shows the fresh initialisation of a config. Writes into --out
(default with --workdir: RUN/figures), for every ViT block l: `attention_layer{l}.png` (per
image: the input, the cls token's attention over the patch grid averaged over heads, and the two
overlaid), `attention_heads_layer{l}.png` (the first image and each head's cls attention),
`features_vit_layer{l}.png` and, for every agent block, `features_agent_layer{l}.png` (per image:
input, the L2 norm over channels of the block output at each position, overlay); plus
`index.json` naming the files. With matplotlib (the [plot] extra) every figure has a title, axis
labels and colour bars in the maps' own units; without it the PNGs are plain tiles, every map
min-max normalised on its own and coloured with a viridis-like table (tools/figures.py draws
both). The attention is the model's own, read from its forward pass (models/vit.attention_of).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from vitboot_jax import configlib, sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base import cli, errors, library_logs
from vitboot_jax.checkpoint import checkpointer
from vitboot_jax.data import device_pipeline, step_preprocess
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.models.build import ModelSet
from vitboot_jax.run import workdir_rules
from vitboot_jax.state import TrainState
from vitboot_jax.tools import figures

INDEX_FILE = "index.json"
FIGURES_SUBDIR = "figures"  # Where a run's figures go by default: RUN/figures.
# ---------------------------------------------------------------------------------------------
# Model state and images.


@dataclasses.dataclass
class Visualisation:
  """What `run` computed and wrote; the maps let callers check them without decoding PNGs."""

  out_dir: str  # Where the figures and index.json were written.
  step: int | None  # The checkpoint's step, or None for a fresh initialisation.
  files: list[str]  # Names (relative to the output directory) of the PNGs written.
  image_names: list[str]  # Where each image came from (eval split index or file path).
  images: np.ndarray  # float32 [B, S, S, 3], normalised as the model sees them.
  attention: list[np.ndarray]  # Per ViT block: float32 [B, heads, 1+N, 1+N] probabilities.
  vit_maps: list[np.ndarray]  # Per ViT block: float32 [B, k, k] token-feature L2 norms.
  agent_maps: list[np.ndarray]  # Per agent block: float32 [B, h, w] feature L2 norms.


def inspection_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy that computes in float32: the figures are for reading, not for speed."""
  config = config.copy_and_resolve_references()
  config.compute_dtype = "float32"
  return config


def load_variables(
  trainer: trainer_lib.Trainer, workdir: str | None
) -> tuple[dict[str, Any], int | None]:
  """({"params", "batch_stats"}, step) of the newest checkpoint in `workdir`, or of a fresh init.

  Both go through the trainer's own setup, so a fresh init is exactly the state training starts
  from and a checkpoint is read into the tree it was written from.
  """
  if workdir is None:
    state: TrainState = trainer.initial_state()
    return {"params": state.params, "batch_stats": state.batch_stats}, None
  ckpt_dir = epath.Path(workdir) / workdir_rules.CHECKPOINT_SUBDIR
  if not ckpt_dir.exists():  # Checked first: the Checkpointer would create the directory.
    raise errors.WorkdirError(
      f"--workdir={workdir} has no {workdir_rules.CHECKPOINT_SUBDIR}/; train there first, or "
      "give --config instead to look at the freshly initialised model"
    )
  with checkpointer.Checkpointer(workdir, keep=None, async_save=False, read_only=True) as ckpt:
    restored = ckpt.restore_latest(trainer.abstract_state)
  if restored is None:
    raise errors.WorkdirError(f"{ckpt_dir} holds no complete checkpoint to visualise")
  state, step = restored
  return {"params": state.params, "batch_stats": state.batch_stats}, int(step)


def load_images(
  config: ml_collections.ConfigDict, num_images: int, image_files: Sequence[str] | None = None
) -> tuple[np.ndarray, list[str]]:
  """float32 [B, S, S, 3] normalised exactly as evaluation does, and a name per image.

  Without `image_files`, the first `num_images` examples of config.data.eval_split.
  """
  if image_files:
    from vitboot_jax.data import tfdata_augment  # Image files: TensorFlow decodes them.

    tf = library_logs.import_tensorflow()
    eval_fn = tfdata_augment.make_eval_fn(config)
    images = [eval_fn(tfdata_augment.decode(tf.io.read_file(path))).numpy() for path in image_files]
    return prepare(config, np.stack(images)), list(image_files)
  if num_images < 1:
    raise ValueError(f"--num_images={num_images} must be at least 1")
  images = []
  for batch in eval_split_batches(config):
    images.extend(batch["image"][batch["mask"] > 0])
    if len(images) >= num_images:
      break
  if not images:
    raise ValueError(f"config.data.eval_split={config.data.eval_split!r} has no images")
  split = config.data.eval_split
  names = [f"{split}[{i}]" for i in range(min(num_images, len(images)))]
  return prepare(config, np.stack(images[:num_images])), names


def sample_images(
  config: ml_collections.ConfigDict, count: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """(images prepared as the model sees them, labels) of `count` evaluation examples drawn
  uniformly without replacement (seeded), in the split's order.

  Not the first `count`: an image folder lists its split class by class, so those are one class.
  One pass over config.data.eval_split, holding only the sample (reservoir sampling).
  """
  if count < 1:
    raise errors.UsageError(f"--images={count} must be at least 1")
  rng = np.random.default_rng(seed)
  kept: list[tuple[int, np.ndarray, int]] = []  # (position in the split, image, label)
  seen = 0
  for batch in eval_split_batches(config):
    keep = batch["mask"] > 0
    for image, label in zip(batch["image"][keep], batch["label"][keep]):
      if seen < count:
        kept.append((seen, image, int(label)))
      else:
        slot = int(rng.integers(0, seen + 1))
        if slot < count:
          kept[slot] = (seen, image, int(label))
      seen += 1
  if seen < count:
    raise errors.UsageError(
      f"--images={count}: config.data.eval_split={config.data.eval_split!r} has only {seen}"
    )
  kept.sort(key=lambda item: item[0])
  images = prepare(config, np.stack([image for _, image, _ in kept]))
  return images, np.asarray([label for _, _, label in kept], np.int32)


def eval_split_batches(config: ml_collections.ConfigDict) -> Iterator[dict[str, np.ndarray]]:
  """Host batches {"image", "label", "mask"} of config.data.eval_split, read by the run's own
  pipeline: with pipeline="device" as its training read it (no TensorFlow), else by tf.data."""
  if config.data.pipeline == "device":
    images, labels, _ = device_pipeline.read_split(config, "eval")
    yield {"image": images, "label": labels, "mask": np.ones(len(labels), np.float32)}
    return
  from vitboot_jax.data import tfdata_pipeline  # tf.data: TensorFlow on the host.

  config = config.copy_and_resolve_references()
  config.data.cache = False  # One pass over a few images: a cache would only hold the split.
  yield from tfdata_pipeline.eval_batches(config, process_index=0, process_count=1)


def prepare(config: ml_collections.ConfigDict, images: np.ndarray) -> np.ndarray:
  """Pipeline output -> model input (uint8 stored-size images are resized as the steps do)."""
  prepared = step_preprocess.make_prepare(config)(jnp.asarray(images))
  return np.asarray(prepared, np.float32)


def denormalise(config: ml_collections.ConfigDict, images: np.ndarray) -> np.ndarray:
  """Normalised float images -> uint8 RGB for display."""
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  pixels = np.asarray(images) * np.asarray(std) + np.asarray(mean)
  return np.round(np.clip(pixels, 0.0, 1.0) * 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Maps.


def _channel_norm(x: jax.Array) -> np.ndarray:
  """L2 norm over the last (channel) axis; a plain channel mean of signed features cancels out."""
  return np.asarray(jnp.linalg.norm(jnp.asarray(x, jnp.float32), axis=-1))


def compute_maps(
  config: ml_collections.ConfigDict,
  models: ModelSet,
  variables: dict[str, Any],
  images: np.ndarray,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
  """(attention per ViT block, ViT feature-norm grids, agent feature-norm maps)."""
  names = tuple(n for n in ("vit", "agent") if n in models.names)
  if not names:
    raise ValueError(f"config.mode={config.mode!r} has neither a ViT nor an agent to visualise")
  images = jnp.asarray(images)
  attention, vit_maps, agent_maps = [], [], []
  if "vit" in names:
    forward = jax.jit(functools.partial(vit_lib.attention_of, models.vit))
    (_, out), probs = forward({"params": variables["params"]["vit"]}, images)
    attention = [np.asarray(p) for p in probs]
    if models.vit.distill_token:  # The maps show cls and patches: drop the token row and column.
      attention = [np.delete(np.delete(p, 1, -1), 1, -2) for p in attention]
    vit_maps = [figures.tokens_to_grid(_channel_norm(f[:, 1:])) for f in out["features"]]
  if "agent" in names:
    forward = jax.jit(lambda v, x: models.apply(v, x, train=False, names=("agent",))[0])
    agent_maps = [_channel_norm(f) for f in forward(variables, images)["agent"][1]["features"]]
  return attention, vit_maps, agent_maps


def run(
  config: ml_collections.ConfigDict | None,
  out_dir: str | None = None,
  workdir: str | None = None,
  num_images: int = 4,
  image_files: Sequence[str] | None = None,
) -> Visualisation:
  """Loads the model, computes the maps and writes the figures.

  Either `workdir` (a run: its config.json and newest checkpoint; figures by default in
  RUN/figures) or `config` (its fresh initialisation; `out_dir` required).
  """
  if workdir is not None and config is not None:
    raise errors.UsageError(
      "--workdir is read with the run's own config (RUN/config.json): leave --config out (or "
      "--workdir, to see --config's fresh init)"
    )
  if workdir is None and config is None:
    raise errors.UsageError("give --workdir=RUN (a trained run) or --config=FILE (a fresh init)")
  if workdir is not None:
    config = workdir_rules.read_config(workdir)
    out_dir = out_dir or os.path.join(workdir, FIGURES_SUBDIR)
  elif not out_dir:
    raise errors.UsageError("--config shows a fresh init: give --out=DIR for its figures")
  config = inspection_config(config)
  configlib.validate(config)
  # The optimizer state's tree does not depend on the schedule's length, so one step per epoch
  # is enough to describe it, and no dataset has to be opened for --images.
  trainer = trainer_lib.build(config, sharding.make_mesh(), steps_per_epoch=1)
  models = trainer.models
  variables, step = load_variables(trainer, workdir)
  images, image_names = load_images(config, num_images, image_files)
  attention, vit_maps, agent_maps = compute_maps(config, models, variables, images)

  scale = max(1, math.ceil(figures.MIN_TILE / config.image_size))
  size = config.image_size * scale
  pictures = np.stack([figures.upsample(p, size, size) for p in denormalise(config, images)])
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  files = figures.write_figures(
    out_dir, pictures, attention, vit_maps, agent_maps, config.image_size
  )
  index = {
    "files": files,
    "step": step,
    "workdir": workdir,
    "mode": config.mode,
    "images": image_names,
    "image_size": config.image_size,
    "tile_size": size,
  }
  (epath.Path(out_dir) / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  return Visualisation(
    out_dir=out_dir,
    step=step,
    files=files,
    image_names=image_names,
    images=images,
    attention=attention,
    vit_maps=vit_maps,
    agent_maps=agent_maps,
  )


# ---------------------------------------------------------------------------------------------
# Command line.


_CONFIG = None
_OUT = None
_WORKDIR = None
_NUM_IMAGES = None
_IMAGES = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _CONFIG, _OUT, _WORKDIR, _NUM_IMAGES, _IMAGES
  _CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:args]) to show freshly initialised."
  )
  _OUT = flags.DEFINE_string(
    "out", None, f"Directory for the PNGs and index.json; default: RUN/{FIGURES_SUBDIR}."
  )
  _WORKDIR = flags.DEFINE_string(
    "workdir", None, "A run: its config.json and newest checkpoint (read only)."
  )
  _NUM_IMAGES = flags.DEFINE_integer("num_images", 4, "How many eval images to show.")
  _IMAGES = flags.DEFINE_list("images", None, "Image files to show instead of eval images.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  library_logs.libraries()  # Restoring a checkpoint logs ~25 orbax INFO lines.
  try:
    result = run(_CONFIG.value, _OUT.value, _WORKDIR.value, _NUM_IMAGES.value, _IMAGES.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  source = "fresh init" if result.step is None else f"checkpoint step {result.step}"
  print(f"Wrote {len(result.files)} figures ({source}) and {INDEX_FILE} to {result.out_dir}")


if __name__ == "__main__":
  define_flags()
  app.run(main)

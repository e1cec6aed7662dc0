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
min-max normalised on its own and coloured with a viridis-like table. The attention is the
model's own, read from its forward pass (models/vit.attention_of).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from vitboot_jax import checkpoint, cli, configlib, errors, quiet, sharding, workdirs
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.data import device_preprocess, input_pipeline, preprocess
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.models.build import ModelSet
from vitboot_jax.state import TrainState
from vitboot_jax.tools import plot

tf = quiet.import_tensorflow()  # PNGs through tf.io; quietly, off every accelerator.

INDEX_FILE = "index.json"
FIGURES_SUBDIR = "figures"  # Where a run's figures go by default: RUN/figures.
# Smallest side of one tile in a figure: a 32-px image or a 4x4 token map is unreadable as is.
MIN_TILE = 128
HEAD_COLUMNS = 5
PAD = 4

# Viridis at 0, 1/4, 1/2, 3/4, 1; the 256-entry table interpolates linearly between them.
_VIRIDIS_ANCHORS = np.array(
  [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64
)
_COLOUR_TABLE = np.stack(
  [
    np.interp(np.linspace(0.0, 1.0, 256), np.linspace(0.0, 1.0, len(_VIRIDIS_ANCHORS)), channel)
    for channel in _VIRIDIS_ANCHORS.T
  ],
  axis=-1,
)
_COLOUR_TABLE = np.round(_COLOUR_TABLE).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# PNG helpers (numpy only).


def normalise01(array2d: np.ndarray) -> np.ndarray:
  """Min-max to [0, 1]; a constant (or non-finite) map becomes 0, not a division by zero."""
  a = np.nan_to_num(np.asarray(array2d, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
  lo, hi = a.min(), a.max()
  return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def colourise(array2d: np.ndarray) -> np.ndarray:
  """A 2-D map -> uint8 [H, W, 3], min-max normalised and coloured with the viridis-like table."""
  array2d = np.asarray(array2d)
  if array2d.ndim != 2:
    raise ValueError(f"colourise takes a 2-D map, got shape {array2d.shape}")
  index = np.round(normalise01(array2d) * 255).astype(np.int64)
  return _COLOUR_TABLE[index]


def upsample(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """Nearest-neighbour resize of [h, w, ...] to [height, width, ...], any ratio."""
  rows = np.arange(height) * image.shape[0] // height
  cols = np.arange(width) * image.shape[1] // width
  return image[rows][:, cols]


def tile(images: Sequence[np.ndarray], cols: int, pad: int = PAD, fill: int = 255) -> np.ndarray:
  """Equal-sized uint8 [H, W, 3] images in a grid of `cols` columns, row by row.

  `pad` pixels of `fill` separate the tiles and frame the grid, so the result is
  [rows * (H + pad) + pad, cols * (W + pad) + pad, 3] with rows = ceil(len(images) / cols).
  """
  if not images:
    raise ValueError("tile needs at least one image")
  shapes = {np.shape(im) for im in images}
  if len(shapes) != 1:
    raise ValueError(f"tile needs images of one shape, got {sorted(shapes)}")
  h, w, c = shapes.pop()
  cols = max(1, min(cols, len(images)))
  rows = math.ceil(len(images) / cols)
  out = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), fill, np.uint8)
  for i, im in enumerate(images):
    top, left = pad + (i // cols) * (h + pad), pad + (i % cols) * (w + pad)
    out[top : top + h, left : left + w] = im
  return out


def save_png(path: str | os.PathLike, image: np.ndarray) -> None:
  """Writes uint8 [H, W, 3] as PNG through tf.io (local paths and gs:// alike)."""
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3:
    raise ValueError(f"save_png takes uint8 [H, W, C], got {image.dtype} {image.shape}")
  with tf.io.gfile.GFile(os.fspath(path), "wb") as f:
    f.write(tf.io.encode_png(image).numpy())


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


def _inspection_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
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
  ckpt_dir = epath.Path(workdir) / checkpoint.CHECKPOINT_SUBDIR
  if not ckpt_dir.exists():  # Checked first: the Checkpointer would create the directory.
    raise errors.WorkdirError(
      f"--workdir={workdir} has no {checkpoint.CHECKPOINT_SUBDIR}/; train there first, or "
      "give --config instead to look at the freshly initialised model"
    )
  with checkpoint.Checkpointer(workdir, keep=None, async_save=False, read_only=True) as ckpt:
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
    eval_fn = preprocess.make_eval_fn(config)
    images = [eval_fn(preprocess.decode(tf.io.read_file(path))).numpy() for path in image_files]
    return _finish(config, np.stack(images)), list(image_files)
  if num_images < 1:
    raise ValueError(f"--num_images={num_images} must be at least 1")
  config = config.copy_and_resolve_references()
  config.data.cache = False  # A few images: a cache read part-way warns when it is dropped.
  images = []
  for batch in input_pipeline.eval_batches(config, process_index=0, process_count=1):
    images.extend(batch["image"][batch["mask"] > 0])
    if len(images) >= num_images:
      break
  if not images:
    raise ValueError(f"config.data.eval_split={config.data.eval_split!r} has no images")
  split = config.data.eval_split
  names = [f"{split}[{i}]" for i in range(min(num_images, len(images)))]
  return _finish(config, np.stack(images[:num_images])), names


def _finish(config: ml_collections.ConfigDict, images: np.ndarray) -> np.ndarray:
  """Pipeline output -> model input (uint8 stored-size images are resized as the steps do)."""
  prepared = device_preprocess.make_prepare(config)(jnp.asarray(images))
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


def _tokens_to_grid(tokens: np.ndarray) -> np.ndarray:
  """[..., N] patch values (row-major) -> [..., k, k]."""
  side = math.isqrt(tokens.shape[-1])
  if side * side != tokens.shape[-1]:
    raise ValueError(f"{tokens.shape[-1]} tokens do not form a square grid")
  return tokens.reshape(*tokens.shape[:-1], side, side)


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
    vit_maps = [_tokens_to_grid(_channel_norm(f[:, 1:])) for f in out["features"]]
  if "agent" in names:
    forward = jax.jit(lambda v, x: models.apply(v, x, train=False, names=("agent",))[0])
    agent_maps = [_channel_norm(f) for f in forward(variables, images)["agent"][1]["features"]]
  return attention, vit_maps, agent_maps


# ---------------------------------------------------------------------------------------------
# Figures.


def _map_tile(map2d: np.ndarray, size: int) -> np.ndarray:
  return upsample(colourise(map2d), size, size)


def _overlay(image: np.ndarray, coloured: np.ndarray) -> np.ndarray:
  return np.round(0.5 * image.astype(np.float32) + 0.5 * coloured).astype(np.uint8)


def _rows(pictures: np.ndarray, maps: np.ndarray) -> np.ndarray:
  """One row per image: the input, its map, the two blended; 3 columns."""
  size = pictures.shape[1]
  tiles = []
  for picture, map2d in zip(pictures, maps):
    coloured = _map_tile(map2d, size)
    tiles += [picture, coloured, _overlay(picture, coloured)]
  return tile(tiles, cols=3)


# Matplotlib figures: the size of one panel (a map with its colour bar) and the title band.
PANEL_INCHES = (3.4, 3.0)
TITLE_INCHES = 0.6
DPI = 100


def _matplotlib():
  """(Figure, FigureCanvasAgg), or None without matplotlib (the optional [plot] extra)."""
  classes = plot.matplotlib_or_none()
  return None if classes is None else classes[:2]


def figure_pixels(rows: int, cols: int) -> tuple[int, int]:
  """(height, width) in pixels of a matplotlib figure of `rows` x `cols` panels."""
  return (
    round((rows * PANEL_INCHES[1] + TITLE_INCHES) * DPI),
    round(cols * PANEL_INCHES[0] * DPI),
  )


def _new_figure(rows: int, cols: int, title: str) -> tuple[Any, np.ndarray]:
  Figure, FigureCanvasAgg = _matplotlib()
  height, width = figure_pixels(rows, cols)
  fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(rows, cols, squeeze=False)
  fig.suptitle(title)
  return fig, axes


def _show_picture(ax: Any, picture: np.ndarray, title: str, side: int) -> None:
  """The (up-sampled) input on axes in the model input's pixels, `side` of them a row."""
  ax.imshow(picture, interpolation="nearest", extent=(0, side, side, 0))
  ax.set(title=title, xlabel="x (px)", ylabel="y (px)")


def _show_map(
  fig: Any, ax: Any, map2d: np.ndarray, title: str, label: str, grid: str, vmin=None, vmax=None
) -> None:
  """The map in its own units (token or feature-map positions) with its colour bar."""
  image = _imshow_grid(ax, map2d, title, grid, vmin, vmax)
  fig.colorbar(image, ax=ax, label=label, fraction=0.046, pad=0.04)


def _imshow_grid(ax: Any, map2d: np.ndarray, title: str, grid: str, vmin=None, vmax=None) -> Any:
  from matplotlib.ticker import MaxNLocator

  image = ax.imshow(map2d, cmap="viridis", interpolation="nearest", vmin=vmin, vmax=vmax)
  ax.set(title=title, xlabel=f"{grid} column", ylabel=f"{grid} row")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # Positions, not fractions of them.
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  return image


def _show_overlay(ax: Any, picture: np.ndarray, map2d: np.ndarray, side: int) -> None:
  """The map (the colours of the panel before) stretched over the input, half transparent."""
  ax.imshow(picture, interpolation="nearest", extent=(0, side, side, 0))
  ax.imshow(map2d, cmap="viridis", alpha=0.5, extent=(0, side, side, 0), interpolation="bilinear")
  ax.set(title="overlay", xlabel="x (px)", ylabel="y (px)")


def rows_figure(
  pictures: np.ndarray,
  maps: np.ndarray,
  title: str,
  map_title: str,
  label: str,
  grid: str,
  side: int,
) -> Any:
  """A figure with one row per image: the input (axes in the `side`-px model input's pixels),
  its map (colour bar in `label` units) and the map over the input in the same colours."""
  fig, axes = _new_figure(len(pictures), 3, title)
  for (ax_in, ax_map, ax_over), picture, map2d in zip(axes, pictures, maps):
    _show_picture(ax_in, picture, "input", side)
    _show_map(fig, ax_map, map2d, map_title, label, grid)
    _show_overlay(ax_over, picture, map2d, side)
  return fig


def heads_figure(picture: np.ndarray, heads: np.ndarray, title: str, side: int) -> Any:
  """The input and each head's cls attention on one colour scale (one colour bar)."""
  cols = HEAD_COLUMNS
  rows = math.ceil((len(heads) + 1) / cols)
  fig, axes = _new_figure(rows, cols, title)
  flat = axes.reshape(-1)
  _show_picture(flat[0], picture, "input", side)
  vmin, vmax = float(np.min(heads)), float(np.max(heads))
  image = None
  for h, (ax, map2d) in enumerate(zip(flat[1:], heads)):
    image = _imshow_grid(ax, map2d, f"head {h}", "patch", vmin, vmax)
  for ax in flat[len(heads) + 1 :]:
    ax.set_axis_off()
  fig.colorbar(image, ax=list(flat), label="cls attention probability", shrink=0.8)
  return fig


def _save_figure(path: str, fig: Any) -> None:
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png")
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(buffer.getvalue())


def write_figures(
  out_dir: str,
  pictures: np.ndarray,
  attention: list[np.ndarray],
  vit_maps: list[np.ndarray],
  agent_maps: list[np.ndarray],
  side: int,
) -> list[str]:
  """Writes every figure; `pictures` are the uint8 inputs already up-sampled to the tile size
  from the `side`-px model input, whose pixels the figures' axes count.

  With matplotlib: titled figures with axis labels and colour bars in the maps' own units;
  without it, plain tiled PNGs (input, min-max normalised map, overlay) and a note saying so.
  """
  size = pictures.shape[1]
  files = []
  plain = _matplotlib() is None
  if plain:
    print(
      "visualize: matplotlib is not installed (pip install -e '.[plot]'): plain PNGs without "
      "titles, axis labels or colour bars",
      file=sys.stderr,
    )

  def write(name: str, image_or_figure: Any) -> None:
    path = os.path.join(out_dir, name)
    if plain:
      save_png(path, image_or_figure)
    else:
      _save_figure(path, image_or_figure)
    files.append(name)

  for layer, probs in enumerate(attention):
    cls_rows = _tokens_to_grid(probs[:, :, 0, 1:])  # [B, heads, k, k]
    mean = cls_rows.mean(axis=1)
    k = mean.shape[-1]
    if plain:
      write(f"attention_layer{layer}.png", _rows(pictures, mean))
      heads = [pictures[0], *(_map_tile(m, size) for m in cls_rows[0])]
      write(f"attention_heads_layer{layer}.png", tile(heads, cols=HEAD_COLUMNS))
      continue
    title = f"ViT block {layer}: attention of the cls token over the {k}x{k} patches"
    fig = rows_figure(
      pictures, mean, title, "mean over heads", "cls attention probability", "patch", side
    )
    write(f"attention_layer{layer}.png", fig)
    write(
      f"attention_heads_layer{layer}.png",
      heads_figure(pictures[0], cls_rows[0], f"{title}, per head (first image)", side),
    )
  for name, all_maps in (("vit", vit_maps), ("agent", agent_maps)):
    for layer, maps in enumerate(all_maps):
      file = f"features_{name}_layer{layer}.png"
      if plain:
        write(file, _rows(pictures, maps))
        continue
      h, w = maps.shape[1:]
      model, grid = ("ViT", "patch") if name == "vit" else ("agent", "position")
      title = f"{model} block {layer}: L2 norm over channels of its output ({h}x{w})"
      write(file, rows_figure(pictures, maps, title, "feature norm", "L2 norm", grid, side))
  return files


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
    config = workdirs.read_config(workdir)
    out_dir = out_dir or os.path.join(workdir, FIGURES_SUBDIR)
  elif not out_dir:
    raise errors.UsageError("--config shows a fresh init: give --out=DIR for its figures")
  config = _inspection_config(config)
  configlib.validate(config)
  # The optimizer state's tree does not depend on the schedule's length, so one step per epoch
  # is enough to describe it, and no dataset has to be opened for --images.
  trainer = trainer_lib.build(config, sharding.make_mesh(), steps_per_epoch=1)
  models = trainer.models
  variables, step = load_variables(trainer, workdir)
  images, image_names = load_images(config, num_images, image_files)
  attention, vit_maps, agent_maps = compute_maps(config, models, variables, images)

  scale = max(1, math.ceil(MIN_TILE / config.image_size))
  size = config.image_size * scale
  pictures = np.stack([upsample(p, size, size) for p in denormalise(config, images)])
  tf.io.gfile.makedirs(out_dir)
  files = write_figures(out_dir, pictures, attention, vit_maps, agent_maps, config.image_size)
  index = {
    "files": files,
    "step": step,
    "workdir": workdir,
    "mode": config.mode,
    "images": image_names,
    "image_size": config.image_size,
    "tile_size": size,
  }
  with tf.io.gfile.GFile(os.path.join(out_dir, INDEX_FILE), "w") as f:
    f.write(json.dumps(index, indent=2) + "\n")
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
  quiet.libraries()  # Restoring a checkpoint logs ~25 orbax INFO lines.
  try:
    result = run(_CONFIG.value, _OUT.value, _WORKDIR.value, _NUM_IMAGES.value, _IMAGES.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  source = "fresh init" if result.step is None else f"checkpoint step {result.step}"
  print(f"Wrote {len(result.files)} figures ({source}) and {INDEX_FILE} to {result.out_dir}")


if __name__ == "__main__":
  define_flags()
  app.run(main)

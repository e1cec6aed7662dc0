"""The figures of tools/visualize.py: with matplotlib (the [plot] extra) titled figures with axis
labels and colour bars in the maps' own units, without it plain tiled PNGs, every map min-max
normalised on its own and coloured with a viridis-like table (numpy only).
"""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from vitboot_jax.base import library_logs
from vitboot_jax.tools import plot


def _tf():
  """TensorFlow for PNGs only when one is written: the tools that read maps or tokens
  (representations, hessian) run on accelerator hosts without it."""
  return library_logs.import_tensorflow()


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
  tf = _tf()
  with tf.io.gfile.GFile(os.fspath(path), "wb") as f:
    f.write(tf.io.encode_png(image).numpy())


def tokens_to_grid(tokens: np.ndarray) -> np.ndarray:
  """[..., N] patch values (row-major) -> [..., k, k]."""
  side = math.isqrt(tokens.shape[-1])
  if side * side != tokens.shape[-1]:
    raise ValueError(f"{tokens.shape[-1]} tokens do not form a square grid")
  return tokens.reshape(*tokens.shape[:-1], side, side)


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
  with _tf().io.gfile.GFile(path, "wb") as f:
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
    cls_rows = tokens_to_grid(probs[:, :, 0, 1:])  # [B, heads, k, k]
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

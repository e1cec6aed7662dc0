r"""Training curves of one or more runs in one PNG, read from each workdir's metrics.jsonl.

  python -m vitboot_jax.tools.plot --workdirs=workdirs/vit,workdirs/shared \
    --labels=vit,shared [--smooth=10] [--out=PNG]

The PNG goes to the first run's workdir (workdirs/vit/curves.png) unless --out names another.

Panels (x axis: epochs):
  * eval top-1 of every model of every run, the paper's Fig. 5: one colour per run, ViT solid,
    agent dashed (CNN dotted);
  * the feature-loss weight w(t) of mutual runs;
  * training loss terms: loss_vit, loss_agent, loss_cnn, feature, KD (kd_vit solid, kd_agent
    dashed);
  * Align (shared runs only): the cosine between the two gradients on the shared weights and the
    conflict rate (fraction of logged steps whose inner product is negative);
  * the hint's pull on the ViT (runs with a feature term): the norm of the feature term's share of
    the ViT's gradient over the cross-entropy's (hint_grad_ratio), and both norms.
Training curves are per-batch values logged every `log_every_steps`, so they are noisy: they are
drawn as a trailing moving average over --smooth logged points (1 disables it); the feature
weight is piecewise constant and drawn as is. A training panel no run logs is left out (a CNN's
runs get two panels, not ten); the eval panel stays, saying so where no run has evaluated yet.

matplotlib is an optional dependency (`pip install -e '.[plot]'`); it is imported only when a
figure is drawn, through the non-interactive Agg canvas, so no display is needed and pyplot's
global state is never touched.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags, logging
from etils import epath

from vitboot_jax.run import metrics

MODEL_STYLES = {"vit": "-", "agent": "--", "cnn": ":"}
MODEL_LABELS = {"vit": "ViT", "agent": "agent", "cnn": "CNN"}
DEFAULT_SMOOTH = 10
DEFAULT_OUT = "curves.png"  # In the first run's workdir: nothing lands in the repository root.
COLUMNS = 2  # Panels a row of the figure; PANEL_INCHES is one panel's size.
LEGEND_INSIDE_MAX = 8  # With more runs the legend goes below the panels instead of over one.
LEGEND_COLUMNS = 4
PANEL_INCHES = (6.0, 3.4)
DPI = 100
INSTALL_HINT = "pip install -e '.[plot]'"


@dataclasses.dataclass
class Run:
  """The logged curves of one workdir, split into training and evaluation records."""

  label: str
  workdir: epath.Path
  train: list[dict[str, Any]]
  eval: list[dict[str, Any]]


def load_run(workdir: str | os.PathLike, label: str | None = None) -> Run:
  """Reads `<workdir>/metrics.jsonl` (a local path or a URL such as gs://...); eval and train
  scalars are logged as separate lines."""
  workdir = epath.Path(workdir)  # pathlib would turn gs://b/run into gs:/b/run and read nothing.
  records = metrics.read_metrics(workdir)
  if not records:
    logging.warning("%s has no metrics.jsonl records yet.", workdir)
  train = [r for r in records if any(k.startswith("train/") for k in r)]
  evals = [r for r in records if any(k.startswith("eval/") for k in r)]
  return Run(label or workdir.name, workdir, train, evals)


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(epochs, values) of `key` over the records that hold it, in step order.

  Records without an "epoch" field (older logs) fall back to the step number.
  """
  points = sorted(
    (r["step"], r.get("epoch", r["step"]), r[key])
    for r in records
    if key in r and r[key] is not None
  )
  if not points:
    return np.zeros(0), np.zeros(0)
  _, x, y = zip(*points)
  return np.asarray(x, np.float64), np.asarray(y, np.float64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over the last `window` points (fewer at the start); same length as input.

  Non-finite values are left out of the mean, so one NaN step does not blank a whole window.
  """
  values = np.asarray(values, np.float64)
  if window <= 1 or values.size == 0:
    return values
  finite = np.isfinite(values)
  sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
  counts = np.concatenate([[0], np.cumsum(finite)])
  end = np.arange(1, values.size + 1)
  start = np.maximum(end - window, 0)
  count = counts[end] - counts[start]
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(count > 0, (sums[end] - sums[start]) / np.maximum(count, 1), np.nan)


def matplotlib_or_none():
  """(Figure, FigureCanvasAgg, Line2D) of matplotlib, or None where the optional [plot] extra
  is not installed (visualize then writes plain tiles)."""
  try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
  except ModuleNotFoundError as error:
    if (error.name or "").partition(".")[0] != "matplotlib":
      raise
    return None
  return Figure, FigureCanvasAgg, Line2D


def _matplotlib():
  """(Figure, FigureCanvasAgg, Line2D), or an error that says how to install matplotlib."""
  classes = matplotlib_or_none()
  if classes is None:
    raise ModuleNotFoundError(
      f"vitboot_jax.tools.plot needs matplotlib, an optional dependency: {INSTALL_HINT}",
      name="matplotlib",
    )
  return classes


def run_colours(n: int) -> list[Any]:
  """One colour per run, all different: matplotlib's 10-colour cycle, then its 20 paired colours
  (tab20), then evenly spaced hues of a continuous map for more runs than that."""
  if n <= 10:
    return [f"C{i}" for i in range(n)]
  import matplotlib  # Present: the caller has checked (_matplotlib).

  if n <= 20:
    return [matplotlib.colormaps["tab20"](i) for i in range(n)]
  return [matplotlib.colormaps["turbo"](x) for x in np.linspace(0.0, 1.0, n)]


def _no_data(ax: Any, what: str) -> None:
  ax.text(0.5, 0.5, f"no run logs {what}", ha="center", va="center", transform=ax.transAxes)


@dataclasses.dataclass(frozen=True)
class Panel:
  """A training panel: one line per (run, key), colour by run, line style by key.

  `only_if`: runs that never log this key are left out (every mode logs the feature weight, but it
  only means something where there is a feature loss). `log_if_wide`: log y axis when positive
  values span more than 10x. `smooth`: False draws the values as logged. `hline`: a grey reference
  line at that value.
  """

  title: str
  keys: tuple[tuple[str, str], ...]
  ylabel: str | None = None
  only_if: str | None = None
  log_if_wide: bool = True
  smooth: bool = True
  hline: float | None = None
  ylim: tuple[float, float] | None = None


TRAIN_PANELS = (
  Panel(
    "feature weight w(t)",
    (("train/feature_weight", "-"),),
    only_if="train/feature",
    log_if_wide=False,
    smooth=False,
  ),
  Panel("loss_vit", (("train/loss_vit", "-"),)),
  Panel("loss_agent", (("train/loss_agent", "--"),)),
  Panel("loss_cnn", (("train/loss_cnn", ":"),)),
  Panel("feature loss", (("train/feature", "-"),)),
  Panel("KD (vit solid, agent dashed)", (("train/kd_vit", "-"), ("train/kd_agent", "--"))),
  Panel("Align: cos(g_vit, g_agent)", (("train/align_cosine", "-"),), log_if_wide=False, hline=0.0),
  Panel(
    "Align: conflict rate",
    (("train/align_conflict", "-"),),
    ylabel="fraction of steps",
    log_if_wide=False,
    ylim=(-0.03, 1.03),
  ),
  Panel("hint / CE gradient norm on the ViT", (("train/hint_grad_ratio", "-"),), hline=1.0),
  Panel(
    "ViT gradient: CE solid, hint dashed",
    (("train/grad_norm_ce_share_vit", "-"), ("train/grad_norm_feature_share_vit", "--")),
  ),
)


Line = tuple[str, np.ndarray, np.ndarray]  # (line style, epochs, values)


def _lines(run: Run, panel: Panel) -> list[Line]:
  """(style, epochs, values) of each of `panel`'s keys that `run` logs."""
  if panel.only_if and not any(panel.only_if in r for r in run.train):
    return []
  lines = [(style, *series(run.train, key)) for key, style in panel.keys]
  return [(style, x, y) for style, x, y in lines if x.size]


def _shown(runs: Sequence[Run]) -> list[tuple[Panel, list[list[Line]]]]:
  """(panel, each run's lines) of the training panels some run logs, in TRAIN_PANELS' order."""
  each = [(panel, [_lines(run, panel) for run in runs]) for panel in TRAIN_PANELS]
  return [(panel, lines) for panel, lines in each if any(lines)]


def shown_panels(runs: Sequence[Run]) -> list[Panel]:
  """The training panels some run logs, in TRAIN_PANELS' order."""
  return [panel for panel, _ in _shown(runs)]


def _plot_train(
  ax: Any, lines: Sequence[list[Line]], colours: Sequence[str], panel: Panel, smooth: int
):
  """Draws `panel` from each run's (style, epochs, values) lines, one colour a run."""
  drawn = []
  for run_lines, colour in zip(lines, colours):
    for style, x, y in run_lines:
      y = moving_average(y, smooth if panel.smooth else 1)
      ax.plot(x, y, style, color=colour, linewidth=1.2)
      drawn.append(y[np.isfinite(y)])
  ax.set_title(panel.title)
  ax.set_xlabel("epoch")
  if panel.ylabel:
    ax.set_ylabel(panel.ylabel)
  ax.grid(alpha=0.3)
  if panel.hline is not None:
    ax.axhline(panel.hline, color="grey", linewidth=0.8)
  if panel.ylim:
    ax.set_ylim(*panel.ylim)
  values = np.concatenate(drawn)
  # A shared ViT's loss (feature term included) is ~10x a plain ViT's: log scale keeps both legible.
  if panel.log_if_wide and values.size and values.min() > 0 and values.max() > 10 * values.min():
    ax.set_yscale("log")


def plot_runs(
  workdirs: Sequence[str | os.PathLike],
  out: str | os.PathLike | None = None,
  labels: Sequence[str] | None = None,
  smooth: int = DEFAULT_SMOOTH,
  title: str | None = None,
) -> epath.Path | pathlib.Path:
  """Draws the curves of `workdirs` into the PNG `out`; returns its path.

  Args:
    workdirs: Run directories holding metrics.jsonl.
    out: Output PNG path; its parent is created. Default: DEFAULT_OUT in the first workdir.
    labels: One legend label per workdir (default: the workdir's name).
    smooth: Moving-average window (logged points) of the training curves; 1 disables it.
    title: Figure title.
  """
  Figure, FigureCanvasAgg, Line2D = _matplotlib()
  if labels is not None and len(labels) != len(workdirs):
    raise ValueError(f"{len(labels)} labels for {len(workdirs)} workdirs; give one per workdir")
  labels = labels or [None] * len(workdirs)
  runs = [load_run(w, label) for w, label in zip(workdirs, labels)]
  if not any(run.train or run.eval for run in runs):
    raise ValueError(f"none of {[str(w) for w in workdirs]} holds a {metrics.METRICS_FILE}")
  colours = run_colours(len(runs))
  panels = _shown(runs)
  cols = min(COLUMNS, 1 + len(panels))
  rows = math.ceil((1 + len(panels)) / cols)
  below = len(runs) > LEGEND_INSIDE_MAX
  legend_inches = 0.25 * math.ceil((len(runs) + 2) / LEGEND_COLUMNS) + 0.2 if below else 0.0
  height = PANEL_INCHES[1] * rows + legend_inches
  fig = Figure(figsize=(PANEL_INCHES[0] * cols, height), dpi=DPI)
  FigureCanvasAgg(fig)
  axes = fig.subplots(rows, cols, squeeze=False)

  # Eval top-1 per model (Fig. 5 of the paper).
  ax = axes[0, 0]
  models_seen = []
  for run, colour in zip(runs, colours):
    for model, style in MODEL_STYLES.items():
      x, y = series(run.eval, f"eval/top1_{model}")
      if x.size:
        ax.plot(x, 100.0 * y, style, color=colour, marker=".", markersize=4, linewidth=1.5)
        models_seen.append(model)
  ax.set_title("eval top-1 (ViT solid, agent dashed, CNN dotted)")
  ax.set_xlabel("epoch")
  ax.set_ylabel("top-1 (%)")
  ax.grid(alpha=0.3)
  if models_seen:
    handles = [
      Line2D([], [], color=c, linewidth=2, label=run.label) for run, c in zip(runs, colours)
    ]
    handles += [
      Line2D([], [], color="black", linestyle=MODEL_STYLES[m], label=MODEL_LABELS[m])
      for m in MODEL_STYLES
      if m in models_seen
    ]
    if below:
      fig.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.015),
        ncol=LEGEND_COLUMNS,
        fontsize="small",
        frameon=False,
      )
    else:
      ax.legend(handles=handles, fontsize="small", loc="best")
  else:
    _no_data(ax, "eval/top1_*")

  flat = axes.ravel()
  for ax, (panel, lines) in zip(flat[1:], panels):
    _plot_train(ax, lines, colours, panel, smooth)
  for ax in flat[1 + len(panels) :]:
    ax.axis("off")
  if smooth > 1:
    note = f"training curves: moving average over {smooth} logged points"
    fig.text(0.99, 0.005, note, ha="right", va="bottom", fontsize="small", color="grey")
  if title:
    fig.suptitle(title)
  bottom = (legend_inches + 0.05) / height if below else 0.015
  fig.tight_layout(rect=(0, bottom, 1, 0.98 if title else 1))
  out = epath.Path(workdirs[0]) / DEFAULT_OUT if out is None else epath.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("wb") as f:
    fig.savefig(f, format="png")
  return out if "://" in os.fspath(out) else pathlib.Path(out)  # Local: a plain pathlib.Path.


_FLAGS = {}


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  _FLAGS["workdirs"] = flags.DEFINE_list("workdirs", None, "Run directories, comma-separated.")
  _FLAGS["out"] = flags.DEFINE_string(
    "out", None, f"Output PNG path; default: {DEFAULT_OUT} in the first workdir."
  )
  _FLAGS["labels"] = flags.DEFINE_list("labels", None, "Legend labels, one per workdir.")
  _FLAGS["smooth"] = flags.DEFINE_integer(
    "smooth", DEFAULT_SMOOTH, "Moving-average window of the training curves (1: none)."
  )
  _FLAGS["title"] = flags.DEFINE_string("title", None, "Figure title.")
  flags.mark_flags_as_required(["workdirs"])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  workdirs = _FLAGS["workdirs"].value
  labels = [s.strip() for s in _FLAGS["labels"].value] if _FLAGS["labels"].value else None
  out = plot_runs(
    workdirs, _FLAGS["out"].value, labels, _FLAGS["smooth"].value, _FLAGS["title"].value
  )
  print(json.dumps({"out": str(out), "workdirs": workdirs}))


if __name__ == "__main__":
  define_flags()
  app.run(main)

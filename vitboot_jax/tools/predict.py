r"""Classifies images with a run's trained model: the top-k class names and their probabilities.

  python -m vitboot_jax.tools.predict --workdir=RUN [--model=vit|agent|cnn] [--top_k=5] \
    [--batch_size=64] [--output=FILE.csv|FILE.json] [--strict] PATH [PATH ...]

Each PATH is an image file or a folder, searched with its subfolders for JPEG/PNG files. An image
whose folder is named after one of the run's classes (the `<class>/` layout of an image folder
split, e.g. ROOT/test) is labelled by it, and the line after the table gives the top-1 accuracy
over those images. Images of any mode and size the training reader takes (grey, RGB, RGBA,
palette) are read as it reads them (data/read_folders.py) and resized and normalised as the run's
evaluation does (data/step_preprocess.py), without TensorFlow, in batches of --batch_size on
JAX's default device: the CPU or an accelerator.

The model is the run's own: RUN/config.json and its newest complete checkpoint, read as export
reads them (checkpoint/reader.py; nothing in RUN is written, so a run may still be training),
and the class names it recorded (RUN/data.json). --model: the run's ViT by default, or its only
model. Prints a table (one image a line) and, with --output, writes every prediction as CSV or
JSON. An unreadable image is named in one line and skipped (with --strict it ends the command,
exit 2); a workdir without a complete checkpoint is one line and exit 2.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import app, flags

from vitboot_jax.base import cli, errors, files, library_logs
from vitboot_jax.data import read_folders, workdir_record
from vitboot_jax.run import workdir_rules

MODELS = ("vit", "agent", "cnn")
OUTPUT_SUFFIXES = (".csv", ".json")
TOP_K = 5
BATCH_SIZE = 64


@dataclasses.dataclass(frozen=True)
class Image:
  """One image to classify: its path and, inside a `<class>/` folder, that class's index."""

  path: str
  label: int | None = None


@dataclasses.dataclass
class Prediction:
  path: str
  label: int | None  # The folder's class, or None.
  classes: list[int]  # The top-k class indices, most probable first.
  probabilities: list[float]


@dataclasses.dataclass
class Predictions:
  """What `predict` found: every readable image's top-k, and the files it skipped."""

  workdir: str
  step: int
  model: str
  class_names: tuple[str, ...]
  images: list[Prediction]
  skipped: list[tuple[str, str]]  # (path, why)

  @property
  def labelled(self) -> list[Prediction]:
    return [p for p in self.images if p.label is not None]

  @property
  def top1_accuracy(self) -> float | None:
    labelled = self.labelled
    if not labelled:
      return None
    return sum(p.classes[0] == p.label for p in labelled) / len(labelled)


# ---------------------------------------------------------------------------------------------
# Images.


def list_images(paths: Sequence[str], class_names: Sequence[str]) -> list[Image]:
  """The images of `paths` in order: a file as given, a folder's JPEG/PNG files sorted by path
  (subfolders included); each labelled where its folder is named after a class."""
  index = {name: i for i, name in enumerate(class_names)}
  found = []
  for path in paths:
    if os.path.isfile(path):
      found.append(path)
    elif os.path.isdir(path):
      inside = sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(path)
        for name in names
        if name.lower().endswith(read_folders.IMAGE_EXTENSIONS) and name[0] != "."
      )
      if not inside:
        raise errors.UsageError(f"{path} holds no {'/'.join(read_folders.IMAGE_EXTENSIONS)} images")
      found += inside
    else:
      raise errors.UsageError(f"{path}: no such file or folder")
  return [Image(p, index.get(os.path.basename(os.path.dirname(os.path.abspath(p))))) for p in found]


def _read(image: Image) -> np.ndarray | str:
  """uint8 [H, W, 3] as the training reader decodes it, or why it cannot be read."""
  try:
    return read_folders.read_image(image.path)
  except Exception as error:  # PIL raises several types; each is the file's fault here.
    return " ".join(str(error).split())[:200] or type(error).__name__


# ---------------------------------------------------------------------------------------------
# The model.


@dataclasses.dataclass(frozen=True)
class Classifier:
  """A run's model, ready to classify: `prepare` takes uint8 images of one size to the model's
  input, `best(variables, input [B, S, S, 3])` gives (top-k probabilities, top-k classes)."""

  run: Any  # checkpoint/reader.Run
  model: str
  class_names: tuple[str, ...]
  variables: dict[str, Any]  # On JAX's default device.
  prepare: Callable[[np.ndarray], Any]
  best: Callable[[dict[str, Any], np.ndarray], tuple[Any, Any]]
  image_size: int


def load(workdir: str, model: str | None = None, top_k: int = TOP_K) -> Classifier:
  """The classifier of `workdir`'s newest complete checkpoint: `model` (default: the ViT, or the
  run's only model) with its top `top_k` classes (at most the class count)."""
  # JAX loads here, after the command's own checks: a mistake there is one line within a second.
  import jax
  import jax.numpy as jnp

  from vitboot_jax import kernel_sets
  from vitboot_jax.checkpoint import reader
  from vitboot_jax.data import step_preprocess
  from vitboot_jax.models.build import build_models

  run = reader.read_run(workdir, models=MODELS)  # A shared agent reads the ViT's weights too.
  config = run.config
  models = build_models(config, kernel_sets.for_config(config))
  model = model or ("vit" if "vit" in models.names else models.names[0])
  if model not in models.names:
    raise errors.UsageError(
      f"--model={model}: this run (mode {config.mode!r}) trained {', '.join(models.names)}"
    )
  try:
    class_names = workdir_record.class_names(config, workdir_rules.saved_data(workdir))
  except errors.DataError as error:
    print(f"predict: classes named by index: {error}", file=sys.stderr)
    class_names = tuple(str(i) for i in range(config.data.num_classes))
  if len(class_names) != config.data.num_classes:
    raise errors.UsageError(
      f"--workdir={workdir} records {len(class_names)} class names for the "
      f"{config.data.num_classes} classes of config.data.num_classes"
    )
  k = max(1, min(top_k, len(class_names)))

  @jax.jit
  def best(variables: dict[str, Any], images: jax.Array) -> tuple[jax.Array, jax.Array]:
    outputs, _ = models.apply(variables, images, train=False, names=(model,))
    logits = outputs[model][0].astype(jnp.float32)
    _, classes = jax.lax.top_k(logits, k)  # Ties to the lower class, as evaluation ranks them.
    return jnp.take_along_axis(jax.nn.softmax(logits), classes, axis=-1), classes

  return Classifier(
    run=run,
    model=model,
    class_names=class_names,
    variables=jax.device_put({"params": run.params, "batch_stats": run.batch_stats}),
    prepare=jax.jit(step_preprocess.make_prepare(config)),  # One compile per image size.
    best=best,
    image_size=int(config.image_size),
  )


def _batches(
  classifier: Classifier, images: Sequence[Image], batch_size: int, skip: Callable[[str, str], None]
) -> Iterator[tuple[list[Image], np.ndarray]]:
  """(the readable images of each `batch_size` slice, their model input padded to the batch)."""
  size = classifier.image_size
  for start in range(0, len(images), batch_size):
    kept, inputs = [], []
    for image in images[start : start + batch_size]:
      pixels = _read(image)
      if isinstance(pixels, str):
        skip(image.path, pixels)
        continue
      kept.append(image)
      inputs.append(np.asarray(classifier.prepare(pixels[None]))[0])
    if kept:
      padding = np.zeros([batch_size - len(kept), size, size, 3], np.float32)
      yield kept, np.concatenate([np.stack(inputs), padding])  # One shape: one compile.


def predict(
  workdir: str,
  paths: Sequence[str],
  model: str | None = None,
  top_k: int = TOP_K,
  batch_size: int = BATCH_SIZE,
  strict: bool = False,
) -> Predictions:
  """The top-k classes of every image of `paths` by `workdir`'s model. An unreadable image is
  named on stderr and skipped, or with `strict` raises UnreadableImageError."""
  if top_k < 1 or batch_size < 1:
    raise errors.UsageError(f"--top_k={top_k} and --batch_size={batch_size} must be at least 1")
  classifier = load(workdir, model, top_k)
  images = list_images(paths, classifier.class_names)
  skipped: list[tuple[str, str]] = []

  def skip(path: str, why: str) -> None:
    if strict:
      raise read_folders.UnreadableImageError(
        f"cannot read image file {path}: {why} (--strict; without it the file is skipped)"
      )
    print(f"predict: skipped {path}: not a readable JPEG/PNG image ({why})", file=sys.stderr)
    skipped.append((path, why))

  found = []
  for kept, inputs in _batches(classifier, images, batch_size, skip):
    probabilities, classes = map(np.asarray, classifier.best(classifier.variables, inputs))
    for i, image in enumerate(kept):
      found.append(
        Prediction(
          image.path, image.label, classes[i].tolist(), probabilities[i].astype(float).tolist()
        )
      )
  run = classifier.run
  return Predictions(workdir, run.step, classifier.model, classifier.class_names, found, skipped)


# ---------------------------------------------------------------------------------------------
# Output.


def table(result: Predictions) -> str:
  """The terminal's view: a row per image, its top-k as `name probability%`, most probable first."""
  names = result.class_names
  labelled = bool(result.labelled)
  rows = [["image", *(["folder"] if labelled else []), "top-1", *_ranks(result)[1:]]]
  for p in result.images:
    folder = [names[p.label] if p.label is not None else ""] if labelled else []
    best = [f"{names[c]} {100 * q:.1f}%" for c, q in zip(p.classes, p.probabilities)]
    rows.append([p.path, *folder, *best])
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _ranks(result: Predictions) -> list[str]:
  k = len(result.images[0].classes) if result.images else 0
  return [f"top-{i + 1}" for i in range(k)]


def summary(result: Predictions) -> str:
  """One line: what classified how many images, the skipped, and the folders' top-1 accuracy."""
  model = {"vit": "ViT", "agent": "agent", "cnn": "CNN"}[result.model]
  line = f"{_images(len(result.images))} classified by the {model} of {result.workdir}"
  line += f" (step {result.step})"
  if result.skipped:
    line += f", {len(result.skipped)} unreadable skipped"
  accuracy = result.top1_accuracy
  if accuracy is not None:
    labelled = _images(len(result.labelled))
    line += f"; top-1 accuracy {100 * accuracy:.2f}% on the {labelled} in a folder named by class"
  return line


def _images(count: int) -> str:
  return f"{count} image{'' if count == 1 else 's'}"


def to_csv(result: Predictions) -> str:
  """A row per image: path, folder class (or empty), then each rank's class and probability."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  ranks = range(1, len(_ranks(result)) + 1)
  writer.writerow(["path", "label", *(f"{n}_{i}" for i in ranks for n in ("class", "probability"))])
  names = result.class_names
  for p in result.images:
    best = [v for c, q in zip(p.classes, p.probabilities) for v in (names[c], f"{q:.6f}")]
    writer.writerow([p.path, names[p.label] if p.label is not None else "", *best])
  return out.getvalue()


def to_json(result: Predictions) -> str:
  names = result.class_names
  record = {
    "workdir": os.path.abspath(result.workdir),
    "step": result.step,
    "model": result.model,
    "top1_accuracy": result.top1_accuracy,
    "labelled": len(result.labelled),
    "images": [
      {
        "path": p.path,
        "label": names[p.label] if p.label is not None else None,
        "top_k": [
          {"class": names[c], "index": c, "probability": q}
          for c, q in zip(p.classes, p.probabilities)
        ],
      }
      for p in result.images
    ],
    "skipped": [{"path": path, "why": why} for path, why in result.skipped],
  }
  return json.dumps(record, indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line.

_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """Defines this tool's flags when it runs as a program (tests import it without them)."""
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "The run's workdir (read only).")
  _FLAGS["model"] = flags.DEFINE_enum(
    "model", None, MODELS, "The run's model to classify with; default: its ViT, or its only one."
  )
  _FLAGS["top_k"] = flags.DEFINE_integer("top_k", TOP_K, "Classes per image (at most all).")
  _FLAGS["batch_size"] = flags.DEFINE_integer("batch_size", BATCH_SIZE, "Images per batch.")
  _FLAGS["output"] = flags.DEFINE_string("output", None, "Also write every prediction: .csv/.json")
  _FLAGS["strict"] = flags.DEFINE_bool(
    "strict", False, "Refuse an unreadable image (exit 2) instead of skipping it."
  )


def _check(workdir: str | None, output: str | None, paths: Sequence[str]) -> None:
  """The command's own mistakes, one line each, before anything is read."""
  if not workdir:
    cli.fail("--workdir is required: the workdir of a training run")
  if not paths:
    cli.fail("give image files or folders to classify after the flags")
  if output and not output.endswith(OUTPUT_SUFFIXES):
    cli.fail(f"--output={output} must end in {' or '.join(OUTPUT_SUFFIXES)}")
  missing = [p for p in paths if not os.path.exists(p)]
  if missing:
    cli.fail(f"{missing[0]}: no such file or folder (give image files or folders)")
  if not workdir_rules.has_checkpoint(workdir):
    cli.fail(
      f"--workdir={workdir} holds no complete checkpoint ({workdir_rules.CHECKPOINT_SUBDIR}/"
      "<step>); train there first, or give the workdir of a run that saved one"
    )


def main(argv: Sequence[str]) -> None:
  paths, output = argv[1:], _FLAGS["output"].value
  _check(_FLAGS["workdir"].value, output, paths)
  library_logs.libraries()
  try:
    result = predict(
      _FLAGS["workdir"].value,
      paths,
      model=_FLAGS["model"].value,
      top_k=_FLAGS["top_k"].value,
      batch_size=_FLAGS["batch_size"].value,
      strict=_FLAGS["strict"].value,
    )
  except errors.UsageError as error:
    cli.fail(str(error))
  if result.images:
    print(table(result))
  if output:
    text = to_csv(result) if output.endswith(".csv") else to_json(result)
    files.write_atomically(output, text.encode())
  print(summary(result) + (f"; wrote {output}" if output else ""))


if __name__ == "__main__":
  define_flags()
  app.run(main)

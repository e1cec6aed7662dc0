"""tools/predict.py: a run's model classifies image files and folders as its own evaluation does;
unreadable images are named and skipped (or refused); a workdir without a checkpoint is one line."""

import csv
import io
import json
import os

import jax
import numpy as np
import pytest

from tests import runs, without_tensorflow
from vitboot_jax import evaluate, kernel_sets
from vitboot_jax.base import errors
from vitboot_jax.models.build import build_models
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools import predict, visualize

CLASSES = ("cat", "dog", "owl")
# The modes and sizes of a user's folder: grey PNG, RGB JPEG, RGBA PNG, each size its own.
KINDS = (("L", 8, "png"), ("RGB", 24, "jpg"), ("RGBA", 40, "png"))


def write_mixed_folder(root, per_class=(("train", 16), ("test", 4))):
  """ROOT/<split>/<class>/ of small images in three modes and sizes, coloured by class."""
  from PIL import Image

  rng = np.random.default_rng(0)
  for split, count in per_class:
    for c, name in enumerate(CLASSES):
      folder = root / split / name
      folder.mkdir(parents=True)
      for i in range(count):
        mode, size, suffix = KINDS[i % len(KINDS)]
        colour = np.array([c * 100, 255 - c * 100, 60 + 40 * c])
        pixels = np.clip(rng.integers(0, 50, (size, size, 3)) + colour, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels).convert(mode)
        image.save(folder / f"{i:03d}.{suffix}")
  return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny shared-mode run (ViT and agent) trained a few steps on a mixed folder."""
  folder = write_mixed_folder(tmp_path_factory.mktemp("mixed"))
  workdir = tmp_path_factory.mktemp("predict") / "run"
  runs.run(workdir, folder, "--config.num_epochs=1", config=f"{runs.TINY}:classes=3")
  return workdir, folder


def _tool(*args):
  """The command, where TensorFlow cannot be imported (as on a host with jax alone)."""
  return without_tensorflow.run_module("vitboot_jax.tools.predict", args, runs.env(1), 300)


def _own_evaluation(workdir, model, labels=None):
  """The run's own evaluation of its test split (tf.data's reading, evaluate.py's counting),
  with `labels` (in the split's order) in place of the folders' where given."""
  config = workdir_rules.read_config(workdir)
  classifier = predict.load(str(workdir), model)
  models = build_models(config, kernel_sets.for_config(config))
  eval_step = jax.jit(evaluate.make_eval_step(models))
  batches = [dict(b, label=np.array(b["label"])) for b in visualize.eval_split_batches(config)]
  if labels is not None:
    start = 0
    for batch in batches:
      count = int(batch["mask"].sum())
      batch["label"][:count] = labels[start : start + count]
      start += count
  variables = classifier.variables
  return evaluate.evaluate(eval_step, variables["params"], variables["batch_stats"], batches)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vit", "agent"])
def test_predict_gives_the_models_own_evaluation(trained, model):
  workdir, folder = trained
  result = predict.predict(str(workdir), [str(folder / "test")], model=model, batch_size=5)
  assert len(result.images) == 12 and not result.skipped
  assert [p.label for p in result.images] == [c for c in range(3) for _ in range(4)]
  assert all(len(p.classes) == 3 for p in result.images)  # --top_k 5 is capped at 3 classes.
  top1 = np.array([p.classes[0] for p in result.images])
  # The run's evaluation scores predict's top-1 as every image's label: each one is its top-1.
  agreement = _own_evaluation(workdir, model, labels=top1)
  assert agreement[f"eval/top1_{model}"] == 1.0
  own = json.loads((workdir / "final.json").read_text())[f"top1_{model}"]
  assert result.top1_accuracy == pytest.approx(own)
  probabilities = np.array([p.probabilities for p in result.images])
  assert np.all(np.diff(probabilities, axis=1) <= 0)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_command_line_table_csv_json_and_a_corrupt_file(trained, tmp_path):
  workdir, folder = trained
  mixed = tmp_path / "new"
  mixed.mkdir()
  for source, name in [("cat/000.png", "a.png"), ("dog/001.jpg", "b.jpg")]:
    (mixed / name).write_bytes((folder / "test" / source).read_bytes())
  (mixed / "c.png").write_bytes((folder / "test" / "owl" / "002.png").read_bytes()[:60])
  grey = folder / "test" / "owl" / "000.png"

  done = _tool(f"--workdir={workdir}", "--top_k=2", f"--output={tmp_path}/p.csv", mixed, grey)
  assert done.returncode == 0, done.stderr[-3000:]
  skipped = [line for line in done.stderr.splitlines() if line.startswith("predict: skipped")]
  assert len(skipped) == 1 and f"{mixed}/c.png" in skipped[0], done.stderr[-3000:]
  lines = done.stdout.strip().splitlines()
  assert lines[0].split() == ["image", "folder", "top-1", "top-2"] and len(lines) == 1 + 3 + 1
  assert lines[1].startswith(f"{mixed}/a.png ") and lines[3].split()[:2] == [str(grey), "owl"]
  assert lines[-1].startswith(f"3 images classified by the ViT of {workdir} (step 3)")
  assert "1 unreadable skipped; top-1 accuracy " in lines[-1] and "on the 1 image in" in lines[-1]
  assert lines[-1].endswith(f"; wrote {tmp_path}/p.csv")
  rows = list(csv.DictReader(io.StringIO((tmp_path / "p.csv").read_text())))
  assert [r["path"] for r in rows] == [f"{mixed}/a.png", f"{mixed}/b.jpg", str(grey)]
  assert set(rows[0]) == {"path", "label", "class_1", "probability_1", "class_2", "probability_2"}
  assert all(r["class_1"] in CLASSES and float(r["probability_1"]) > 0 for r in rows)

  refused = _tool(f"--workdir={workdir}", "--strict", mixed)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert (
    refused.stderr.strip()
    .splitlines()[-1]
    .startswith(f"error: cannot read image file {mixed}/c.png: ")
  )
  assert "Traceback" not in refused.stderr

  done = _tool(f"--workdir={workdir}", "--model=agent", f"--output={tmp_path}/p.json", folder)
  assert done.returncode == 0, done.stderr[-3000:]
  record = json.loads((tmp_path / "p.json").read_text())
  assert record["model"] == "agent" and record["step"] == 3 and record["labelled"] == 60
  first = record["images"][0]
  assert first["label"] == "cat" and [c["class"] for c in first["top_k"]][0] in CLASSES
  assert "top-1 accuracy" in done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("make", ["nothing", "config only", "incomplete step"])
def test_a_workdir_without_a_complete_checkpoint_is_one_line_and_exit_2(tmp_path, make):
  workdir = tmp_path / "run"
  if make != "nothing":
    workdir.mkdir()
    (workdir / "config.json").write_text("{}")
  if make == "incomplete step":
    (workdir / "checkpoints" / "4").mkdir(parents=True)  # A save cut short: no commit marker.
  image = tmp_path / "a.png"
  image.write_bytes(b"")
  proc = _tool(f"--workdir={workdir}", image)
  assert proc.returncode == 2
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "holds no complete checkpoint" in lines[0], proc.stderr


def test_usage_mistakes_are_one_line_and_exit_2(tmp_path):
  for args, message in [
    ((), "--workdir is required"),
    ((f"--workdir={tmp_path}",), "give image files or folders"),
    ((f"--workdir={tmp_path}", "--output=p.txt", "x.png"), "must end in .csv or .json"),
    ((f"--workdir={tmp_path}", tmp_path / "x.png"), "x.png: no such file or folder"),
  ]:
    proc = _tool(*args)
    assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_folders_are_listed_in_order_and_labelled_by_class(tmp_path):
  write_mixed_folder(tmp_path, (("test", 2),))
  (tmp_path / "loose.jpg").write_bytes((tmp_path / "test" / "dog" / "001.jpg").read_bytes())
  (tmp_path / "notes.txt").write_text("not an image")
  images = predict.list_images([str(tmp_path)], CLASSES)
  assert [os.path.relpath(i.path, tmp_path) for i in images] == [
    "loose.jpg",
    *(f"test/{c}/{n}" for c in CLASSES for n in ("000.png", "001.jpg")),
  ]
  assert [i.label for i in images] == [None, 0, 0, 1, 1, 2, 2]
  single = predict.list_images([str(tmp_path / "test" / "owl" / "000.png")], CLASSES)
  assert single == [predict.Image(str(tmp_path / "test" / "owl" / "000.png"), 2)]
  with pytest.raises(errors.UsageError, match="no such file or folder"):
    predict.list_images([str(tmp_path / "missing")], CLASSES)

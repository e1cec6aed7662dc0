"""Issue 83's items 1 and 2 as device calls: the carried folder (tools/prepare_data --folder_out)
holds exactly the images a held-out run reads, and launch/gpu_small_data.py runs the tables' rows
on it, the official recipes unchanged but for the data and the speed flags, within its budget."""

import collections
import importlib.util
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests.config_files import apply_flags, load_config
from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.data import read_folders, splits
from vitboot_jax.tools import prepare_data
from vitboot_jax.tools.sweep import study_rows
from vitboot_jax.tools.sweep import tables as sweep_tables

REPO = pathlib.Path(__file__).resolve().parents[1]
CLASSES = ("ant", "bee", "cow")


def _launcher():
  spec = importlib.util.spec_from_file_location("gpu_small_data", REPO / "launch/gpu_small_data.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # Its dataclasses look their module up there.
  spec.loader.exec_module(module)
  return module


def _folder(root: pathlib.Path, train: int = 20, test: int = 4) -> pathlib.Path:
  """CLASSES x (train, test) 8x8 images with distinct pixels, PNG and JPEG mixed."""
  rng = np.random.default_rng(0)
  for split, n in (("train", train), ("test", test)):
    for c in CLASSES:
      (root / split / c).mkdir(parents=True)
      for k in range(n):
        image = Image.fromarray(rng.integers(0, 255, (8, 8, 3), np.uint8))
        image.save(root / split / c / f"img_{k:03d}.{'png' if k % 2 else 'jpg'}")
  return root


def _config(data_dir, **data):
  c = configlib.base_config()
  c.data.name, c.data.dir, c.data.num_classes = "folder", str(data_dir), len(CLASSES)
  c.data.update(data)
  return c


def _listing(root: pathlib.Path, split: str) -> dict[str, bytes]:
  return {
    str(p.relative_to(root / split)): p.read_bytes()
    for p in sorted((root / split).glob("*/*"))
    if p.is_file()
  }


def test_the_packed_folder_reads_as_the_held_out_selection(tmp_path):
  source, packed = _folder(tmp_path / "source"), tmp_path / "packed"
  counts = prepare_data.pack_folder(str(source), str(packed), 0.5, 0.25)
  assert counts == {"train": 30, "val": 15, "test": 12}  # 10 + 5 of 20 a class, 4 test.
  held_out = _config(source, train_fraction=0.5, val_split="held_out", val_fraction=0.25)
  carried = _config(packed, train_fraction=1.0, val_split="val")
  for part in splits.PARTS:  # The same images, labels and order, from either folder.
    images, labels, _ = read_folders.folder_arrays(held_out, part)
    images_c, labels_c, _ = read_folders.folder_arrays(carried, part)
    np.testing.assert_array_equal(images_c, images)
    np.testing.assert_array_equal(labels_c, labels)
  # The same files under the same names: the held-out run's training rows, its validation rows.
  paths, _ = read_folders.list_folder(str(source), "train", "train_split", CLASSES)
  _, labels = read_folders.list_folder(str(source), "train", "train_split", CLASSES)
  for part, rows in (
    ("train", splits.training_rows(held_out, labels, class_names=CLASSES)),
    ("val", splits.validation_rows(held_out, labels, class_names=CLASSES)),
  ):
    chosen = {os.path.relpath(p, source / "train"): open(p, "rb").read() for p in paths[rows]}
    assert _listing(packed, part) == chosen
  assert _listing(packed, "test") == _listing(source, "test")
  manifest = json.loads((packed / prepare_data.FOLDER_MANIFEST).read_text())
  assert manifest["counts"] == counts and "--config.data.val_split=val" in manifest["data_flags"]
  # Packing the same selection again copies nothing; another one is refused, nothing removed.
  assert prepare_data.pack_folder(str(source), str(packed), 0.5, 0.25) == counts
  with pytest.raises(errors.UsageError, match="another selection"):
    prepare_data.pack_folder(str(source), str(packed), 0.5, 0.2)
  assert _listing(packed, "val")


def test_the_carried_cifar10_is_the_papers_subset_and_its_held_out_images(cifar10_dir, tmp_path):
  packed = tmp_path / "cifar10_small"
  counts = prepare_data.pack_folder(str(cifar10_dir), str(packed), 0.1, 0.1)
  assert counts == {"train": 5000, "val": 5000, "test": 10000}
  classes = tuple(read_folders.class_folders(str(cifar10_dir), "train", "train_split"))
  paths, labels = read_folders.list_folder(str(cifar10_dir), "train", "train_split", classes)
  names = np.array([os.path.relpath(p, cifar10_dir / "train") for p in paths])
  # Training: the paper's subset as every run without validation reads it (no held-out code).
  paper = set(names[splits.subset_indices(labels, 0.1)])
  held = _config(cifar10_dir, train_fraction=0.1, val_split="held_out", val_fraction=0.1)
  val = set(names[splits.validation_rows(held, labels, class_names=classes)])
  train_listing, val_listing = _listing(packed, "train"), _listing(packed, "val")
  assert set(train_listing) == paper and set(val_listing) == val and not paper & val
  assert all(sum(n.startswith(f"{c}/") for n in val) == 500 for c in classes)
  for name in list(train_listing)[::97] + list(val_listing)[::97]:  # The same bytes.
    assert (cifar10_dir / "train" / name).read_bytes() == (train_listing | val_listing)[name]


def _dry(item, root, *flags):
  proc = subprocess.run(
    [sys.executable, "launch/gpu_small_data.py", item, str(root), "--dry", *flags],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  return [(lines[i][2:].split()[0], shlex.split(lines[i + 1])) for i in range(0, len(lines), 2)]


# What the carried data and the speed flags change; the recipes stay as the tables give them.
CARRIED = {
  "data.name",
  "data.dir",
  "data.pipeline",
  "data.train_fraction",
  "data.val_split",
  "data.val_fraction",
  "steps_per_call",
  "checkpoint_every_steps",
  "eval_every_epochs",
}


def _checked(args, data):
  assert args[:3] == ["python", "-m", "vitboot_jax.main"]
  spec = next(a for a in args if a.startswith("--config=")).removeprefix("--config=")
  table = load_config(spec)
  config = apply_flags(load_config(spec), [a for a in args if a.startswith("--config.")])
  configlib.validate(config, num_devices=1)
  changed = {
    f"{group}.{k}" if group else k
    for group, fields in [(None, config)] + [(g, config[g]) for g in ("data", "optim", "model")]
    for k in fields
    if not hasattr(fields[k], "items") and fields[k] != (table[group] if group else table)[k]
  }
  # The seed, the toy's epochs, and the baseline's hygiene rows' own flags (tables.HYGIENE).
  row_flags = {"seed", "num_epochs", "optim.warmup_epochs", "optim.decay_all", "optim.clip_norm"}
  assert changed <= CARRIED | row_flags, changed
  assert (config.data.name, config.data.dir, config.data.pipeline) == ("folder", data, "device")
  assert (config.data.train_fraction, config.data.val_split) == (1.0, "val")
  assert (config.steps_per_call, config.checkpoint_every_steps) == (39, 1560)
  return spec, config


def test_item1_runs_the_quickstarts_official_rows_for_240_epochs(tmp_path):
  data = str(REPO / "carry/cifar10_small")
  commands = _dry("schedule240", tmp_path / "s240")
  rows = ["vit", "agent", "joint", "shared_align"]
  assert [k for k, _ in commands] == [
    f"paper_schedule_240/{r}_seed{s}" for s in (0, 1) for r in rows
  ]
  for (run, args), row in zip(commands, rows * 2):
    spec, config = _checked(args, data)
    assert spec.startswith("configs/quickstart.py:mode=") and spec.endswith(",epochs=240")
    assert config.num_epochs == 240 and config.eval_every_epochs == 10
    assert config.mode == row.split("_")[0] and config.seed == int(run[-1])
    assert f"--workdir={tmp_path / 's240' / run.split('/')[1]}" in args
    assert config.optim.clip_norm == (0.1 if row == "vit" else 0.0)  # The official recipe.
    assert config.optim.warmup_epochs == 0 and config.optim.decay_all
    if row == "shared_align":
      assert config.align == "pcgrad"
  assert not (tmp_path / "s240").exists()  # A dry run writes nothing.


def test_item2_runs_the_seed_methods_and_teachers_rows_in_one_root(tmp_path):
  data = str(tmp_path / "small")
  commands = dict(_dry("small_data", tmp_path / "r", f"--data={data}", "--epochs=2"))
  methods = [f"baseline_methods/{r.run_name}_seed{s}" for s in (0, 1) for r in _rows("methods")]
  teachers = [f"teachers/{r.run_name}_seed{s}" for s in (0, 1) for r in _rows("teachers")]
  head = methods + teachers  # The issues' order: issue 81's rows first.
  assert list(commands)[: len(head)] == head
  # Then the students' own runs, once tables.TEACHER has named the teachers.
  later = [run.split("/")[0] for run in list(commands)[len(head) :]]
  assert set(later) <= {"students", "students_long"}
  assert bool(later) == bool(sweep_tables.TEACHER)
  e = sweep_tables.BASELINE_SCHEDULE  # The winner's grid run where it is the grid's schedule.
  base = "aug_light" if e == study_rows.BASELINE_EPOCHS else f"aug_light_e{e}"
  assert [r.run_name for r in _rows("methods")] == [
    base,
    f"mimetic_e{e}",
    f"impulse3_e{e}",
    f"drloc_e{e}",
  ]
  configs = {}
  for run, args in list(commands.items())[: len(head)]:
    _, config = configs[run.split("/")[1]] = _checked(args, data)
    assert config.num_epochs == 2 and config.eval_every_epochs == 5
    assert config.mode == ("cnn" if "resnet" in run else "agent" if "agent" in run else "vit")
    assert f"--workdir={tmp_path / 'r' / run.split('/')[1]}" in args  # One root for all.
  assert configs[f"{base}_seed0"][1].model.init == "standard"
  assert configs[f"mimetic_e{e}_seed1"][1].model.init == "mimetic"
  assert configs[f"drloc_e{e}_seed0"][1].drloc.weight == study_rows.DRLOC_VIT_LAMBDA == 0.01


def _rows(which):
  return sweep_tables.rows({"methods": "baseline_methods"}.get(which, which))


def _with_students(monkeypatch, module, teacher="resnet20", other="agent_e100"):
  """The module's tables with the students table registered, as tables.TEACHER will."""
  students = sweep_tables.students_table(sweep_tables.BASELINE_WINNER, teacher, other)
  monkeypatch.setitem(module.sweep_tables.TABLES, "students", students)
  return students


def test_item2_runs_each_student_after_its_teacher_and_a_shared_run_once(monkeypatch, tmp_path):
  module = _launcher()
  students = _with_students(monkeypatch, module)
  jobs = module.plan("small_data", str(tmp_path))
  workdirs = [j.workdir for j in jobs]
  assert len(workdirs) == len(set(workdirs))  # The winner and the teachers run once.
  own = [j for j in jobs if j.table.name == "students"]
  # The students' table reuses both teachers' runs (and the winner's where the methods table
  # runs it: at the grid's schedule); the rest are its own.
  earlier = {r.run_name for name in ("baseline_methods", "teachers") for r in _rows(name)}
  assert {"resnet20", "agent_e100"} <= earlier
  assert len(own) == 2 * len([r for r in students.rows if r.run_name not in earlier])
  after = {j.row.run_name + f"_seed{j.seed}": j.after for j in own}
  for seed in (0, 1):
    assert after[f"corr_resnet20_seed{seed}"] == (f"teachers/resnet20_seed{seed}",)
    assert after[f"corr_resnet20_eval_seed{seed}"] == (f"teachers/resnet20_seed{seed}",)
    assert after[f"kd_resnet20_seed{seed}"] == (f"teachers/resnet20_seed{seed}",)
    assert after[f"corr_agent_e100_seed{seed}"] == (f"teachers/agent_e100_seed{seed}",)
    assert after[f"vit_matched_resnet20_seed{seed}"] == after[f"joint_seed{seed}"] == ()
  keys = {j.key for j in jobs}
  assert all(dep in keys for j in own for dep in j.after)


def test_item2_runs_the_longer_students_after_their_teachers(monkeypatch, tmp_path):
  module = _launcher()
  _with_students(monkeypatch, module)
  longer = sweep_tables.longer_students_table(
    sweep_tables.BASELINE_WINNER, "resnet20", "agent_e100", False, epochs=200
  )
  monkeypatch.setitem(module.sweep_tables.TABLES, "students_long", longer)
  jobs = module.plan("small_data", str(tmp_path))
  assert len({j.workdir for j in jobs}) == len(jobs)
  own = {f"{j.row.run_name}_seed{j.seed}": j.after for j in jobs if j.table.name == "students_long"}
  # The baseline at 200 epochs is the methods table's run (BASELINE_SCHEDULE = 200).
  assert sweep_tables.BASELINE_SCHEDULE == 200
  assert set(own) == {
    f"{r}_seed{s}"
    for r in ("corr_resnet20_e200", "kd_resnet20_e200", "corr_agent_e100_e200")
    for s in (0, 1)
  }
  assert own["corr_resnet20_e200_seed1"] == ("teachers/resnet20_seed1",)
  assert own["corr_agent_e100_e200_seed0"] == ("teachers/agent_e100_seed0",)


# A stand-in run: sleeps, then writes final.json with a validation top-1; SIGTERM ends it unsaved.
_FAKE = """
import json, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
time.sleep({sleep})
pathlib.Path({workdir!r}).mkdir(parents=True, exist_ok=True)
pathlib.Path({workdir!r}, "final.json").write_text(json.dumps({{"val_top1_vit": {val}}}))
print("step 10/10 ep 1.00  100 img/s  ETA 0s", flush=True)
"""


def _fake_launcher(module, item, root, budget_s, sleeps, vals=None):
  args = module.parse([item, str(root), f"--budget_s={budget_s}"])
  jobs = module.plan(item, args.root)
  launcher = module.Launcher(args, jobs)

  def command(job):
    run = job.row.run_name
    code = _FAKE.format(
      sleep=sleeps.get(run, 0.2), workdir=str(job.workdir), val=(vals or {}).get(run, 0.5)
    )
    return ["python", "-c", code]

  launcher.command = command
  return launcher


def test_seed1_rows_start_where_seed0s_time_fits_and_a_cut_run_is_reported(tmp_path, monkeypatch):
  module = _launcher()
  monkeypatch.setattr(module, "POLL_S", 0.05)
  monkeypatch.setattr(module, "GRACE_S", 5)
  # vit and agent take 0.3 s: their seed-1 runs fit; joint 3 s: its seed 1 (3.3 s) does not fit
  # what is left of 5 s; shared 20 s: cut at the budget, its seed 1 never started.
  sleeps = {"vit": 0.3, "agent": 0.3, "joint": 3, "shared_align": 20}
  launcher = _fake_launcher(module, "schedule240", tmp_path / "s240", 5, sleeps)
  launcher.run()
  status = {j.key.split("/")[1]: (j.status, j.note) for j in launcher.jobs}
  assert [status[f"{r}_seed0"][0] for r in sleeps] == ["finished"] * 3 + ["cut"]
  assert status["vit_seed1"][0] == status["agent_seed1"][0] == "finished"
  assert status["joint_seed1"][0] == "skipped" and "left" in status["joint_seed1"][1]
  assert status["shared_align_seed1"] == ("skipped", "not started before the budget was spent")
  launcher.write_summary()
  summary = json.loads((tmp_path / "s240" / "summary.json").read_text())
  assert [r["status"] for r in summary["runs"]][:4] == ["finished"] * 3 + ["cut"]
  assert "shared_align_seed0: cut" in (tmp_path / "s240" / "rows.txt").read_text()


def test_students_start_only_once_their_teacher_has_finished(tmp_path, monkeypatch):
  module = _launcher()
  monkeypatch.setattr(module, "POLL_S", 0.05)
  _with_students(monkeypatch, module)
  sleeps = {"resnet20": 1.0, "agent_e100": 0.5}
  launcher = _fake_launcher(module, "small_data", tmp_path / "r", 60, sleeps)
  events = []
  launch, reap = launcher.launch, launcher.reap
  launcher.launch = lambda job: (events.append(("start", job.key)), launch(job))
  launcher.reap = lambda job: (reap(job), events.append(("end", job.key)))
  launcher.run()
  assert all(j.status == "finished" for j in launcher.jobs)
  order = {e: i for i, e in enumerate(events)}
  for job in launcher.jobs:
    for dep in job.after:
      assert order[("end", dep)] < order[("start", job.key)], (dep, job.key)
  waits = collections.Counter(j.table.name for j in launcher.jobs if j.after)
  # Four student rows a seed; three of the longer students once tables.TEACHER_EVAL is set.
  longer = {"students_long": 6} if "students_long" in module.sweep_tables.TABLES else {}
  assert waits == {"students": 8, **longer}


def test_the_carried_archive_is_unpacked_once(tmp_path):
  module = _launcher()
  folder = _folder(tmp_path / "small", train=2, test=1)
  with tarfile.open(tmp_path / "small.tar.gz", "w:gz") as tar:
    tar.add(folder, arcname="small")
  listing = _listing(folder, "train")
  os.rename(folder, tmp_path / "elsewhere")
  module.unpack_data(str(tmp_path / "small"))
  assert _listing(tmp_path / "small", "train") == listing
  module.unpack_data(str(tmp_path / "small"))  # Present: left alone.


def test_the_tables_files_are_gathered_under_each_tables_prefix(tmp_path, monkeypatch):
  """ROOT/table.md holds every table of the item, the teachers' read from their prefixed file."""
  module = _launcher()
  launcher = _fake_launcher(module, "small_data", tmp_path / "r", 30, {})
  for job in launcher.jobs:
    folder = pathlib.Path(job.root)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job.table.files}table.md").write_text(f"rows of {job.table.name}\n")
    (folder / f"{job.table.files}table.json").write_text(json.dumps({"t": job.table.name}))
  done = subprocess.CompletedProcess([], 0, "", "")
  monkeypatch.setattr(module.subprocess, "run", lambda *a, **k: done)
  launcher.write_tables()
  text = (tmp_path / "r" / "table.md").read_text()
  assert "rows of baseline_methods" in text and "rows of teachers" in text
  assert json.loads((tmp_path / "r" / "table.json").read_text())["teachers"] == {"t": "teachers"}

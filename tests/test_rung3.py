"""The third rung's command (launch/rung3_224.sh): every row is the paper's ViT-S config at 224 px,
unchanged but for the data and the epochs, and valid as the device call will run it."""

import os
import pathlib
import shlex
import subprocess
import tarfile

import numpy as np

from tests.config_files import apply_flags, load_config
from vitboot_jax import configlib
from vitboot_jax.data import read_npz
from vitboot_jax.tools.sweep import tables as sweep_tables

REPO = pathlib.Path(__file__).resolve().parents[1]
ROWS = ["vit", "agent", "joint", "shared_align", "shared_noalign"]


def _launch(root, epochs, npz_dir, **env):
  return subprocess.run(
    ["bash", str(REPO / "launch/rung3_224.sh"), str(root), str(epochs), str(npz_dir)],
    capture_output=True,
    text=True,
    env={**os.environ, **env},
    cwd=REPO,
    timeout=120,
  )


def test_rows_are_the_papers_vits_configs_on_the_device_pipeline(tmp_path):
  npz_dir = tmp_path / "npz"
  npz_dir.mkdir()
  for split, n in (("train", 80), ("test", 20)):
    images = np.zeros((n, 32, 32, 3), np.uint8)
    read_npz.write_npz(str(npz_dir / f"{split}.npz"), images, np.arange(n) % 10)
  proc = _launch(tmp_path / "root", 240, npz_dir, DRY="1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  commands = [line for line in proc.stdout.splitlines() if line.startswith("python -m")]
  assert len(commands) == len(ROWS)
  assert [r.name for r in sweep_tables.rows("replication_224")] == ROWS
  assert not (tmp_path / "root").exists()  # A dry run writes nothing.
  for row, command in zip(ROWS, commands):
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "vitboot_jax.main"]
    spec = next(a for a in args if a.startswith("--config=")).removeprefix("--config=")
    assert spec.startswith("configs/vits_cifar10.py:mode="), spec
    paper = load_config(spec)
    config = apply_flags(load_config(spec), [a for a in args if a.startswith("--config.")])
    configlib.validate(config, num_devices=1)
    # The recipe unchanged: only the data, the epochs, the seed and the evaluation cadence differ.
    changed = {
      f"{group}.{k}" if group else k
      for group, fields in [(None, config)] + [(g, config[g]) for g in ("data", "optim", "model")]
      for k in fields
      if not hasattr(fields[k], "items") and fields[k] != (paper[group] if group else paper)[k]
    }
    assert changed <= {
      "num_epochs",
      "eval_every_epochs",
      "data.name",
      "data.dir",
      "data.pipeline",
      "data.train_fraction",
    }, (row, changed)
    assert (config.image_size, config.batch_size, config.model.embed_dim) == (224, 64, 288)
    assert config.data.pipeline == "device" and config.data.dir == str(npz_dir)
    assert config.num_epochs == 240 and config.eval_every_epochs == 24
    assert config.mode == row.split("_")[0]
    if row.startswith("shared"):
      assert config.align == ("none" if row == "shared_noalign" else "pcgrad")


def _blank_npz(tmp_path):
  """NPZ_DIR with 20 blank train and test images: what the dry launches read."""
  npz_dir = tmp_path / "npz"
  npz_dir.mkdir()
  for split in ("train", "test"):
    read_npz.write_npz(
      str(npz_dir / f"{split}.npz"), np.zeros((20, 32, 32, 3), np.uint8), np.arange(20) % 10
    )
  return npz_dir


def test_another_tables_rows_run_the_same_way_and_must_be_named(tmp_path):
  # Queue item 5: the mechanism rows at 16x16 tokens, side by side on the device pipeline.
  npz_dir = _blank_npz(tmp_path)
  refused = _launch(tmp_path / "root", 10, npz_dir, TABLE="mechanism_tokens16")
  assert refused.returncode == 2 and "needs ROWS" in refused.stderr
  proc = _launch(tmp_path / "root", 10, npz_dir, TABLE="mechanism_tokens16", ROWS="agent", DRY="1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  commands = [shlex.split(c) for c in proc.stdout.splitlines() if c.startswith("python -m")]
  names = [r.name for r in sweep_tables.rows("mechanism_tokens16")]
  assert names == [r.name for r in sweep_tables.rows("mechanism")] and len(commands) == len(names)
  for args in commands:
    spec = next(a for a in args if a.startswith("--config=")).removeprefix("--config=")
    assert spec.startswith("configs/cifar10_tokens16.py:mode="), spec
    config = apply_flags(load_config(spec), [a for a in args if a.startswith("--config.")])
    configlib.validate(config, num_devices=1)
    assert config.model.patch_size == 2 and config.num_epochs == 10
    assert config.data.pipeline == "device" and config.data.name == "npz"
    assert config.data.dir == str(npz_dir) and config.data.train_fraction == 1.0


def test_the_helps_rows_run_at_224_px_with_their_teacher(tmp_path):
  # Issue 65's queue item 2: the "Can the agent help?" rows on the paper's ViT-S and Agent-S.
  npz_dir = _blank_npz(tmp_path)
  proc = _launch(tmp_path / "root", 40, npz_dir, TABLE="helps_224", ROWS="agent", DRY="1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  commands = [shlex.split(c) for c in proc.stdout.splitlines() if c.startswith("python -m")]
  assert [r.name for r in sweep_tables.rows("helps_224")] == [
    r.name for r in sweep_tables.rows("helps")
  ]
  assert len(commands) == len(sweep_tables.rows("helps"))
  for args in commands:
    spec = next(a for a in args if a.startswith("--config=")).removeprefix("--config=")
    assert spec.startswith("configs/vits_cifar10.py:mode="), spec
    config = apply_flags(load_config(spec), [a for a in args if a.startswith("--config.")])
    configlib.validate(config, num_devices=1)
    assert (config.image_size, config.model.embed_dim, config.num_epochs) == (224, 288, 40)
    assert config.data.pipeline == "device" and config.data.dir == str(npz_dir)
    if config.agent_frozen:
      assert config.agent_init_from == str(tmp_path / "root" / "agent_seed0")


def test_missing_data_is_one_line_with_the_packing_command(tmp_path):
  proc = _launch(tmp_path / "root", 10, tmp_path / "nowhere")
  assert proc.returncode == 2
  assert "prepare_data folder" in proc.stderr and "--train_fraction=0.1" in proc.stderr


def test_device_pack_sends_back_summaries_and_one_archive_without_checkpoints(tmp_path):
  src = tmp_path / "rung3"
  for name in (
    "table.md",
    "rows.txt",
    "vit.log",
    "vit_seed0/metrics.jsonl",
    "vit_seed0/final.json",
    "vit_seed0/checkpoints/8/state.json",
    "jax_cache/entry.json",
    "npz/train.npz",
  ):
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(name)
  out = tmp_path / "out"
  proc = subprocess.run(
    ["bash", str(REPO / "launch/device_pack.sh"), str(src), str(out)],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  assert sorted(p.name for p in out.iterdir()) == ["rows.txt", "rung3.tar.gz", "table.md"]
  with tarfile.open(out / "rung3.tar.gz") as archive:
    names = sorted(archive.getnames())
  assert names == sorted(
    f"rung3/{n}"
    for n in ("table.md", "rows.txt", "vit.log", "vit_seed0/metrics.jsonl", "vit_seed0/final.json")
  )
  proc = subprocess.run(
    ["bash", str(REPO / "launch/device_pack.sh"), str(tmp_path / "nowhere"), str(out)],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 2 and "is not a folder" in proc.stderr


def test_the_recipe_rows_run_at_224_px_with_their_recipe_teacher(tmp_path):
  # Issue 76's queue item 4: DeiT's recipe on the paper's ViT-S and Agent-S, the agent first.
  npz_dir = _blank_npz(tmp_path)
  proc = _launch(
    tmp_path / "root", 40, npz_dir, TABLE="well_trained_224", ROWS="agent_deit", DRY="1"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  commands = [shlex.split(c) for c in proc.stdout.splitlines() if c.startswith("python -m")]
  assert len(commands) == 4
  for args in commands:
    spec = next(a for a in args if a.startswith("--config=")).removeprefix("--config=")
    assert spec.startswith("configs/vits_cifar10.py:mode=") and spec.endswith("recipe=deit")
    config = apply_flags(load_config(spec), [a for a in args if a.startswith("--config.")])
    configlib.validate(config, num_devices=1)
    assert (config.image_size, config.num_epochs, config.mix.cutmix_alpha) == (224, 40, 1.0)
    if config.agent_frozen:
      assert config.agent_init_from == str(tmp_path / "root" / "agent_deit_seed0")
      assert config.agent.drop_path == 0.0 and config.model.drop_path == 0.1

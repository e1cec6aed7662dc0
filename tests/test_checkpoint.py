"""Tests for vitboot_jax.checkpoint: the checkpointer and the modules it is built from (step_dirs,
failures, reader, checksums): sharded round trip, keep-last-K, kills and corruption, the output
of failures."""

import dataclasses
import json
import os
import re
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vitboot_jax.base import errors, library_logs
from vitboot_jax.checkpoint import checkpointer, checksums, failures, reader
from vitboot_jax.run import workdir_claim, workdir_rules


@pytest.fixture(scope="module")
def mesh():
  return jax.make_mesh((8,), ("data",))


def make_state(mesh, seed=0):
  """A train-state-like pytree: sharded and replicated leaves, a step and both rng kinds."""
  sharded = NamedSharding(mesh, P("data"))
  replicated = NamedSharding(mesh, P())
  base = jnp.arange(64, dtype=jnp.float32).reshape(16, 4) + seed
  return {
    "params": {
      "w": jax.device_put(base, sharded),
      "b": jax.device_put(jnp.full((3,), 0.5 + seed, jnp.bfloat16), replicated),
    },
    "opt_state": {"mu": jax.device_put(base * 2, sharded)},
    "step": jax.device_put(jnp.int32(seed), replicated),
    "rng": jax.device_put(jax.random.key_data(jax.random.key(seed)), replicated),
    "key": jax.random.key(seed + 1),
  }


def abstract_of(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def assert_same(restored, expected):
  assert jax.tree.structure(restored) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
    assert isinstance(got, jax.Array)
    assert got.dtype == want.dtype
    assert got.sharding.is_equivalent_to(want.sharding, want.ndim)
    if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
      got, want = jax.random.key_data(got), jax.random.key_data(want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def snapshot(directory):
  """Every file under `directory` with its bytes, to prove nothing was changed."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, directory)] = f.read()
  return files


def test_round_trip_keeps_values_and_shardings(tmp_path, mesh):
  state = make_state(mesh, seed=3)
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    assert ckpt.restore_latest(abstract_of(state)) is None
    assert ckpt.save(7, state, force=True)
  assert (tmp_path / "checkpoints" / "7" / workdir_rules.COMMIT_MARKER).exists()

  with checkpointer.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 7
    restored, step = ckpt.restore_latest(abstract_of(state))
  assert step == 7
  assert_same(restored, state)
  assert restored["params"]["w"].sharding.spec == P("data")
  assert len(restored["params"]["w"].addressable_shards) == 8


def test_relative_workdir_is_saved_under_the_current_directory(tmp_path, mesh, monkeypatch):
  # `--workdir=runs/x` is what users type; orbax itself only accepts absolute paths.
  monkeypatch.chdir(tmp_path)
  state = make_state(mesh, seed=2)
  with checkpointer.Checkpointer("runs/x") as ckpt:
    assert ckpt.save(5, state, force=True)
  assert (tmp_path / "runs" / "x" / "checkpoints" / "5" / workdir_rules.COMMIT_MARKER).exists()
  with checkpointer.Checkpointer("runs/x") as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(state))
  assert step == 5
  assert_same(restored, state)


def test_restore_reshards_to_the_requested_sharding(tmp_path, mesh):
  state = make_state(mesh)
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state, force=True)
    replicated = NamedSharding(mesh, P())
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state
    )
    restored, _ = ckpt.restore_latest(abstract)
  assert restored["params"]["w"].sharding.is_fully_replicated
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


def test_async_save_survives_donated_buffers(tmp_path, mesh):
  state = make_state(mesh, seed=1)
  expected = jax.tree.map(np.asarray, state["params"])
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    ckpt.save(2, state, force=True)
    # The training loop donates the state to the next step right after saving.
    for leaf in jax.tree.leaves(state):
      leaf.delete()
    ckpt.wait()
    restored, _ = ckpt.restore_latest(abstract_of(make_state(mesh)))
  jax.tree.map(np.testing.assert_array_equal, restored["params"], expected)


def test_save_schedule_and_no_overwrite(tmp_path, mesh):
  state = make_state(mesh)
  with checkpointer.Checkpointer(tmp_path, save_every_steps=2) as ckpt:
    assert not ckpt.save(0, state)
    assert not ckpt.save(3, state)
    assert ckpt.save(4, state)
    assert not ckpt.save(4, make_state(mesh, seed=9), force=True)  # Never overwrites.
    assert ckpt.save(5, state, force=True)
    ckpt.wait()
    assert ckpt.all_steps() == [4, 5]
    restored = ckpt.restore(abstract_of(state), 4)
  assert_same(restored, state)


def test_keeps_only_the_newest_k(tmp_path, mesh):
  with checkpointer.Checkpointer(tmp_path, keep=2, save_every_steps=1) as ckpt:
    for step in range(1, 6):
      ckpt.save(step, make_state(mesh, seed=step))
    ckpt.wait()
    assert ckpt.all_steps() == [4, 5]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "5"]
  with checkpointer.Checkpointer(tmp_path, keep=2) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  assert step == 5
  assert_same(restored, make_state(mesh, seed=5))


def _save_steps(workdir, mesh, steps):
  with checkpointer.Checkpointer(workdir) as ckpt:
    for step in steps:
      ckpt.save(step, make_state(mesh, seed=step), force=True)


def test_killed_save_tmp_dir_is_ignored_then_replaced(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  # A kill mid-save leaves orbax's temporary directory, possibly without the marker.
  shutil.copytree(root / "20", root / "30.orbax-checkpoint-tmp")
  os.remove(root / "30.orbax-checkpoint-tmp" / workdir_rules.COMMIT_MARKER)
  with open(root / "30.orbax-checkpoint-tmp" / "default" / "_METADATA", "w") as f:
    f.write("{ half wri")

  with checkpointer.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 20
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
    assert step == 20
    assert_same(restored, make_state(mesh, seed=20))
    # The resumed run reaches step 30 again and saves it cleanly over the leftover.
    assert ckpt.save(30, make_state(mesh, seed=30), force=True)
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  assert step == 30
  assert_same(restored, make_state(mesh, seed=30))
  assert sorted(os.listdir(root)) == ["10", "20", "30", workdir_rules.INCOMPLETE_SUBDIR]
  assert [p.split("-")[0] for p in os.listdir(root / workdir_rules.INCOMPLETE_SUBDIR)] == [
    "30.orbax"
  ]


def test_step_without_commit_marker_is_moved_aside_and_saved_again(tmp_path, mesh):
  # A kill mid-save can leave `<step>` without the marker; the resumed run reaches that step again.
  _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  shutil.copytree(root / "20", root / "30")
  os.remove(root / "30" / workdir_rules.COMMIT_MARKER)
  before = snapshot(root / "30")
  complete_before = snapshot(root / "20")

  with checkpointer.Checkpointer(tmp_path, keep=2) as ckpt:
    assert ckpt.all_steps() == [10, 20]
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
    assert step == 20
    assert_same(restored, make_state(mesh, seed=20))
    assert ckpt.save(30, make_state(mesh, seed=30), force=True)
  assert sorted(os.listdir(root)) == ["20", "30", workdir_rules.INCOMPLETE_SUBDIR]
  (moved,) = os.listdir(root / workdir_rules.INCOMPLETE_SUBDIR)
  assert moved.startswith("30-")
  assert snapshot(root / workdir_rules.INCOMPLETE_SUBDIR / moved) == before  # Moved, not changed.
  assert snapshot(root / "20") == complete_before
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  assert step == 30
  assert_same(restored, make_state(mesh, seed=30))


def _data_files(step_dir):
  return sorted(
    (p for p in (step_dir / "default").rglob("*") if p.is_file() and "/d/" in str(p)),
    key=lambda p: p.stat().st_size,
  )


def _overwrite_data(step_dir):
  """Bit rot or a bad copy: bytes in the middle of the largest data file, its size unchanged."""
  path = _data_files(step_dir)[-1]
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  data[middle : middle + 64] = np.random.default_rng(0).integers(0, 256, 64, np.uint8).tobytes()
  path.write_bytes(bytes(data))
  return "fails its CRC32 check"


def _truncate_data_files(step_dir):
  for path in _data_files(step_dir):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  return "bytes where the save wrote"


def _garble_metadata(step_dir):
  path = step_dir / "default" / "_METADATA"
  data = bytearray(path.read_bytes())
  data[len(data) // 3 : len(data) // 3 + 8] = b"\xff" * 8
  path.write_bytes(bytes(data))
  return "default/_METADATA fails its CRC32 check"


def _remove_a_file(step_dir):
  os.remove(_data_files(step_dir)[0])
  return "is missing"


def _remove_the_record(step_dir):
  """A deleted record, or a copy that missed it: the step's own metadata says it had one."""
  os.remove(step_dir / checksums.CHECKSUM_FILE)
  return f"its {checksums.CHECKSUM_FILE} is missing, though its save wrote one"


_DAMAGES = [
  _overwrite_data,
  _truncate_data_files,
  _garble_metadata,
  _remove_a_file,
  _remove_the_record,
]


# Orbax's abandoned readers of a failed restore raise "unraisable" errors when collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", _DAMAGES)
def test_damaged_newest_step_is_moved_aside_and_the_previous_one_restored(
  tmp_path, mesh, damage, caplog
):
  _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  assert (root / "20" / checksums.CHECKSUM_FILE).exists()
  expected_cause = damage(root / "20")
  damaged = snapshot(root / "20")
  intact = snapshot(root / "10")

  with caplog.at_level("WARNING"), checkpointer.Checkpointer(tmp_path, keep=2) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
    assert step == 10 and ckpt.all_steps() == [10]
    assert_same(restored, make_state(mesh, seed=10))
    assert ckpt.save(20, make_state(mesh, seed=21), force=True)  # The resumed run saves it anew.
  (moved,) = os.listdir(root / workdir_rules.DAMAGED_SUBDIR)
  assert moved.startswith("20-")
  assert snapshot(root / workdir_rules.DAMAGED_SUBDIR / moved) == damaged  # Moved, never changed.
  assert snapshot(root / "10") == intact
  (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warning.startswith("Checkpoint step 20 is damaged (") and expected_cause in warning
  assert str(root / workdir_rules.DAMAGED_SUBDIR / moved) in warning and "\n" not in warning
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  assert step == 20
  assert_same(restored, make_state(mesh, seed=21))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_every_step_damaged_is_one_error_naming_them_and_a_rerun_starts_afresh(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  _overwrite_data(root / "20")
  _remove_a_file(root / "10")
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(failures.DamagedCheckpointsError) as info:
      ckpt.restore_latest(abstract_of(make_state(mesh)))
  message = str(info.value)
  assert "\n" not in message and isinstance(info.value, errors.UsageError)  # main: exit 2.
  assert f"No checkpoint in {root} is intact" in message
  assert "step 20 (" in message and "step 10 (" in message and "is missing" in message
  assert "Re-run the same command to train from step 0" in message
  assert sorted(n.split("-")[0] for n in os.listdir(root / workdir_rules.DAMAGED_SUBDIR)) == [
    "10",
    "20",
  ]
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    assert ckpt.restore_latest(abstract_of(make_state(mesh))) is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_read_only_reader_refuses_a_damaged_step_by_name_and_moves_nothing(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  _overwrite_data(root / "20")
  before = snapshot(root)
  with checkpointer.Checkpointer(tmp_path, read_only=True) as ckpt:
    with pytest.raises(failures.CorruptCheckpointError) as info:
      ckpt.restore_latest(abstract_of(make_state(mesh)))
  message = str(info.value)
  assert message.startswith(f"Checkpoint {root / '20'} (step 20) is damaged: default/")
  assert "fails its CRC32 check" in message and "Nothing was changed" in message
  assert f"Move it into {root / workdir_rules.DAMAGED_SUBDIR}/ to use step 10" in message
  assert "\n" not in message
  assert snapshot(root) == before


def test_checksums_cover_every_file_of_the_save(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10])
  step_dir = tmp_path / "checkpoints" / "10"
  record = json.loads((step_dir / checksums.CHECKSUM_FILE).read_text())
  written = {
    str(p.relative_to(step_dir))
    for p in (step_dir / "default").rglob("*")
    if p.is_file() and p.name != workdir_rules.COMMIT_MARKER  # The item's marker comes after.
  }
  assert set(record["files"]) == written and record["algorithm"] == "crc32"
  assert checksums.verify(step_dir) is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_reader_refuses_a_step_whose_record_is_gone_by_name(tmp_path, mesh):
  """Every read-only path: the tools' Checkpointer, stored_tree (export, adam_state) and
  init_from / agent_init_from."""
  from vitboot_jax import init_from

  tiny = {"params": {"vit": {"w": np.ones(3, np.float32)}, "agent": {"k": np.ones(2, np.float32)}}}
  tiny["batch_stats"] = {"agent": {"mean": np.zeros(2, np.float32)}}
  with checkpointer.Checkpointer(tmp_path, async_save=False) as ckpt:
    for step in (10, 20):
      ckpt.save(step, tiny, force=True)
  root = tmp_path / "checkpoints"
  cause = _remove_the_record(root / "20")
  before = snapshot(root)

  def read_only():
    with checkpointer.Checkpointer(tmp_path, read_only=True) as ckpt:
      ckpt.restore_latest(tiny)

  for read in (
    read_only,
    lambda: reader.stored_tree(root / "20"),
    lambda: init_from.read_orbax_vit(str(tmp_path)),
    lambda: init_from.read_orbax_agent(str(root)),
  ):
    with pytest.raises(failures.CorruptCheckpointError) as info:
      read()
    message = str(info.value)
    assert message.startswith(f"Checkpoint {root / '20'} (step 20) is damaged: {cause}")
    assert "Nothing was changed" in message and "to use step 10" in message and "\n" not in message
  assert snapshot(root) == before


def _saved_before_records(monkeypatch):
  """Saves as versions before checksums did: no record and no flag in the item's metadata."""
  plain = ocp.StandardCheckpointHandler
  monkeypatch.setattr(checksums.ChecksummedHandler, "async_save", plain.async_save)
  monkeypatch.setattr(checksums.ChecksummedHandler, "finalize", plain.finalize)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", [None, _truncate_data_files])
def test_steps_saved_before_checksums_restore_unverified(
  tmp_path, mesh, damage, caplog, monkeypatch
):
  """Workdirs of earlier versions: no record, a warning; files that fail to read are damage."""
  with monkeypatch.context() as old_version:
    _saved_before_records(old_version)
    _save_steps(tmp_path, mesh, [10, 20])
  root = tmp_path / "checkpoints"
  assert not (root / "20" / checksums.CHECKSUM_FILE).exists()
  if damage:
    damage(root / "20")
  with caplog.at_level("WARNING"), checkpointer.Checkpointer(tmp_path) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  unverified = f"has no {checksums.CHECKSUM_FILE}: it was saved before checkpoints recorded"
  if damage is None:
    assert step == 20 and len(warnings) == 1
    assert warnings[0].startswith(f"Checkpoint {root / '20'} {unverified}")
    assert_same(restored, make_state(mesh, seed=20))
  else:
    assert step == 10 and len(warnings) == 2  # Step 20's metadata fails to read: damage.
    assert warnings[0].startswith("Checkpoint step 20 is damaged (")
    assert warnings[1].startswith(f"Checkpoint {root / '10'} {unverified}")
    assert os.listdir(root / workdir_rules.DAMAGED_SUBDIR)[0].startswith("20-")


def test_changed_state_is_a_mismatch_not_corruption(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10])
  state = make_state(mesh)
  state["params"]["w"] = jax.device_put(
    jnp.zeros((8, 4)), NamedSharding(mesh, P("data"))
  )  # A different model width.
  state["params"]["extra"] = jnp.zeros(2)
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(failures.CheckpointMismatchError) as info:
      ckpt.restore_latest(abstract_of(state))
  message = str(info.value)
  assert "params/w: stored (16, 4) vs wanted (8, 4)" in message
  assert "not in checkpoint: params/extra" in message
  assert "key:" not in message  # A typed key is stored as its key data, not a mismatch.
  assert "delete the directory" not in message
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10"]


def test_steps_to_read_resolves_numbers_and_last(tmp_path, mesh, monkeypatch):
  _save_steps(tmp_path / "run", mesh, [2, 4, 6])
  (tmp_path / "run" / "checkpoints" / "8").mkdir()  # An unfinished save is not a step.
  monkeypatch.chdir(tmp_path)
  root, steps = reader.steps_to_read("run")
  assert (root, steps) == (tmp_path / "run", [2, 4, 6])
  assert reader.steps_to_read("run", ["last"])[1] == [6]
  assert reader.steps_to_read("run", ["4", "last", 2])[1] == [2, 4, 6]
  with pytest.raises(
    errors.UsageError, match=r"no checkpoint of step\(s\) \[8\]; it has \[2, 4, 6\]"
  ):
    reader.steps_to_read("run", ["8"])
  with pytest.raises(errors.UsageError, match="'newest' is not a step; give step numbers or last"):
    reader.steps_to_read("run", ["newest"])
  with pytest.raises(errors.UsageError, match="has no complete checkpoint"):
    reader.steps_to_read("elsewhere", ["last"])


def test_what_we_take_from_orbax_is_still_there():
  """Orbax's step layout and the public calls the Checkpointer relies on: an orbax upgrade that
  changes one fails here, by name, before any run misreads a workdir."""
  assert workdir_rules.COMMIT_MARKER == ocp.path.atomicity_types.COMMIT_SUCCESS_FILE
  assert ocp.step.TMP_DIR_SUFFIX == ".orbax-checkpoint-tmp"  # The name our tests fake.
  for name in ("is_saving_in_progress", "wait_until_finished", "item_metadata", "reload"):
    assert callable(getattr(ocp.CheckpointManager, name, None)), name
  assert "custom_metadata" in {f.name for f in dataclasses.fields(ocp.args.StandardSave)}


def test_argument_validation(tmp_path):
  with pytest.raises(ValueError, match="keep"):
    checkpointer.Checkpointer(tmp_path, keep=0)
  with pytest.raises(ValueError, match="save_every_steps"):
    checkpointer.Checkpointer(tmp_path, save_every_steps=0)


def test_unrestorable_sharding_is_not_called_corruption(tmp_path, mesh):
  # One leaf only: with more, orbax leaves the other leaves' readers pending after the error.
  state = {"b": jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))}
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    ckpt.save(10, state, force=True)
  # 3 elements cannot be split over 8 devices: a bug in the caller, not in the files.
  abstract = {"b": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=NamedSharding(mesh, P("data")))}
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(failures.CheckpointError) as info:
      ckpt.restore_latest(abstract)
  assert not isinstance(info.value, failures.CorruptCheckpointError)
  assert "is intact" in str(info.value) and "delete the directory" not in str(info.value)


def test_two_checkpointers_cannot_overwrite_a_complete_step(tmp_path, mesh):
  first = checkpointer.Checkpointer(tmp_path)
  # Opened before the first saved: orbax's list is empty.
  second = checkpointer.Checkpointer(tmp_path)
  assert first.save(5, make_state(mesh, seed=1), force=True)
  first.wait()
  saved = snapshot(tmp_path / "checkpoints" / "5")
  assert not second.save(5, make_state(mesh, seed=2), force=True)
  second.wait()
  assert snapshot(tmp_path / "checkpoints" / "5") == saved
  # Another writer's save in progress (orbax's temporary directory) is neither replaced nor moved.
  in_progress = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp"
  (in_progress / "default").mkdir(parents=True)
  with pytest.raises(failures.CheckpointSaveError, match="another writer") as info:
    second.save(6, make_state(mesh, seed=2), force=True)
  assert "\n" not in str(info.value)
  assert in_progress.is_dir()
  first.close()
  second.close()
  with checkpointer.Checkpointer(tmp_path, read_only=True) as ckpt:
    restored, step = ckpt.restore_latest(abstract_of(make_state(mesh)))
  assert step == 5
  assert_same(restored, make_state(mesh, seed=1))


def test_read_only_and_unclaimed_checkpointers_move_nothing(tmp_path, mesh):
  _save_steps(tmp_path, mesh, [10])
  root = tmp_path / "checkpoints"
  (root / "20.orbax-checkpoint-tmp" / "default").mkdir(parents=True)  # A live run's save.
  with checkpointer.Checkpointer(tmp_path, read_only=True) as ckpt:
    assert ckpt.latest_step() == 10
    with pytest.raises(failures.CheckpointError, match="read-only"):
      ckpt.save(11, make_state(mesh), force=True)
  assert sorted(os.listdir(root)) == ["10", "20.orbax-checkpoint-tmp"]
  # A live run elsewhere holds the workdir: a Checkpointer opened beside it moves nothing either.
  host = "other-host"
  claim = {"host": host, "pid": 1, "started": 0, "heartbeat": time.time(), "token": "x"}
  (tmp_path / workdir_claim.CLAIM_FILE).write_text(json.dumps(claim))
  with checkpointer.Checkpointer(tmp_path):
    pass
  assert sorted(os.listdir(root)) == ["10", "20.orbax-checkpoint-tmp"]


def test_every_process_raises_the_failure_of_the_first_process_that_had_one(monkeypatch):
  """`_agreed` as process 1 of 3, the key-value exchange faked: the first failure in process
  order comes back on every process with its type, message, step and cause."""
  from vitboot_jax import sharding

  monkeypatch.setattr(jax, "process_count", lambda: 3)

  def published(error):  # What a process with `error` puts into the exchange.
    seen = []
    monkeypatch.setattr(sharding, "exchange", lambda name, value: seen.append(value) or [value])
    failures.agreed("x", error)
    return seen[0]

  def agreed_as_process_1(mine, first="", third=""):
    monkeypatch.setattr(sharding, "exchange", lambda name, value: [first, value, third])
    return failures.agreed("x", mine)

  corrupt = failures.CorruptCheckpointError
  damaged = corrupt("step 8 is damaged", step=8, cause="DATA_LOSS: x")
  got = agreed_as_process_1(None, third=published(damaged))
  assert type(got) is corrupt
  assert (str(got), got.step, got.cause) == ("step 8 is damaged", 8, "DATA_LOSS: x")
  full = failures.CheckpointSaveError("disk full")
  assert agreed_as_process_1(full) is full
  skip = agreed_as_process_1(full, first=published(failures.AlreadySaved("4")))
  assert type(skip) is failures.AlreadySaved  # Process 0's verdict wins: every process skips.
  busy = agreed_as_process_1(None, first=published(workdir_claim.WorkdirBusyError("taken")))
  assert isinstance(busy, errors.UsageError) and str(busy) == "taken"
  assert agreed_as_process_1(None) is None


def test_any_save_failure_is_one_checkpoint_save_error(tmp_path, mesh, monkeypatch):
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(5, make_state(mesh), force=True)
    ckpt.wait()

    def failing_save(*args, **kwargs):  # What tensorstore raises on a vanished temporary dir.
      raise ValueError('NOT_FOUND: Error opening "zarr" driver:\n{"kvstore": ...}\n[source...]')

    monkeypatch.setattr(ckpt._manager, "save", failing_save)
    with pytest.raises(failures.CheckpointSaveError) as info:
      ckpt.save(10, make_state(mesh), force=True)
  message = str(info.value)
  assert "\n" not in message
  assert f"Saving step 10 under {tmp_path / 'checkpoints'} failed: ValueError: NOT_FOUND" in message
  assert "newest complete checkpoint (step 5), which is intact" in message


@pytest.mark.slow
def test_checkpoint_cost_benchmark_prints_every_field(tmp_path):
  from tests.config_files import load_config
  from vitboot_jax.tools.perf import checkpoint_cost

  lines = checkpoint_cost.measure(load_config("tiny_config", "mode=vit"), 1, 1, str(tmp_path))
  assert [json.loads(json.dumps(line)) for line in lines] == lines  # Each prints as JSON.
  head, *variants, verify, summary = lines
  assert head["files"] > 1 and head["step_dir_bytes"] >= head["state_bytes"] // 2
  assert [v["variant"] for v in variants] == list(checkpoint_cost.VARIANTS)
  for v in variants:
    assert all(v[k] > 0 for k in ("save_call_s", "finalize_s", "save_total_s", "restore_s"))
  assert verify["verify_s"] > 0 and "added_finalize_s" in summary["summary"]
  assert os.listdir(tmp_path) == []  # Every trial's directory is removed.


@pytest.fixture
def console(monkeypatch, capsys):
  """What absl's handler prints (main's and the tools' console), from library_logs' fresh start."""
  import logging

  from absl import logging as absl_logging

  class Console:
    text = ""

    def getvalue(self):  # Before absl's flags are parsed (as here) it prints to stderr.
      self.text += capsys.readouterr().err
      return self.text

  monkeypatch.setattr(library_logs, "_FAILURES", library_logs._HeldFailures())
  monkeypatch.setattr(logging.getLogger(), "handlers", [absl_logging.get_absl_handler()])
  library_logs.quiet_library_failures()
  return Console()


def _orbax_error(message):
  """An ERROR record as orbax's code logs it (through absl, from a file of orbax's)."""
  import logging

  path = "/site-packages/orbax/checkpoint/_src/futures/future.py"
  logging.getLogger("absl").handle(
    logging.LogRecord("absl", logging.ERROR, path, 1, message, (), None)
  )


def test_orbax_errors_are_quiet_only_inside_a_save_or_restore_that_reports_them(
  tmp_path, mesh, console, monkeypatch
):
  _orbax_error("unrelated: outside any save")
  assert console.getvalue().count("unrelated: outside any save") == 1
  with checkpointer.Checkpointer(tmp_path) as ckpt:
    plain_save = ckpt._manager.save

    def logging_save(*args, **kwargs):
      _orbax_error("logged during a save that succeeds")
      return plain_save(*args, **kwargs)

    monkeypatch.setattr(ckpt._manager, "save", logging_save)
    assert ckpt.save(1, make_state(mesh), force=True)
    deadline = time.time() + 60
    while "during a save that succeeds" not in console.getvalue() and time.time() < deadline:
      ckpt.should_save(2)  # The loop's call: it learns that the background save is done.
      time.sleep(0.01)
    assert console.getvalue().count("logged during a save that succeeds") == 1  # Shown, once.

    def failing_save(*args, **kwargs):
      _orbax_error("orbax's own account of the failure")
      raise ValueError("NOT_FOUND: injected")

    monkeypatch.setattr(ckpt._manager, "save", failing_save)
    with pytest.raises(failures.CheckpointSaveError, match="NOT_FOUND: injected"):
      ckpt.save(2, make_state(mesh), force=True)
  assert "orbax's own account" not in console.getvalue()  # Said once: in our error.
  _orbax_error("unrelated: after the failure")
  assert "unrelated: after the failure" in console.getvalue()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("done_before_save_returns", [False, True])
def test_a_failed_background_save_is_said_once_and_at_once(
  tmp_path, mesh, console, monkeypatch, done_before_save_returns
):
  """Orbax's own records of a failed background write (its thread's and its wait's) are
  dropped: our error says it, by the loop's next call, however soon the write failed."""
  import errno

  def full_disk(self, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))

  monkeypatch.setattr(checksums.ChecksummedHandler, "finalize", full_disk)
  ckpt = checkpointer.Checkpointer(tmp_path)
  if done_before_save_returns:  # A small state on a full disk: the write fails at once.
    plain_save = ckpt._manager.save

    def save_and_finish(*args, **kwargs):
      saved = plain_save(*args, **kwargs)
      while ckpt._manager.is_saving_in_progress():
        time.sleep(0.01)
      return saved

    monkeypatch.setattr(ckpt._manager, "save", save_and_finish)
  with pytest.raises(failures.CheckpointSaveError, match="No space left on device"):
    ckpt.save(1, make_state(mesh), force=True)
    deadline = time.time() + 60
    while time.time() < deadline:
      ckpt.should_save(2)
      if done_before_save_returns:
        break  # It was raised by now, or never is.
      time.sleep(0.01)
  assert "Traceback" not in console.getvalue()
  assert not re.findall(r"^E\d{4} .*", console.getvalue(), re.MULTILINE)
  _orbax_error("unrelated: after the failure")
  assert "unrelated: after the failure" in console.getvalue()


def test_library_failure_chatter_is_held_back_unless_debugging(monkeypatch):
  import logging
  import sys

  from absl import logging as absl_logging

  monkeypatch.setattr(library_logs, "_FAILURES", library_logs._HeldFailures())

  def record(path, level, msg, name="absl"):
    return logging.LogRecord(name, level, path, 1, msg, None, None)

  def unraisable(error):
    """What the interpreter hands its hook for an exception raised in a finaliser."""
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", caught.append)

    class Finalised:
      def __del__(self):
        raise error

    Finalised()
    monkeypatch.undo()
    monkeypatch.setattr(library_logs, "_FAILURES", failures)
    return caught[0]

  failures = library_logs._FAILURES
  quiet = library_logs._QuietLibraryFailures()
  orbax_file = "/site-packages/orbax/checkpoint/_src/futures/future.py"
  orbax_error = record(orbax_file, logging.ERROR, "_SignalingThread.run() raised")
  never = record(
    "/asyncio/base_events.py", logging.ERROR, "Future exception was never retrieved", "asyncio"
  )
  seen = []
  hook = library_logs._quiet_unraisable_hook(seen.append)
  closed = unraisable(RuntimeError("Event loop is closed"))
  other = unraisable(ValueError("ours"))
  # Outside our calls, with nothing reported: everything shows.
  assert quiet.filter(orbax_error) and quiet.filter(never)
  hook(closed)
  hook(other)
  assert seen == [closed, other]
  # Inside one: held; a failure reported drops them, and later leftovers (collected futures and
  # coroutines) stay quiet while orbax's own errors show again.
  library_logs.hold_library_failures()
  assert not quiet.filter(orbax_error) and not quiet.filter(never)
  assert quiet.filter(record(orbax_file, logging.WARNING, "a warning stays"))
  assert quiet.filter(record("/vitboot_jax/main.py", logging.ERROR, "our own line"))
  hook(closed)
  library_logs.settle_library_failures(reported=True)
  assert seen == [closed, other]
  assert quiet.filter(orbax_error) and not quiet.filter(never)
  hook(closed)
  hook(other)
  assert seen == [closed, other, other]
  monkeypatch.setattr(absl_logging, "level_debug", lambda: True)  # --verbosity=1 shows all.
  assert quiet.filter(never)
  hook(closed)
  assert seen == [closed, other, other, closed]
  assert sys.unraisablehook is not hook  # Building the hook installs nothing.


def test_what_a_call_held_shows_when_it_succeeds(monkeypatch):
  import logging
  import sys

  monkeypatch.setattr(library_logs, "_FAILURES", library_logs._HeldFailures())
  shown = []
  monkeypatch.setattr(sys, "unraisablehook", library_logs._quiet_unraisable_hook(shown.append))
  from absl import logging as absl_logging

  monkeypatch.setattr(absl_logging.get_absl_handler(), "handle", shown.append)
  error = logging.LogRecord("absl", logging.ERROR, "/orbax/x.py", 1, "held", None, None)
  with library_logs.library_failures_held():
    assert not library_logs._QuietLibraryFailures().filter(error)
    with library_logs.library_failures_held():  # Nested: shown once the outer call ends too.
      pass
    assert shown == []
  assert shown == [error]

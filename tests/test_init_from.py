"""config.init_from: the ViT of a fresh run comes from a checkpoint, in every mode with a ViT."""

import functools

import jax
import numpy as np
import pytest

from tests.config_files import load_config
from vitboot_jax import init_from, kernel_sets, optim, sharding
from vitboot_jax.models.build import build_models
from vitboot_jax.state import create_state


def _config(arg):
  return load_config("tiny_config", arg)


def _fresh_state(config):
  models = build_models(config, kernel_sets.for_config(config))
  tx, _ = optim.mode_optimizer(config, models.names, steps_per_epoch=10)
  init = functools.partial(create_state, models, tx, image_shape=(32, 32, 3))
  state = jax.jit(init)(jax.random.key(0))
  shardings = jax.tree.map(lambda _: sharding.replicated(sharding.make_mesh()), state)
  return state, models, tx, shardings


def _flat(tree):
  return {
    "/".join(str(k.key) for k in path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


@pytest.mark.parametrize("mode", ["vit", "joint", "shared"])
@pytest.mark.slow
def test_initialise_replaces_only_the_vit(mode, tmp_path):
  config = _config(f"mode={mode}")
  state, models, tx, shardings = _fresh_state(config)
  source = {k: v + 1.0 for k, v in _flat(state.params["vit"]).items()}
  np.savez(tmp_path / "vit.npz", **{"params/vit/" + k: v for k, v in source.items()})
  config.init_from = str(tmp_path / "vit.npz")
  new = init_from.initialise(state, config, tx, shardings)
  got = _flat(new.params["vit"])
  assert got.keys() == source.keys()
  for key, value in source.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  jax.tree.map(np.testing.assert_array_equal, new.params.get("agent"), state.params.get("agent"))
  if mode == "shared":  # The agent reads the ViT's (imported) weights: its logits change.
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
    agent_logits = jax.jit(
      lambda s: models.apply(
        {"params": s.params, "batch_stats": s.batch_stats}, images, train=False, names=("agent",)
      )[0]["agent"][0]
    )
    assert not np.allclose(agent_logits(state), agent_logits(new))


@pytest.mark.parametrize(
  "arg, init_from_value, message",
  [
    ("mode=agent", "x.npz", "mode 'agent' trains none"),
    ("mode=vit,init=mimetic", "x.npz", "config.model.init='mimetic' would be overwritten"),
  ],
)
@pytest.mark.slow
def test_initialise_refuses_what_it_cannot_do(arg, init_from_value, message):
  config = _config(arg)
  state, models, tx, shardings = _fresh_state(config)
  config.init_from = init_from_value
  with pytest.raises(ValueError, match=message):
    init_from.initialise(state, config, tx, shardings)


@pytest.mark.slow
def test_fine_tune_run_starts_from_a_pre_training_run(tmp_path, monkeypatch):
  """Pre-train, then a run with init_from=that workdir and lr 0: the ViT it trains and
  checkpoints is exactly the pre-trained one (train.py's hook; the modes are tested above)."""
  import tensorflow_datasets as tfds

  from vitboot_jax import train
  from vitboot_jax.checkpoint import checkpointer
  from vitboot_jax.data import prepare

  # tfds mock data swaps the filesystem process-wide: save synchronously (see test_train.py).
  monkeypatch.setattr(
    train.checkpointer,
    "Checkpointer",
    functools.partial(checkpointer.Checkpointer, async_save=False),
  )
  # mock_data's download_and_prepare is a no-op; the network probe before it would fail offline.
  monkeypatch.setattr(prepare, "_reachable", lambda host: True)
  pre = _config("data=cifar10,mode=vit")
  pre.total_steps = 2
  fine = _config("data=cifar10,mode=vit")
  fine.total_steps = 1
  fine.optim.lr = 0.0
  fine.init_from = str(tmp_path / "pre")
  with tfds.testing.mock_data(num_examples=32):
    train.train_and_evaluate(pre, str(tmp_path / "pre"))
    train.train_and_evaluate(fine, str(tmp_path / "fine"))
  want = _flat(init_from.read_orbax_vit(str(tmp_path / "pre")))
  got = _flat(init_from.read_orbax_vit(str(tmp_path / "fine" / "checkpoints")))
  assert got.keys() == want.keys()
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_orbax_reader_takes_a_workdir_its_checkpoints_or_one_step(tmp_path):
  from vitboot_jax.checkpoint import checkpointer

  vit = {"pos_embed": np.arange(6, dtype=np.float32).reshape(1, 3, 2)}
  with checkpointer.Checkpointer(tmp_path / "run", async_save=False) as ckpt:
    ckpt.save(2, {"params": {"vit": jax.tree.map(lambda x: x - 1, vit)}, "step": 2}, force=True)
    ckpt.save(5, {"params": {"vit": vit}, "step": 5}, force=True)
  with checkpointer.Checkpointer(tmp_path / "agent_run", async_save=False) as ckpt:
    ckpt.save(1, {"params": {"agent": vit}}, force=True)
  (tmp_path / "run" / "checkpoints" / "7").mkdir()  # A save cut short: no commit marker.
  for path in ("run", "run/checkpoints", "run/checkpoints/5"):
    got = init_from.read_orbax_vit(str(tmp_path / path))
    np.testing.assert_array_equal(got["pos_embed"], vit["pos_embed"])
  got = init_from.read_orbax_vit(str(tmp_path / "run/checkpoints/2"))
  np.testing.assert_array_equal(got["pos_embed"], vit["pos_embed"] - 1)
  with pytest.raises(ValueError, match="has no ViT .*mode agent or cnn"):
    init_from.read_vit_params(str(tmp_path / "agent_run"))


# ---------------------------------------------------------------------------------------------
# The sources of a fresh run, checked at start-up from their files alone (startup.py).


def _run_dir(root, mode, step, *, finished=True, steps_per_epoch=10, older=(), **fields):
  """A run's directory as start-up sees it: config.json, data.json, complete steps (`older` and
  `step`) and, if `finished`, final.json at `step` (no arrays: start-up reads none)."""
  import json

  from vitboot_jax.run import workdir_rules

  config = _config(f"mode={mode}")
  for field, value in fields.items():
    block, name = field.rsplit(".", 1) if "." in field else (None, field)
    (config[block] if block else config)[name] = value
  root.mkdir(parents=True)
  (root / workdir_rules.CONFIG_FILE).write_text(config.to_json_best_effort())
  (root / workdir_rules.DATA_FILE).write_text(json.dumps({"steps_per_epoch": steps_per_epoch}))
  for saved in (*older, step):
    step_dir = root / workdir_rules.CHECKPOINT_SUBDIR / str(saved)
    step_dir.mkdir(parents=True)
    (step_dir / workdir_rules.COMMIT_MARKER).write_text("")
  if finished:
    (root / workdir_rules.FINAL_FILE).write_text(json.dumps({"step": step}))
  return root


def _student(**sources):
  config = _config("mode=joint")
  config.update(sources)
  return config


TEACHER = r"teacher= \(config.agent_init_from\)="


@pytest.mark.parametrize(
  "make, field, message",
  [
    (
      None,
      "agent_init_from",
      TEACHER + r".*: no such file or directory; give the workdir of a run "
      "of mode agent or joint",
    ),
    (
      None,
      "init_from",
      r"config.init_from=.*: no such file or directory; give a "
      r".safetensors/.npz/.pth file or the workdir of a run of mode vit, joint or shared",
    ),
    (
      "vit",
      "agent_init_from",
      TEACHER + r".* is a run of mode 'vit', which has no agent; give "
      "the workdir of a run of mode agent or joint",
    ),
    ("agent", "init_from", r"config.init_from=.* is a run of mode 'agent', which has no ViT"),
    ("empty", "agent_init_from", TEACHER + r".* holds no complete checkpoint"),
    ("file", "agent_init_from", TEACHER + r".* is a file, not a workdir of ours"),
  ],
)
def test_a_source_that_cannot_give_its_model_is_refused_at_start_up(tmp_path, make, field, message):
  from vitboot_jax.base import errors
  from vitboot_jax.run import startup

  path = tmp_path / "source"
  if make == "empty":
    path.mkdir()
  elif make == "file":
    path.write_text("not a run")
  elif make:
    _run_dir(path, make, 8)
  with pytest.raises(errors.ConfigError, match=message):
    startup.source_warnings(_student(**{field: str(path)}))


def test_a_finished_teacher_of_this_recipe_and_a_weights_file_start_silently(tmp_path):
  from vitboot_jax.run import startup

  teacher = _run_dir(tmp_path / "teacher", "agent", 30)
  weights = tmp_path / "vit.npz"
  np.savez(weights, x=np.zeros(1))
  for path in (teacher, teacher / "checkpoints", teacher / "checkpoints" / "30"):
    config = _student(agent_init_from=str(path), init_from=str(weights))
    assert startup.source_warnings(config) == []
  # recipe=deit's teacher trained with drop path; its frozen student runs it without.
  deit = _run_dir(tmp_path / "deit", "agent", 30, **{"agent.drop_path": 0.1})
  assert startup.source_warnings(_student(agent_init_from=str(deit))) == []


def test_an_unfinished_teacher_and_one_of_another_recipe_are_read_with_a_warning(tmp_path):
  from vitboot_jax.run import startup

  killed = _run_dir(tmp_path / "killed", "agent", 6, finished=False, num_epochs=3)
  (warning,) = startup.source_warnings(_student(agent_init_from=str(killed)))
  assert warning.startswith(f"teacher= (config.agent_init_from)={killed} is read at step 6 of 30:")
  assert "it never finished (no final.json)" in warning and "part-trained" in warning
  finished = _run_dir(tmp_path / "finished", "joint", 8, older=(4,))
  (warning,) = startup.source_warnings(_student(init_from=str(finished / "checkpoints" / "4")))
  assert warning.startswith(f"config.init_from={finished}/checkpoints/4 is read at step 4 of 8:")
  assert "not its final step, so the ViT starts from a part-trained run" in warning

  other = _run_dir(tmp_path / "other", "agent", 30, **{"agent.stem": "small_full"})
  (warning,) = startup.source_warnings(_student(agent_init_from=str(other)))
  assert f"{other} (step 30) is a run of another recipe: agent.stem: 'small_full' -> 'small'" in (
    warning
  )
  assert "read as it is" in warning and "mode=agent" in warning


def test_the_agent_recipe_names_the_fields_the_agent_is_built_from():
  from vitboot_jax.models import build
  from vitboot_jax.run import startup

  model_fields = {f.removeprefix("model.") for f in startup.AGENT_RECIPE if f.startswith("model.")}
  assert model_fields == set(build.VIT_SHAPE)


def test_start_up_checks_a_fresh_runs_sources_only(tmp_path, caplog, image_folder):
  from vitboot_jax.base import errors
  from vitboot_jax.run import startup

  killed = _run_dir(tmp_path / "killed", "agent", 6, finished=False)
  config = _student(agent_init_from=str(killed))
  config.data.dir = str(image_folder)
  workdir = tmp_path / "student"
  with caplog.at_level("WARNING"):
    assert startup.check(config, workdir, single_process=True) is None
  assert "is read at step 6" in caplog.text
  assert not workdir.exists()  # Nothing written.
  config.agent_init_from = str(tmp_path / "gone")
  with pytest.raises(errors.ConfigError, match="no such file or directory"):
    startup.check(config, workdir, single_process=True)
  fields = {"agent_init_from": config.agent_init_from, "data.dir": config.data.dir}
  _run_dir(workdir, "joint", 4, finished=False, **fields)
  assert startup.check(config, workdir, single_process=True) is None  # A resume reads none.


def test_a_missing_teacher_is_one_line_before_anything_is_written(tmp_path, image_folder):
  import subprocess

  from tests.runs import TINY, command, env

  workdir = tmp_path / "student"
  config = f"{TINY}:mode=joint,teacher={tmp_path / 'no_such_run'}"
  proc = subprocess.run(
    command(workdir, image_folder, config=config), env=env(1), capture_output=True, text=True
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
  assert line.startswith(f"error: teacher= (config.agent_init_from)={tmp_path / 'no_such_run'}:")
  assert "give the workdir of a run of mode agent or joint" in line
  assert not workdir.exists()


@pytest.mark.slow
def test_a_part_trained_teacher_of_another_recipe_is_recorded_in_the_students_config(
  tmp_path, image_folder
):
  """A teacher stopped at step 5 of 30 and a student whose agent's dropout differs: it trains,
  and its config.json says from what."""
  import json
  import signal

  from tests import runs

  teacher = tmp_path / "teacher"
  watched = runs.WatchedRun(
    teacher, image_folder, runs.after_step(5), sig=signal.SIGTERM, config=f"{runs.TINY}:mode=agent"
  )
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  step = max(int(p.name) for p in (teacher / "checkpoints").iterdir() if p.name.isdigit())
  student = tmp_path / "student"
  config = f"{runs.TINY}:mode=joint,teacher={teacher}"
  overrides = ("--config.total_steps=2", "--config.agent.residual_dropout=0.1")
  proc = runs.run(student, image_folder, *overrides, config=config)
  recorded = json.loads((student / "config.json").read_text())["source_warnings"]
  assert len(recorded) == 2, recorded
  assert f"is read at step {step} of 30: it never finished" in recorded[0]
  assert "another recipe: agent.residual_dropout: 0.0 -> 0.1" in recorded[1]
  assert all(warning in proc.stderr for warning in recorded)


@pytest.mark.parametrize(
  "read, flag",
  [
    (init_from.read_orbax_vit, "config.init_from"),
    (init_from.read_orbax_agent, "config.agent_init_from"),
  ],
)
def test_a_directory_without_a_checkpoint_names_the_flag_that_gave_it(tmp_path, read, flag):
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(FileNotFoundError, match=f"^{flag}="):
    read(str(tmp_path))

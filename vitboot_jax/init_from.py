"""`config.init_from`: start training with the ViT's weights read from a pre-trained checkpoint.

Formats (by path): a timm/DeiT `.safetensors` file (read with safetensors' numpy API, no torch),
an `.npz` (timm, official or our flattened names), a PyTorch `.pth`/`.pt`/`.bin` (needs torch;
`python -m vitboot_jax.tools.convert_checkpoint --input=IN.pth --output=OUT.safetensors` converts
it once), or a run of ours: its workdir, its `checkpoints/` directory or one `checkpoints/<step>`
(the ViT's parameters of the newest complete step). Names and shapes are handled by
models/pretrained.py.

`config.agent_init_from` (a joint-mode variant of the mechanism study) starts the agent from a run
of ours the same way: its parameters and BatchNorm statistics, which must match the config's agent
exactly (same shapes: a run of the same agent recipe, e.g. mode agent); with config.cnn.name, the
CNN in the agent's place from a mode-cnn run of that CNN (a CNN teacher).

Only a fresh run imports: a workdir that holds a checkpoint resumes from it instead.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from etils import epath

from vitboot_jax.checkpoint import reader, step_dirs
from vitboot_jax.models import attention_init, pretrained
from vitboot_jax.run import workdir_rules
from vitboot_jax.state import TrainState

TORCH_SUFFIXES = (".pth", ".pt", ".bin")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """The flat {name: array} of a weights file (safetensors, npz or, with torch, a .pth)."""
  p = epath.Path(path)
  if not p.exists():
    raise FileNotFoundError(
      f"config.init_from={path}: no such file or directory; give a .safetensors/.npz/.pth file "
      "or a workdir of ours"
    )
  suffix = p.suffix.lower()
  if suffix in (".safetensors", ".npz"):
    try:
      return _read_numpy_file(str(p), suffix)
    except Exception as error:  # A truncated or mislabelled file: say which and what to do.
      raise ValueError(
        f"config.init_from={path} cannot be read as {suffix} ({type(error).__name__}: "
        f"{str(error)[:200]}); is the download complete and the suffix right?"
      ) from error
  if suffix in TORCH_SUFFIXES:
    try:
      return pretrained.read_torch_state_dict(str(p))
    except ModuleNotFoundError as error:
      if error.name != "torch":
        raise
      raise ImportError(
        f"config.init_from={path} is a PyTorch file and torch is not installed: convert it once "
        f"with `python -m vitboot_jax.tools.convert_checkpoint --input={path} "
        "--output=OUT.safetensors` where "
        "torch is installed (pip install 'vitboot_jax[torch]') and pass OUT.safetensors"
      ) from error
  raise ValueError(
    f"config.init_from={path}: unknown format {suffix!r}; use .safetensors, .npz, .pth or a "
    "workdir (orbax checkpoints) of ours"
  )


def _read_numpy_file(path: str, suffix: str) -> dict[str, np.ndarray]:
  if suffix == ".safetensors":
    from safetensors.numpy import load_file

    return load_file(path)
  with np.load(path) as data:
    return {k: data[k] for k in data.files}


def _orbax_step_dir(path: epath.Path, flag: str) -> epath.Path:
  """The step directory named by a workdir, its checkpoints/ directory or a step directory;
  `flag` is the field that gave `path`, for the error."""
  if (path / workdir_rules.COMMIT_MARKER).exists():
    return path
  if (path / workdir_rules.CHECKPOINT_SUBDIR).is_dir():
    path = path / workdir_rules.CHECKPOINT_SUBDIR
  steps = step_dirs.complete_steps(path)
  if not steps:
    raise FileNotFoundError(
      f"{flag}={path} is a directory without a complete orbax checkpoint; give a "
      "workdir of a run that saved one (checkpoints/<step>/commit_success.txt) or a weights file"
    )
  return path / str(steps[-1])


def _read_orbax_model(
  path: str,
  name: str,
  label: str,
  modes: tuple[str, str],
  collections: tuple[str, ...],
  flag: str = "config.init_from",
  what: str = "",
) -> tuple[epath.Path, dict[str, Any]]:
  """{collection: model `name`'s subtree} (numpy) of our newest complete checkpoint under
  `path`, and its step directory (`modes`: the modes without it and with it, for the error); a
  damaged step (its files fail the checksums of its save) is refused by name, never replaced by
  an older one."""
  step_dir = _orbax_step_dir(step_dirs.absolute(path), flag)  # Orbax reads absolute paths only.
  stored = reader.stored_tree(step_dir)
  stored = stored if isinstance(stored, dict) else {}
  if stored.get("params", {}).get(name) is None:
    raise ValueError(
      f"{what}the checkpoint in {step_dir} has no {label} (params/{name}): it was written by a "
      f"run without one (mode {modes[0]}); give a run of mode {modes[1]}"
    )
  # Only this model's arrays are read, as numpy on the host (the optimizer state is skipped).
  wanted = {c: {name: stored.get(c, {}).get(name, {})} for c in collections}
  restored = reader.read_on_host(step_dir, wanted)
  return step_dir, {c: restored[c][name] for c in collections}


def read_orbax_vit(path: str) -> dict[str, Any]:
  """The ViT parameters (numpy) of our newest complete checkpoint under `path`."""
  modes = ("agent or cnn", "vit, joint or shared")
  step_dir, read = _read_orbax_model(path, "vit", "ViT", modes, ("params",))
  logging.info("init_from: read the ViT of checkpoint %s", step_dir)
  return read["params"]


def read_orbax_agent(path: str, name: str = "agent") -> tuple[dict[str, Any], dict[str, Any]]:
  """The agent's (params, batch_stats) (numpy) of our newest complete checkpoint under `path`;
  `name` "cnn": the CNN of a mode-cnn run instead (a CNN teacher)."""
  modes = ("vit or cnn", "agent or joint") if name == "agent" else ("vit, agent or joint", "cnn")
  label = "agent" if name == "agent" else "CNN"
  collections = ("params", "batch_stats")
  flag = "config.agent_init_from"
  step_dir, read = _read_orbax_model(
    path, name, label, modes, collections, flag=flag, what=f"{flag}: "
  )
  logging.info("agent_init_from: read the %s of checkpoint %s", label, step_dir)
  return read["params"], read["batch_stats"]


def _same_shapes(what: str, path: str, got: Any, want: Any) -> None:
  """Raises one line naming the first leaf whose path or shape differs."""
  got_leaves = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree.leaves_with_path(got)}
  want_leaves = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree.leaves_with_path(want)}
  for key in sorted(set(got_leaves) | set(want_leaves)):
    if got_leaves.get(key) != want_leaves.get(key):
      raise ValueError(
        f"config.agent_init_from={path}: the stored {what}{key} has shape "
        f"{got_leaves.get(key, 'none')} where this config's agent has "
        f"{want_leaves.get(key, 'none')}; give a run of the same agent recipe (e.g. this config "
        "with mode=agent)"
      )


def initialise_agent(
  state: TrainState,
  config: ml_collections.ConfigDict,
  tx: optax.GradientTransformation,
  state_sharding: TrainState,
) -> TrainState:
  """`state` (fresh, joint) with its agent read from `config.agent_init_from` and a fresh
  optimizer state. With config.cnn.name the agent's place holds that CNN, read from a mode-cnn
  run."""
  path = config.agent_init_from
  params, stats = read_orbax_agent(path, "cnn" if config.cnn.get("name") else "agent")
  fresh_params = jax.device_get(state.params["agent"])
  fresh_stats = jax.device_get(state.batch_stats.get("agent", {}))
  _same_shapes("params", path, params, fresh_params)
  _same_shapes("batch_stats", path, stats, fresh_stats)
  cast = lambda tree, like: jax.tree.map(lambda x, y: np.asarray(x, y.dtype), tree, like)
  new_params = jax.device_put(
    {**state.params, "agent": cast(params, fresh_params)}, state_sharding.params
  )
  new_stats = jax.device_put(
    {**state.batch_stats, "agent": cast(stats, fresh_stats)}, state_sharding.batch_stats
  )
  opt_state = jax.jit(tx.init, out_shardings=state_sharding.opt_state)(new_params)
  logging.info("agent_init_from: the agent starts from %s", path)
  return state.replace(params=new_params, batch_stats=new_stats, opt_state=opt_state)


def read_vit_params(path: str) -> dict[str, Any]:
  """Our ViT tree (numpy) from any supported checkpoint (see the module docstring)."""
  if epath.Path(path).is_dir():
    return read_orbax_vit(path)
  return pretrained.vit_params_from_state_dict(read_state_dict(path))


def initialise(
  state: TrainState,
  config: ml_collections.ConfigDict,
  tx: optax.GradientTransformation,
  state_sharding: TrainState,
) -> TrainState:
  """`state` (fresh) with its ViT read from `config.init_from` and a fresh optimizer state."""
  path = config.init_from
  if "vit" not in state.params:
    raise ValueError(
      f"config.init_from initialises the ViT, but mode {config.mode!r} trains none; use mode "
      "vit, joint or shared, or drop config.init_from"
    )
  if config.model.init in attention_init.SCHEMES:
    raise ValueError(
      f"config.model.init={config.model.init!r} would be overwritten by config.init_from; set "
      "--config.model.init=official (or standard) when fine-tuning"
    )
  fresh = jax.tree.map(np.asarray, jax.device_get(state.params["vit"]))
  vit = pretrained.fit_vit_params(read_vit_params(path), fresh, log=logging.info)
  params = jax.device_put({**state.params, "vit": vit}, state_sharding.params)
  opt_state = jax.jit(tx.init, out_shardings=state_sharding.opt_state)(params)
  logging.info("init_from: the ViT starts from %s", path)
  return state.replace(params=params, opt_state=opt_state)

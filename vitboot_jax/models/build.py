"""Builds the models of a config and applies them as one unit over one parameter tree.

config.model.init is honoured here: the init schemes of the modules run in the jitted `init`;
the attention initialisers (mimetic, impulse: SVDs and cached fits that cannot run under jit)
build the ViT with the standard scheme and rewrite its attention on the host in `init_on_host`.

Variables are `{"params": {"vit": ..., "agent": ..., "drloc_vit": ...}, "batch_stats":
{"agent": ...}}` with only the models the mode trains. In shared mode the agent's apply reads
`params["vit"]` directly, so gradients of the agent's loss land on the ViT's leaves without any
copy. Mode "cnn" trains one CNN (ResNet-50, EfficientNet-B2 or a CIFAR ResNet) under the name
"cnn".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from vitboot_jax.models import attention_init, choices, cifar_resnet
from vitboot_jax.models import drloc_head as drloc_lib
from vitboot_jax.models.agent import Agent
from vitboot_jax.models.drloc_head import DrLocSetting
from vitboot_jax.models.efficientnet import efficientnet_b2
from vitboot_jax.models.kernels import XLA, Kernels
from vitboot_jax.models.resnet import resnet50
from vitboot_jax.models.vit import ViT

# fold_in of the init rng that seeds the attention initialisers on the host.
_HOST_INIT_STREAM = 1

# The CNNs of mode "cnn": the paper's baselines and He et al.'s CIFAR ResNets.
CNN_BASELINES = {
  "resnet50": resnet50,
  "efficientnet_b2": efficientnet_b2,
  **{name: functools.partial(cifar_resnet.cifar_resnet, name) for name in cifar_resnet.DEPTHS},
}


# config.model fields the agent takes too: it is the ViT's shape with a convolutional stem.
VIT_SHAPE = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size")


def module_fields(block: ml_collections.ConfigDict) -> dict[str, Any]:
  """A config block as module fields: they share names, but for two that flax modules own
  (`name`, here a label for logs; `init`, a module's `init_scheme`)."""
  fields = block.to_dict()
  fields.pop("name", None)
  if "init" in fields:
    fields["init_scheme"] = fields.pop("init")
  return fields


def build_vit(
  config: ml_collections.ConfigDict, dtype: Any = jnp.float32, kernels: Kernels = XLA
) -> ViT:
  fields = module_fields(config.model)
  # Attention initialisers start from the standard scheme (ModelSet.init_on_host rewrites it).
  if fields["init_scheme"] in attention_init.SCHEMES:
    fields["init_scheme"] = "standard"
  return ViT(num_classes=config.data.num_classes, dtype=dtype, kernels=kernels, **fields)


def build_agent(
  config: ml_collections.ConfigDict,
  *,
  shared: bool,
  dtype: Any = jnp.float32,
  kernels: Kernels = XLA,
):
  fields = module_fields(config.agent)
  fields["downsample_after"] = tuple(fields["downsample_after"])  # A list in a config.json.
  return Agent(
    num_classes=config.data.num_classes,
    **{name: config.model[name] for name in VIT_SHAPE},
    **fields,
    shared=shared,
    dtype=dtype,
    kernels=kernels,
  )


def build_cnn(
  config: ml_collections.ConfigDict, dtype: Any = jnp.float32, kernels: Kernels = XLA
) -> nn.Module:
  name = config.cnn.name
  # EfficientNet's convolutions stay flax's own (its depthwise ones are grouped).
  extra = {} if name == "efficientnet_b2" else {"kernels": kernels}
  return CNN_BASELINES[name](config.data.num_classes, dtype=dtype, **extra)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelSet:
  """The models one mode trains, by name: "vit", "agent" or "cnn"."""

  mode: str
  modules: dict[str, nn.Module]
  drloc: dict[str, DrLocSetting] = dataclasses.field(default_factory=dict)
  kernels: Kernels = XLA
  # (vit_params, rng) -> vit_params: config.model.init's attention initialiser, or None.
  attention_init: Callable[[dict[str, Any], jax.Array], dict[str, Any]] | None = None
  # ViT layers whose tokens a learnable linear map takes before the hint (a variant; none: the
  # official recipe), params["hint_vit"]["layer_<l>"]: {layer: the teacher map's width}, the map
  # initialised to the identity where that is the ViT's width, else Lecun-normal (FitNets).
  hint_projectors: dict[int, int] = dataclasses.field(default_factory=dict)
  # ((teacher map, ViT layer), ...) the hint pairs (losses.feature_losses), or None: the agent's
  # layer l with the ViT's layer l (official).
  hint_pairs: tuple[tuple[int, int], ...] | None = None

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(self.modules)

  @property
  def vit(self) -> ViT | None:
    return self.modules.get("vit")

  @property
  def agent(self) -> Agent | None:
    return self.modules.get("agent")

  @property
  def shared(self) -> bool:
    return self.mode == "shared"

  def _extra(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"vit_params": params["vit"]} if self.shared and name == "agent" else {}

  def init(self, rng: jax.Array, images: jax.Array) -> dict[str, Any]:
    """Initial variables for a batch shaped like `images` (NHWC); traceable (jit/eval_shape)."""
    params, batch_stats = {}, {}
    rngs = dict(zip(self.names, jax.random.split(rng, len(self.names))))
    for name, module in self.modules.items():
      variables = module.init(rngs[name], images, train=False, **self._extra(name, params))
      params[name] = variables.get("params", {})
      if "batch_stats" in variables:
        batch_stats[name] = variables["batch_stats"]
    for name, setting in self.drloc.items():
      outputs = jax.eval_shape(
        lambda p, n=name: self.modules[n].apply(
          {"params": p[n], **({"batch_stats": batch_stats[n]} if n in batch_stats else {})},
          images,
          train=False,
          **self._extra(n, p),
        ),
        params,
      )
      width = outputs[1]["features"][setting.layer].shape[-1]
      params[f"drloc_{name}"] = drloc_lib.init_head(
        setting.head, jax.random.fold_in(rngs[name], 1), width
      )
    if self.hint_projectors:
      width = self.modules["vit"].embed_dim
      keys = jax.random.split(jax.random.fold_in(rng, 2), len(self.hint_projectors))
      params["hint_vit"] = {
        f"layer_{layer}": {
          "kernel": jnp.eye(width, dtype=jnp.float32)
          if out == width
          else nn.initializers.lecun_normal()(key, (width, out), jnp.float32),
          "bias": jnp.zeros((out,), jnp.float32),
        }
        for key, (layer, out) in zip(keys, self.hint_projectors.items())
      }
    return {"params": params, "batch_stats": batch_stats}

  def init_on_host(self, params: dict[str, Any], rng: jax.Array) -> dict[str, Any]:
    """`params` from `init` (with the same `rng`) after the ViT's attention initialiser, which
    runs on the host; unchanged without one."""
    if self.attention_init is None:
      return params
    vit = jax.tree.map(np.asarray, jax.device_get(params["vit"]))
    vit = self.attention_init(vit, jax.random.fold_in(rng, _HOST_INIT_STREAM))
    return {**params, "vit": jax.tree.map(jnp.asarray, vit)}

  def loss_params(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters model `name`'s loss reads beside its outputs: its DrLoc head
    ("drloc_<name>") and hint projector ("hint_<name>"), where present."""
    return {k: params[k] for k in (f"drloc_{name}", f"hint_{name}") if k in params}

  def apply(
    self,
    variables: dict[str, Any],
    images: jax.Array,
    *,
    train: bool,
    rng: jax.Array | None = None,
    names: tuple[str, ...] | None = None,
  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns ({name: (logits, out)}, new batch_stats): one forward of each model in `names`
    (default: all)."""
    params, batch_stats = variables["params"], variables.get("batch_stats", {})
    outputs, new_stats = {}, dict(batch_stats)
    for name in self.names if names is None else names:
      module = self.modules[name]
      model_vars = {"params": params[name]}
      if name in batch_stats:
        model_vars["batch_stats"] = batch_stats[name]
      kwargs = self._extra(name, params)
      if train:
        # Each model draws its own dropout masks, whichever subset of models is applied.
        model_rng = jax.random.fold_in(rng, self.names.index(name)) if rng is not None else None
        rngs = {"dropout": model_rng} if rng is not None else None
        outputs[name], mutated = module.apply(
          model_vars, images, train=True, rngs=rngs, mutable=["batch_stats"], **kwargs
        )
        if "batch_stats" in mutated:
          new_stats[name] = mutated["batch_stats"]
      else:
        outputs[name] = module.apply(model_vars, images, train=False, **kwargs)
    return outputs, new_stats


def _drloc_settings(
  config: ml_collections.ConfigDict, modules: dict[str, nn.Module]
) -> dict[str, DrLocSetting]:
  cfg = config.drloc
  if not cfg.weight:
    return {}
  settings = {}
  for name in cfg.models:
    if name not in modules:
      raise ValueError(
        f"config.drloc.models names {name!r}, which mode {config.mode!r} does not train; "
        f"choose from {tuple(modules)}"
      )
    grid = None
    if cfg.variant in ("ce", "reg"):  # Their class count depends on the pooled grid size.
      images = jax.ShapeDtypeStruct((1, config.image_size, config.image_size, 3), jnp.float32)
      feature = _feature_shape(config.mode, modules, name, images, cfg.layer)
      grid = drloc_lib.pool_grid(jnp.zeros((1, feature[1], feature[2], 1)), cfg.pool).shape[1]
    head = drloc_lib.make_head(cfg.variant, grid, use_abs=cfg.use_abs, hidden=cfg.hidden)
    settings[name] = DrLocSetting(head=head, layer=cfg.layer, is_vit=name == "vit", pool=cfg.pool)
  return settings


def _feature_shape(mode, modules, name, images, layer) -> tuple[int, int, int]:
  """(tokens or H, H, W) of a model's block output, from shapes only."""
  # The probe keeps the mode: a shared agent can only be applied with the ViT's params.
  probe = ModelSet(mode=mode, modules={n: modules[n] for n in ("vit", name) if n in modules})
  variables = jax.eval_shape(probe.init, jax.random.key(0), images)
  outputs = jax.eval_shape(lambda v, x: probe.apply(v, x, train=False)[0], variables, images)
  shape = outputs[name][1]["features"][layer].shape
  if len(shape) == 3:  # ViT tokens with cls.
    side = int(round((shape[1] - 1) ** 0.5))
    return shape[1], side, side
  return shape[1] * shape[2], shape[1], shape[2]


def build_models(config: ml_collections.ConfigDict, kernels: Kernels) -> ModelSet:
  """The models of `config.mode`: vit, agent, both (joint: independent; shared: tied), or cnn.
  In joint mode config.cnn.name, when set, puts that CNN in the agent's place (a CNN teacher).

  `kernels` is the set the steps run with, chosen by the caller (kernel_sets.for_config reads
  config.kernels). The config is taken as valid (configlib.validate, called by the entry points).
  """
  dtype = jnp.dtype(config.get("compute_dtype", "float32"))
  mode = config.mode
  modules: dict[str, nn.Module] = {}
  if mode in ("vit", "joint", "shared"):
    modules["vit"] = build_vit(config, dtype, kernels)
  if mode == "joint" and config.cnn.get("name"):  # A CNN teacher in the agent's place.
    modules["agent"] = build_cnn(config, dtype, kernels)
  elif mode in ("agent", "joint", "shared"):
    modules["agent"] = build_agent(config, shared=mode == "shared", dtype=dtype, kernels=kernels)
  if mode == "cnn":
    modules["cnn"] = build_cnn(config, dtype, kernels)
  host_init = None
  if "vit" in modules and config.model.init in attention_init.SCHEMES:
    host_init = functools.partial(
      attention_init.apply_init,
      config.model.init,
      num_heads=config.model.num_heads,
      grid=config.image_size // config.model.patch_size,
    )
  projectors, pairs = {}, None
  if "vit" in modules and "agent" in modules:
    projectors, pairs = _hint_layout(config, modules)
  return ModelSet(
    mode=mode,
    modules=modules,
    drloc=_drloc_settings(config, modules),
    kernels=kernels,
    attention_init=host_init,
    hint_projectors=projectors,
    hint_pairs=pairs,
  )


def _hint_layout(
  config: ml_collections.ConfigDict, modules: dict[str, nn.Module]
) -> tuple[dict[int, int], tuple[tuple[int, int], ...] | None]:
  """The ViT's hint projectors ({layer: width}) and the hint's pairs (None: by index, official).

  The agent's maps have the ViT's width; a CNN teacher's stages are projected to where they
  differ, and its pairs default to its stages with evenly spaced ViT layers.
  """
  linear = config.loss.get("feature_projector") == "linear"
  spec = config.loss.get("hint_pairs", "")
  cnn = config.cnn.get("name", "")
  if not spec and not cnn:
    layers = choices.hinted_layers(config.model.depth, config.loss.get("feature_layers", 0))
    return ({layer: config.model.embed_dim for layer in layers} if linear else {}), None
  if spec:
    pairs = choices.parse_hint_pairs(spec)
  else:
    pairs = choices.spaced_pairs(choices.CNN_STAGES[cnn], config.model.depth)
  widths = [config.model.embed_dim] * config.model.depth  # The agent's maps: the ViT's width.
  if cnn:
    images = jax.ShapeDtypeStruct((1, config.image_size, config.image_size, 3), jnp.float32)
    variables = jax.eval_shape(modules["agent"].init, jax.random.key(0), images)
    _, out = jax.eval_shape(modules["agent"].apply, variables, images)
    widths = [f.shape[-1] for f in out["features"]]
  projectors = {
    layer: widths[t] for t, layer in pairs if linear or widths[t] != config.model.embed_dim
  }
  return projectors, pairs

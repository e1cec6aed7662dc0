"""Loading the golden vectors computed by the official PyTorch code (../shared/reference/golden)."""

import json

import numpy as np

from vitboot_jax.models.agent import Agent
from vitboot_jax.models.vit import ViT


def load(golden_dir, name):
  """(npz dict, state_dict without the 'param/' prefix, NHWC input, index entry)."""
  data = dict(np.load(golden_dir / f"{name}.npz"))
  state_dict = {k[len("param/") :]: v for k, v in data.items() if k.startswith("param/")}
  images = data["input"].transpose(0, 2, 3, 1)
  index = json.loads((golden_dir / "index.json").read_text())[name]
  return data, state_dict, images, index


def vit_module(transformer, patch_embed, num_classes):
  return ViT(
    num_classes=num_classes,
    patch_size=patch_embed["patch_size"],
    embed_dim=transformer["embed_dim"],
    depth=transformer["num_encoder_layers"],
    num_heads=transformer["num_heads"],
    mlp_dim=transformer["dim_feedforward"],
    dropout=transformer["dropout"] or 0.0,
  )


def shared_modules(index):
  """The ViT and shared agent of a golden `joint_model` entry, built from its exact config."""
  cfg = index["config"]
  t, cnn = cfg["vit"]["transformer"], cfg["cnn"]
  vit = vit_module(t, cfg["vit"]["patch_embed"], index["num_classes"])
  stem = {"resnet_like": "res_like", "vit_like": "patch"}[cnn["input_proj"]["name"]]
  agent = Agent(
    num_classes=index["num_classes"],
    embed_dim=t["embed_dim"],
    depth=t["num_encoder_layers"],
    num_heads=t["num_heads"],
    mlp_dim=t["dim_feedforward"],
    stem=stem,
    stem_channels=cnn["input_proj"].get("mid_channel", 64),
    patch_size=cnn["input_proj"].get("patch_size", 16),
    pre_norm=cnn["pre_norm"],
    downsample_after=tuple(cnn["down_sample_layers"]),
    taps="official",
    shared=True,
  )
  return vit, agent


def standalone_agent(index):
  cfg = index["config"]
  conv = cfg["conv_block"]
  return Agent(
    num_classes=index["num_classes"],
    embed_dim=cfg["embed_dim"],
    depth=cfg["num_layers"],
    num_heads=conv.get("num_heads", 9),  # conv_sl is a full 3x3 conv = 9 raster taps.
    mlp_dim=cfg["mlp_block"]["dim_feedforward"],
    stem="res_like",
    stem_channels=cfg["input_proj"]["mid_channel"],
    pre_norm=cfg.get("pre_norm", True),
    downsample_after=tuple(cfg["down_sample_layers"]),
    taps="official",
  )


def rel_err(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def shared_config(index):
  """A vitboot_jax config equal to a golden shared entry (official loss weights, no dropout)."""
  from vitboot_jax import configlib

  cfg = index["config"]
  t, cnn = cfg["vit"]["transformer"], cfg["cnn"]
  c = configlib.base_config()
  c.mode = "shared"
  c.data.update(name="cifar100", num_classes=index["num_classes"], normalisation="cifar100")
  c.image_size = cfg["vit"]["patch_embed"]["img_size"]
  c.batch_size = 64
  c.num_epochs = 240
  c.optim.update(lr=1e-3, weight_decay=0.05)
  c.model.update(
    name="golden",
    ln_eps=1e-5,
    patch_size=cfg["vit"]["patch_embed"]["patch_size"],
    embed_dim=t["embed_dim"],
    depth=t["num_encoder_layers"],
    num_heads=t["num_heads"],
    mlp_dim=t["dim_feedforward"],
    dropout=0.0,
  )
  c.agent.update(
    stem={"resnet_like": "res_like", "vit_like": "patch"}[cnn["input_proj"]["name"]],
    pre_norm=cnn["pre_norm"],
    downsample_after=tuple(cnn["down_sample_layers"]),
    mlp_dropout=0.0,
    residual_dropout=0.0,
  )
  weights = index["loss"]["weight_dict"]
  c.loss.update(
    ce_vit=weights["cls_vit"],
    ce_agent=weights["cls_cnn"],
    kd_vit=weights["kd_vit"],
    kd_agent=weights["kd_cnn"],
    feature_vit=weights["hint_vit"],
    temperature=index["loss"]["kd_temp"],
  )
  return c

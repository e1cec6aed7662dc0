"""Importing pre-trained ViTs: timm golden logits, layouts, shape handling, formats, errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.golden import rel_err
from vitboot_jax import init_from
from vitboot_jax.models import pretrained
from vitboot_jax.models.vit import ViT


def _timm_vit(golden_dir, num_classes=None):
  cfg = json.loads((golden_dir / "timm_vit_64.json").read_text())
  return ViT(
    num_classes=num_classes or cfg["num_classes"],
    patch_size=cfg["patch_size"],
    embed_dim=cfg["embed_dim"],
    depth=cfg["depth"],
    num_heads=cfg["num_heads"],
    mlp_dim=int(cfg["embed_dim"] * cfg["mlp_ratio"]),
    ln_eps=cfg["ln_eps"],
  )


def _fresh(model, size):
  return model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)))["params"]


def _import(path, model, size, log=lambda _: None):
  fresh = jax.tree.map(np.asarray, _fresh(model, size))
  return pretrained.fit_vit_params(init_from.read_vit_params(str(path)), fresh, log=log)


def _logits(model, params, images_nchw):
  images = jnp.asarray(images_nchw.transpose(0, 2, 3, 1))
  return np.asarray(model.apply({"params": params}, images)[0])


@pytest.fixture(scope="module")
def golden(golden_dir):
  return dict(np.load(golden_dir / "timm_vit_64.npz")), golden_dir / "timm_vit_64.safetensors"


@pytest.mark.slow
def test_timm_checkpoint_reproduces_timm_logits(golden):
  data, path = golden
  model = _timm_vit(path.parent)
  params = _import(path, model, 64)
  assert rel_err(_logits(model, params, data["input"]), data["logits"]) < 1e-4


@pytest.mark.slow
def test_timm_checkpoint_at_96px_resamples_pos_embed_like_timm(golden):
  data, path = golden
  model = _timm_vit(path.parent)
  notes = []
  params = _import(path, model, 96, log=notes.append)
  assert params["pos_embed"].shape == (1, 145, 72)
  assert rel_err(params["pos_embed"], data["pos_embed_96"]) < 1e-5
  assert rel_err(_logits(model, params, data["input_96"]), data["logits_96"]) < 1e-4
  assert any("pos_embed resampled from 64 to 144" in n for n in notes)


@pytest.mark.slow
def test_other_class_count_gets_the_fresh_head_and_says_so(golden):
  _, path = golden
  model = _timm_vit(path.parent, num_classes=7)
  fresh = jax.tree.map(np.asarray, _fresh(model, 64))
  notes = []
  params = pretrained.fit_vit_params(init_from.read_vit_params(str(path)), fresh, notes.append)
  np.testing.assert_array_equal(params["head"]["kernel"], fresh["head"]["kernel"])
  sd = load_file(path)
  np.testing.assert_array_equal(
    params["block_1"]["mlp"]["fc1"]["kernel"], sd["blocks.1.mlp.fc1.weight"].T
  )
  assert any("10-class head" in n and "7-class head" in n for n in notes)


def test_npz_and_official_layouts_give_the_same_tree(golden, tmp_path):
  _, path = golden
  sd = load_file(path)
  timm_tree = pretrained.vit_params_from_state_dict(sd)
  # The same weights in the official code's names and layouts (sequence-first pos_embed).
  official = {
    "cls_token": sd["cls_token"],
    "pos_embed.pos_embed": sd["pos_embed"].transpose(1, 0, 2),
    "patch_embed.proj.weight": sd["patch_embed.proj.weight"],
    "patch_embed.proj.bias": sd["patch_embed.proj.bias"],
    "transformer.norm.weight": sd["norm.weight"],
    "transformer.norm.bias": sd["norm.bias"],
    "cls_head.weight": sd["head.weight"],
    "cls_head.bias": sd["head.bias"],
  }
  names = {
    "attention.linear_qkv": "attn.qkv",
    "attention.linear_out": "attn.proj",
    "mlp.linear1": "mlp.fc1",
    "mlp.linear2": "mlp.fc2",
    "norm1": "norm1",
    "norm2": "norm2",
  }
  for layer in range(3):
    for ours, theirs in names.items():
      for kind in ("weight", "bias"):
        official[f"transformer.layers.{layer}.{ours}.{kind}"] = sd[
          f"blocks.{layer}.{theirs}.{kind}"
        ]
  np.savez(tmp_path / "official.npz", **{"module." + k: v for k, v in official.items()})
  np.savez(tmp_path / "timm.npz", **sd)
  joint = {"models.vit." + k: v for k, v in official.items()}
  joint["models.cnn.linear.weight"] = np.zeros((10, 72), np.float32)  # The agent's: ignored.
  for tree in (
    init_from.read_vit_params(str(tmp_path / "official.npz")),
    init_from.read_vit_params(str(tmp_path / "timm.npz")),
    pretrained.vit_params_from_state_dict(joint),
  ):
    jax.tree.map(np.testing.assert_array_equal, tree, timm_tree)


def test_pos_embed_resample_keeps_cls_and_round_trips_a_smooth_grid():
  side = 8
  yy, xx = np.meshgrid(np.linspace(0, 1, side), np.linspace(0, 1, side), indexing="ij")
  grid = np.stack([yy + xx, yy * 0.5], -1).reshape(1, side * side, 2).astype(np.float32)
  pos = np.concatenate([np.full((1, 1, 2), 7.0, np.float32), grid], axis=1)
  up = pretrained.resample_pos_embed(pos, 1 + 16 * 16)
  assert up.shape == (1, 257, 2) and np.all(up[0, 0] == 7.0)
  back = pretrained.resample_pos_embed(up, 1 + side * side)
  assert np.abs(back[0, 1:] - grid[0]).max() < 0.05
  with pytest.raises(ValueError, match="square patch grids"):
    pretrained.resample_pos_embed(pos, 1 + 50)


def _tiny(**kw):
  args = dict(num_classes=10, patch_size=8, embed_dim=72, depth=3, num_heads=6, mlp_dim=288)
  return ViT(**{**args, **kw})


@pytest.mark.parametrize(
  "model, match",
  [
    (_tiny(depth=2), r"has 3 blocks but the config builds 2: set --config.model.depth=3"),
    (
      _tiny(embed_dim=36),
      r"has shape \(72,\) but the configured ViT needs \(36,\): set config.model.embed_dim",
    ),
    (_tiny(mlp_dim=144), r"fc1/bias has shape \(288,\).*\(144,\): set config.model.mlp_dim"),
    (_tiny(patch_size=4), r"patch_embed/kernel has shape \(8, 8, 3, 72\).*config.model.patch_size"),
  ],
)
@pytest.mark.slow
def test_a_model_that_does_not_fit_names_parameter_shapes_and_fix(golden, model, match):
  _, path = golden
  with pytest.raises(ValueError, match=match):
    _import(path, model, 64)


@pytest.mark.slow
def test_entmax_alpha_starts_fresh_from_softmax_weights(golden):
  _, path = golden
  notes = []
  params = _import(path, _tiny(attention="entmax"), 64, log=notes.append)
  assert float(params["block_0"]["attn"]["entmax_alpha"]) == 1.5
  assert any("entmax_alpha" in n for n in notes)


def test_unsupported_timm_variants_and_layouts_fail_with_the_fix(golden, tmp_path):
  _, path = golden
  sd = load_file(path)
  with pytest.raises(ValueError, match="distilled DeiT"):
    pretrained.vit_params_from_state_dict({**sd, "dist_token": sd["cls_token"]})
  with pytest.raises(ValueError, match="LayerScale"):
    pretrained.vit_params_from_state_dict({**sd, "blocks.0.ls1.gamma": sd["norm.weight"]})
  with pytest.raises(ValueError, match="no place for.*blocks.0.attn.extra"):
    pretrained.vit_params_from_state_dict({**sd, "blocks.0.attn.extra": sd["norm.weight"]})
  with pytest.raises(ValueError, match="unknown layout"):
    pretrained.vit_params_from_state_dict({"conv1.weight": sd["norm.weight"]})
  with pytest.raises(ValueError, match="lack 'blocks.2.norm2.bias'"):
    pretrained.vit_params_from_state_dict(
      {k: v for k, v in sd.items() if k != "blocks.2.norm2.bias"}
    )
  with pytest.raises(FileNotFoundError, match="no such file"):
    init_from.read_vit_params(str(tmp_path / "missing.safetensors"))
  (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:1000])
  with pytest.raises(ValueError, match="cannot be read as .safetensors.*download complete"):
    init_from.read_vit_params(str(tmp_path / "cut.safetensors"))
  (tmp_path / "weights.h5").write_bytes(b"")
  with pytest.raises(ValueError, match="unknown format '.h5'"):
    init_from.read_vit_params(str(tmp_path / "weights.h5"))
  with pytest.raises(FileNotFoundError, match="without a complete orbax checkpoint"):
    init_from.read_vit_params(str(tmp_path))


def test_pth_without_torch_names_the_converter(tmp_path, monkeypatch):
  import sys

  monkeypatch.setitem(sys.modules, "torch", None)  # As if torch were not installed.
  (tmp_path / "deit.pth").write_bytes(b"")
  with pytest.raises(ImportError, match="convert_checkpoint --input=.*deit.pth --output=OUT"):
    init_from.read_vit_params(str(tmp_path / "deit.pth"))


def test_torch_converter_round_trips_a_wrapped_state_dict(golden, tmp_path):
  torch = pytest.importorskip("torch")
  from vitboot_jax.tools import convert_checkpoint

  _, path = golden
  sd = load_file(path)
  wrapped = {
    "model": {"module." + k: torch.from_numpy(v.copy()) for k, v in sd.items()},
    "epoch": 3,
  }
  torch.save(wrapped, tmp_path / "deit.pth")
  count = convert_checkpoint.convert(str(tmp_path / "deit.pth"), str(tmp_path / "out.safetensors"))
  assert count == len(sd)
  out = load_file(tmp_path / "out.safetensors")
  assert sorted(out) == sorted(sd)
  for k in sd:
    np.testing.assert_array_equal(out[k], sd[k])
  direct = init_from.read_vit_params(str(tmp_path / "deit.pth"))
  jax.tree.map(np.testing.assert_array_equal, direct, pretrained.vit_params_from_state_dict(sd))


def test_pos_embed_resample_matches_torch_antialiased_bicubic_when_shrinking():
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  grid = rng.normal(size=(1, 14, 14, 5)).astype(np.float32)
  pos = np.concatenate([rng.normal(size=(1, 1, 5)).astype(np.float32), grid.reshape(1, 196, 5)], 1)
  ours = pretrained.resample_pos_embed(pos, 1 + 8 * 8)
  want = torch.nn.functional.interpolate(
    torch.from_numpy(grid).permute(0, 3, 1, 2), size=(8, 8), mode="bicubic", antialias=True
  )
  want = want.permute(0, 2, 3, 1).reshape(1, 64, 5).numpy()
  assert rel_err(ours[:, 1:], want) < 1e-5


def test_safetensors_written_here_reads_back(tmp_path, golden):
  _, path = golden
  sd = load_file(path)
  save_file(
    {k: v for k, v in sd.items() if not k.startswith("head.")}, tmp_path / "headless.safetensors"
  )
  notes = []
  params = _import(tmp_path / "headless.safetensors", _tiny(), 64, log=notes.append)
  assert params["head"]["kernel"].shape == (72, 10)
  assert any("no head" in n for n in notes)


def _deit_small_state_dict(classes=1000):
  """timm's deit_small_patch16_224 names and shapes (zeros): 384 wide, 12 blocks, 224 px."""
  d, z = 384, lambda *s: np.zeros(s, np.float32)
  sd = {
    "cls_token": z(1, 1, d),
    "pos_embed": z(1, 197, d),
    "patch_embed.proj.weight": z(d, 3, 16, 16),
    "patch_embed.proj.bias": z(d),
    "norm.weight": z(d),
    "norm.bias": z(d),
    "head.weight": z(classes, d),
    "head.bias": z(classes),
  }
  for layer in range(12):
    b = f"blocks.{layer}."
    for name, (out, inp) in {
      "attn.qkv": (3 * d, d),
      "attn.proj": (d, d),
      "mlp.fc1": (4 * d, d),
      "mlp.fc2": (d, 4 * d),
    }.items():
      sd[b + name + ".weight"], sd[b + name + ".bias"] = z(out, inp), z(out)
    for name in ("norm1", "norm2"):
      sd[b + name + ".weight"], sd[b + name + ".bias"] = z(d), z(d)
  return sd


@pytest.mark.parametrize("dataset, classes", [("cifar10", 10), ("cifar100", 100)])
def test_pretrained_vit_b_row_builds_exactly_deit_small(dataset, classes):
  from tests.config_files import load_config
  from vitboot_jax.models.build import build_vit

  config = load_config("pretrained_cifar", f"dataset={dataset}")
  assert config.mode == "vit" and config.data.num_classes == classes
  assert config.init_from == "pretrained/deit_small_patch16_224.safetensors"
  assert config.model.ln_eps == 1e-6 and config.model.num_heads == 6
  model = build_vit(config)
  images = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), images)["params"]
  target = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), shapes)
  notes = []
  params = pretrained.fit_vit_params(
    pretrained.vit_params_from_state_dict(_deit_small_state_dict()), target, notes.append
  )
  assert params["head"]["kernel"].shape == (384, classes) and params["head"]["kernel"].all()
  assert not params["block_11"]["mlp"]["fc1"]["kernel"].any()  # Imported (zeros), not fresh.
  assert notes == [
    f"init_from: the checkpoint has a 1000-class head; the configured {classes}-class head "
    "starts from its initial values"
  ]
  vit_s = load_config("pretrained_cifar", "vit=vit_s,lr=1e-4,epochs=30,weights=/x/run")
  assert (vit_s.model.embed_dim, vit_s.init_from) == (288, "/x/run")
  assert (vit_s.optim.lr, vit_s.num_epochs, vit_s.optim.clip_norm) == (1e-4, 30, 0.1)
  with pytest.raises(ValueError, match="no pre-trained row"):
    load_config("pretrained_cifar", "vit=vit_tiny")

"""tools/export.py: a run's ViT (and agent) out to timm's and the authors' layouts, and back."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.config_files import REPO, load_config
from vitboot_jax import configlib, init_from, kernel_sets
from vitboot_jax.base import errors
from vitboot_jax.checkpoint import checkpointer, failures, reader
from vitboot_jax.models import convert, pretrained
from vitboot_jax.models.build import build_models, build_vit
from vitboot_jax.run import metrics
from vitboot_jax.tools import export

CLASSES = tuple(f"kind {c}" for c in "abcdefghij")  # As the run recorded them in data.json.


def _run(tmp_path, arg, steps=(3,), name="run", **model):
  """A workdir as training leaves it (config.json, orbax steps of params, batch_stats and an
  optimizer state), every parameter and BatchNorm statistic drawn at random, so no tensor is
  symmetric or constant. Shapes come from eval_shape: nothing is compiled."""
  config = load_config("tiny_config", arg)
  config.model.update(model)
  models = build_models(config, kernel_sets.for_config(config))
  shapes = jax.eval_shape(models.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  rng = np.random.default_rng(0)
  draw = lambda s: rng.normal(size=s.shape).astype(s.dtype)
  workdir = tmp_path / name
  saved = {}
  with checkpointer.Checkpointer(workdir, async_save=False) as ckpt:
    for step in steps:
      params = jax.tree.map(draw, shapes["params"])
      stats = jax.tree.map(lambda s: np.abs(draw(s)), shapes["batch_stats"])
      opt_state = {"mu": jax.tree.map(draw, shapes["params"])}  # Never read by an export.
      state = {"step": np.int32(step), "params": params, "batch_stats": stats, "opt": opt_state}
      ckpt.save(step, state, force=True)
      saved[step] = params, stats
  metrics.write_json(workdir / "config.json", json.loads(config.to_json_best_effort()))
  metrics.write_json(workdir / "data.json", {"name": "folder", "class_names": list(CLASSES)})
  return config, saved, str(workdir)


def _assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, got, want)


def _assert_vit_round_trip(config, vit, path):
  """init_from of the exported file gives the same ViT parameters and logits, bit for bit."""
  model = build_vit(config)
  images = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype(np.float32)
  fresh = jax.tree.map(
    lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(model.init, jax.random.key(1), images)
  )["params"]
  loaded = pretrained.fit_vit_params(init_from.read_vit_params(path), fresh, log=print)
  _assert_trees_equal(loaded, vit)
  logits = jax.jit(lambda p: model.apply({"params": p}, images)[0])
  np.testing.assert_array_equal(np.asarray(logits(loaded)), np.asarray(logits(vit)))


def test_timm_export_reads_back_identically_with_timm_names_and_model_args(tmp_path):
  config, saved, workdir = _run(tmp_path, "mode=vit")
  out = str(tmp_path / "vit.safetensors")
  export.export(workdir, "timm", out)
  vit = saved[3][0]["vit"]
  _assert_vit_round_trip(config, vit, out)
  sd = load_file(out)
  assert len(sd) == 8 + 12 * config.model.depth  # cls, pos, patch w/b, norm w/b, head w/b.
  assert sd["pos_embed"].shape == (1, 17, 36) and sd["cls_token"].shape == (1, 1, 36)
  assert sd["patch_embed.proj.weight"].shape == (36, 3, 8, 8)
  np.testing.assert_array_equal(
    sd["blocks.1.attn.qkv.weight"], vit["block_1"]["attn"]["qkv"]["kernel"].T
  )
  np.testing.assert_array_equal(sd["blocks.0.mlp.fc2.bias"], vit["block_0"]["mlp"]["fc2"]["bias"])
  info = json.loads((tmp_path / "vit.json").read_text())
  assert info["model_args"] == dict(
    img_size=32, patch_size=8, in_chans=3, num_classes=10, global_pool="token", embed_dim=36,
    depth=2, num_heads=9, mlp_ratio=2.0, qkv_bias=True, class_token=True, no_embed_class=False,
    pre_norm=False, fc_norm=False,
  )  # fmt: skip
  assert info["eps"] == config.model.ln_eps and info["weights"] == "vit.safetensors"
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  assert (info["mean"], info["std"]) == (list(mean), list(std))
  assert info["source"]["step"] == 3 and info["notes"] == []


def test_timm_builds_the_exported_vit_and_computes_our_logits(tmp_path):
  """Where torch and timm are installed: README's three lines load the export strictly, and
  timm's VisionTransformer gives our ViT's logits (float32, to rounding)."""
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  import functools

  import safetensors.torch

  config, saved, workdir = _run(tmp_path, "mode=vit")
  out = str(tmp_path / "vit.safetensors")
  export.export(workdir, "timm", out)
  args = json.loads((tmp_path / "vit.json").read_text())
  model = timm.models.vision_transformer.VisionTransformer(
    **args["model_args"], norm_layer=functools.partial(torch.nn.LayerNorm, eps=args["eps"])
  )
  model.load_state_dict(safetensors.torch.load_file(out))  # Strict: every key, every shape.
  model.eval()
  images = np.random.default_rng(2).normal(size=(4, 32, 32, 3)).astype(np.float32)
  with torch.no_grad():
    theirs = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
  vit = build_vit(config)
  ours = np.asarray(vit.apply({"params": saved[3][0]["vit"]}, images)[0])
  np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4 * np.abs(ours).max())


def test_timm_reads_the_class_names_and_the_eval_transform_back(tmp_path):
  """timm's own loader takes the export and its pretrained_cfg: the class names come back from
  the model, the input size and normalisation from timm's data config."""
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  import functools

  config, saved, workdir = _run(tmp_path, "mode=vit")
  out = str(tmp_path / "vit.safetensors")
  info = export.export(workdir, "timm", out)
  assert json.loads((tmp_path / "vit.json").read_text()) == info
  assert info["label_names"] == list(CLASSES) and info["label2id"]["kind c"] == 2
  assert info["id2label"] == {str(i): name for i, name in enumerate(CLASSES)}
  model = timm.create_model(
    "vit_tiny_patch16_224",  # Its name only: model_args give every dimension.
    pretrained=True,
    pretrained_cfg_overlay=dict(file=out, **info["pretrained_cfg"]),
    norm_layer=functools.partial(torch.nn.LayerNorm, eps=info["eps"]),
    **info["model_args"],
  )
  assert model.pretrained_cfg["label_names"] == list(CLASSES)
  data_config = timm.data.resolve_data_config(model=model)
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  assert tuple(data_config["input_size"]) == (3, 32, 32) and data_config["crop_mode"] == "squash"
  np.testing.assert_allclose(data_config["mean"], mean)
  np.testing.assert_allclose(data_config["std"], std)
  head = model.state_dict()["head.weight"].numpy()
  np.testing.assert_array_equal(head, saved[3][0]["vit"]["head"]["kernel"].T)  # Weights loaded.


def test_class_names_fall_back_to_the_data_and_else_are_a_note(tmp_path, image_folder):
  _, _, workdir = _run(tmp_path, "mode=vit")
  os.remove(os.path.join(workdir, "data.json"))  # A copied checkpoint: no record of the data.
  info = export.export(workdir, "official", str(tmp_path / "none.safetensors"))
  assert "label_names" not in info and info["notes"][0].startswith("no class names: ")
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  config["data"]["dir"] = str(image_folder)
  metrics.write_json(tmp_path / "run" / "config.json", config)
  info = export.export(workdir, "timm", str(tmp_path / "vit.safetensors"))
  assert info["label_names"] == [f"class{c}" for c in range(10)] and info["notes"] == []


@pytest.mark.parametrize("mode", ["vit", "joint", "shared"])
def test_official_export_reads_back_identically(tmp_path, mode):
  config, saved, workdir = _run(tmp_path, f"mode={mode}")
  params, stats = saved[3]
  out = str(tmp_path / "run.safetensors")
  info = export.export(workdir, "official", out)
  _assert_vit_round_trip(config, params["vit"], out)
  depth, heads = config.model.depth, config.model.num_heads
  sd = load_file(out)
  if mode == "vit":
    assert sd["pos_embed.pos_embed"].shape == (17, 1, 36) and "agent" not in info
    _assert_trees_equal(convert.import_vit(sd, depth)["params"]["vit"], params["vit"])
  if mode == "joint":  # Two standalone models, as the authors' joint training loads them.
    assert info["agent_weights"] == "run.agent.safetensors"
    agent_sd = load_file(str(tmp_path / info["agent_weights"]))
    got = convert.import_agent(agent_sd, depth, heads)
    assert "layers.0.cnn_block.conv.weight" in agent_sd  # 9 heads: Agent-S's Conv_SL.
    assert agent_sd["layers.1.norm2.num_batches_tracked"] == 3
    _assert_trees_equal(got, {"params": {"agent": params["agent"]}, "batch_stats": stats})
  if mode == "shared":  # One JointModel state_dict; the tied tensors under both names.
    got = convert.import_shared(sd, depth, heads)
    _assert_trees_equal(got, {"params": params, "batch_stats": stats})
    np.testing.assert_array_equal(
      sd["models.cnn.layers.1.cnn_block.mhsa.linear_qkv.weight"],
      sd["models.vit.transformer.layers.1.attention.linear_qkv.weight"],
    )
  if mode != "vit":  # The tiny config's 32-px stem is none of the authors' input projections.
    assert any("config.agent.stem='small'" in note for note in info["notes"])


def test_official_agent_with_six_heads_is_a_conv_manyhead(tmp_path):
  config, saved, workdir = _run(tmp_path, "mode=agent", num_heads=6)
  out = str(tmp_path / "agent.safetensors")
  info = export.export(workdir, "official", out)
  sd = load_file(out)
  assert sd["layers.0.cnn_block.weight"].shape == (36, 36, 6)  # [D_out, D_in, H], Agent-B's.
  got = convert.import_agent(sd, config.model.depth, 6)
  _assert_trees_equal(got, {"params": {"agent": saved[3][0]["agent"]}, "batch_stats": saved[3][1]})
  assert info["agent"]["conv_block"] == "many_head" and "vit" not in info


def test_export_reads_only_and_takes_the_chosen_step(tmp_path):
  _, saved, workdir = _run(tmp_path, "mode=vit,drloc=0.5", steps=(2, 4))
  os.mkdir(os.path.join(workdir, "checkpoints", "6"))  # A save cut short: a Checkpointer moves it.
  before = sorted(
    (p, os.stat(os.path.join(p, n)).st_mtime_ns) for p, _, f in os.walk(workdir) for n in f
  )
  info = export.export(workdir, "timm", str(tmp_path / "old.safetensors"), step=2)
  after = sorted(
    (p, os.stat(os.path.join(p, n)).st_mtime_ns) for p, _, f in os.walk(workdir) for n in f
  )
  assert after == before and os.path.isdir(os.path.join(workdir, "checkpoints", "6"))
  got = init_from.read_vit_params(str(tmp_path / "old.safetensors"))
  _assert_trees_equal(got, saved[2][0]["vit"])
  assert info["source"]["step"] == 2
  assert any("drloc_vit" in note and "not exported" in note for note in info["notes"])
  with pytest.raises(errors.WorkdirError, match=r"--step=3 is not a complete checkpoint.*\[2, 4\]"):
    export.export(workdir, "timm", str(tmp_path / "x.safetensors"), step=3)


@pytest.mark.parametrize(
  "arg, model, fmt, message",
  [
    ("mode=vit,attention=entmax", {}, "timm", "attention='entmax'.*softmax attention only"),
    ("mode=vit,attention=entmax", {}, "official", "attention='entmax'.*alpha is not on record"),
    ("mode=agent", {}, "timm", "mode 'agent'.* has none; --format=official exports its agent"),
    ("mode=agent,taps=centered", {"num_heads": 4}, "official", "taps='centered' with 4 heads"),
    ("mode=cnn", {}, "official", "mode 'cnn' trains a CNN baseline"),
    ("mode=joint,distill=hard", {}, "timm", "distillation token .*--format=timm cannot hold"),
    ("mode=joint,distill=hard", {}, "official", "distillation token .*--format=official cannot"),
  ],
)
def test_what_a_format_cannot_express_is_refused_by_name(arg, model, fmt, message):
  config = load_config("tiny_config", arg)
  config.model.update(model)
  names = {"vit": ("vit",), "agent": ("agent",), "cnn": ("cnn",), "joint": ("vit", "agent")}
  names = names[config.mode]
  run = reader.Run(config, 1, {name: {} for name in names}, {}, [])
  with pytest.raises(errors.UsageError, match=message):
    (export.timm_export if fmt == "timm" else export.official_export)(run)


def test_bad_arguments_are_refused_before_reading(tmp_path):
  with pytest.raises(errors.UsageError, match="must end in .safetensors"):
    export.export(str(tmp_path), "timm", str(tmp_path / "vit.pth"))
  with pytest.raises(errors.WorkdirError, match="has no config.json"):
    export.export(str(tmp_path), "timm", str(tmp_path / "vit.safetensors"))


def _overwrite_largest_data_file(step_dir):
  """Bit rot: bytes in the middle of the step's largest data file, its size unchanged."""
  files = [p for p in step_dir.rglob("*") if p.is_file() and "/d/" in str(p)]
  path = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(path.read_bytes())
  data[len(data) // 2 : len(data) // 2 + 16] = bytes(255 - b for b in data[len(data) // 2 :][:16])
  path.write_bytes(bytes(data))


def test_relative_workdir_and_a_damaged_step_refused_by_name(tmp_path, monkeypatch):
  _, saved, _ = _run(tmp_path, "mode=vit", steps=(2, 4))
  monkeypatch.chdir(tmp_path)  # README's form: `--workdir=workdirs/run --output=vit.safetensors`.
  assert export.export("run", "timm", "vit.safetensors")["source"]["step"] == 4
  _assert_trees_equal(init_from.read_vit_params("vit.safetensors"), saved[4][0]["vit"])
  _assert_trees_equal(init_from.read_vit_params("run"), saved[4][0]["vit"])  # init_from=RUN.
  root = tmp_path / "run" / "checkpoints"
  _overwrite_largest_data_file(root / "4")
  for read in (
    lambda: export.export("run", "timm", "x.safetensors"),
    lambda: init_from.read_vit_params("run/checkpoints"),
  ):
    with pytest.raises(failures.CorruptCheckpointError) as info:
      read()
    message = str(info.value)
    assert isinstance(info.value, errors.UsageError) and "\n" not in message  # Exit 2.
    assert message.startswith(f"Checkpoint {root / '4'} (step 4) is damaged: default/")
    assert "fails its CRC32 check" in message and "to use step 2" in message
  assert not (tmp_path / "x.safetensors").exists() and sorted(os.listdir(root)) == ["2", "4"]
  assert export.export("run", "timm", "old.safetensors", step=2)["source"]["step"] == 2


@pytest.mark.slow
def test_command_line_writes_and_refuses_with_exit_2(tmp_path):
  _, _, good = _run(tmp_path, "mode=vit", name="good")
  _, _, sparse = _run(tmp_path, "mode=vit,attention=entmax", name="sparse")
  _, _, damaged = _run(tmp_path, "mode=vit", name="damaged")
  _overwrite_largest_data_file(tmp_path / "damaged" / "checkpoints" / "3")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  tool = lambda *args: subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.export", *args],
    env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, cwd=elsewhere,
  )  # fmt: skip
  done = tool("--workdir=../good", "--format=timm", "--output=vit.safetensors")  # Relative paths.
  assert done.returncode == 0, done.stderr
  assert "wrote vit.safetensors and vit.json (step 3)" in done.stdout
  assert (elsewhere / "vit.safetensors").exists()
  refused = tool(f"--workdir={sparse}", "--format=official", f"--output={tmp_path}/s.safetensors")
  assert refused.returncode == 2, refused.stderr
  assert refused.stderr.strip().splitlines()[-1].startswith("error: config.model.attention=")
  refused = tool(f"--workdir={damaged}", f"--output={tmp_path}/d.safetensors")
  assert refused.returncode == 2, refused.stderr
  errors_ = [line for line in refused.stderr.splitlines() if line.startswith(("error", "E1", "E0"))]
  assert len(errors_) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
  assert errors_[0].startswith(f"error: Checkpoint {damaged}/checkpoints/3 (step 3) is damaged")


def _reference_keys(title):
  """{name: shape} of one model in docs/reference/official_state_dict_keys.md (../shared)."""
  from tests.conftest import SHARED

  path = SHARED / "reference" / "official_state_dict_keys.md"
  if not path.exists():
    pytest.skip(f"{path} not found (../shared is absent)")
  section = path.read_text().split(f"## {title}", 1)[1].split("```")[1]
  rows = (line.split(" (", 1) for line in section.strip().splitlines())
  return {name: tuple(int(n) for n in shape.strip("()").split(",") if n) for name, shape in rows}


@pytest.mark.parametrize(
  "config_arg, title",
  [
    ("mode=vit", "ViT-S (config/cifar100/vit/vit-small.yaml)"),
    ("mode=shared", "Shared ViT-S + res-like agent"),
    ("mode=agent", "Standalone agent-small-res_like"),
    ("vitb_cifar100:mode=agent", "Standalone agent-base-res_like"),  # Conv_ManyHead, 6 heads.
  ],
)
def test_official_export_has_exactly_the_keys_and_shapes_the_authors_models_hold(config_arg, title):
  want = _reference_keys(title)
  name, _, arg = config_arg.rpartition(":")
  config = load_config(name or "vits_cifar100", arg)
  models = build_models(config, kernel_sets.for_config(config))
  size = config.image_size
  shapes = jax.eval_shape(models.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  run = reader.Run(config, 1, zeros["params"], zeros["batch_stats"], [])
  files, _ = export.official_export(run)
  assert list(files) == [""]
  got = {name: tuple(value.shape) for name, value in files[""].items()}
  assert sorted(set(got) ^ set(want)) == []
  assert got == want

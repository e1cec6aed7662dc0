r"""Exports a run's trained ViT (and agent) for PyTorch: timm's layout or the authors'.

  python -m vitboot_jax.tools.export --workdir=RUN --format=timm --output=vit.safetensors
  python -m vitboot_jax.tools.export --workdir=RUN --format=official --output=run.safetensors

Reads RUN/config.json and the newest complete checkpoint (or --step=N) and nothing else: it moves,
deletes and locks nothing in RUN, so it may run beside the training. A step whose files fail the
checksums of its save is refused by name (exit 2). Writes with safetensors'
numpy API (no torch needed), and OUTPUT's .json beside it:

- timm: a `timm.models.vision_transformer.VisionTransformer` state_dict; the JSON holds the model
  arguments (`model_args`) and the LayerNorm `eps`, which timm takes as a norm_layer (README, "Use
  a trained model in PyTorch"), the input normalisation (`mean`, `std` on [0, 1] pixels), and
  `pretrained_cfg`, what `timm.create_model(..., pretrained_cfg_overlay=dict(file=OUTPUT,
  **pretrained_cfg))` reads: the class names (`label_names`), input size and eval transform.
- official: the state_dicts the authors' code loads: mode vit their `vit`, mode agent their `cnn`,
  mode joint both (the agent in OUTPUT's `.agent.safetensors`), mode shared their JointModel
  (`models.vit.*`, `models.cnn.*`, the tied tensors under both names as PyTorch lists them).

Both JSONs name the classes the run recorded (data.json) by label index: `label_names` (where
timm's config.json has them) and `id2label`/`label2id` (Hugging Face's). `config.init_from=OUTPUT`
reads either back. What a format cannot express is refused (exit 2)
with the reason: entmax attention (timm has none; the authors' key of its alpha is not on
record), a run without a ViT for timm, taps the official CONV cannot place. A DrLoc head (a
training-time auxiliary) is left out with a note.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags

from vitboot_jax import configlib
from vitboot_jax.base import cli, errors, files
from vitboot_jax.checkpoint import reader
from vitboot_jax.checkpoint.reader import Run
from vitboot_jax.run import workdir_rules

FORMATS = ("timm", "official")
SUFFIX = ".safetensors"


def _refuse(message: str) -> None:
  raise errors.UsageError(message)


def _vit_shape(run: Run) -> dict[str, Any]:
  """The ViT's architecture, read from its weights (the config only where they do not tell)."""
  m, vit = run.config.model, run.params["vit"]
  kernel = np.shape(vit["patch_embed"]["kernel"])  # [p, p, 3, D]
  tokens = np.shape(vit["pos_embed"])[1] - 1
  grid = math.isqrt(tokens)
  return dict(
    embed_dim=int(kernel[3]),
    depth=sum(1 for name in vit if name.startswith("block_")),
    num_heads=int(m.num_heads),
    mlp_dim=int(np.shape(vit["block_0"]["mlp"]["fc1"]["kernel"])[1]),
    patch_size=int(kernel[0]),
    img_size=grid * int(kernel[0]),
    num_classes=int(np.shape(vit["head"]["kernel"])[1]),
    ln_eps=float(m.ln_eps),
  )


def _check_vit(run: Run, fmt: str) -> None:
  if "vit" not in run.params:
    hint = "; --format=official exports its agent" if run.config.mode == "agent" else ""
    _refuse(f"--format={fmt} exports a ViT and this run (mode {run.config.mode!r}) has none{hint}")
  if run.config.model.attention != "softmax":
    why = (
      "timm's VisionTransformer has softmax attention only"
      if fmt == "timm"
      else "the authors' state_dict key of its learned alpha is not on record here"
    )
    _refuse(
      f"config.model.attention={run.config.model.attention!r} (Sparse ViT) cannot be exported "
      f"to --format={fmt}: {why}; its weights stay usable here (config.init_from=RUN)"
    )

  if run.config.model.get("distill_token", False):
    _refuse(
      f"this run's ViT has a distillation token (distill=hard), which --format={fmt} cannot "
      "hold (a plain ViT: one cls token, one head); its weights stay usable here "
      "(tools.visualize, tools.representations)"
    )


def _drloc_notes(run: Run) -> list[str]:
  return [
    f"params/{name} (a DrLoc head, a training-time auxiliary task) is not exported"
    for name in run.left_out
  ]


def timm_export(
  run: Run, class_names: Sequence[str] = ()
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
  """({"": state_dict}, JSON fields) of the run's ViT in timm's layout."""
  from vitboot_jax.models import pretrained

  _check_vit(run, "timm")
  shape = _vit_shape(run)
  mlp_ratio = shape["mlp_dim"] / shape["embed_dim"]
  if int(shape["embed_dim"] * mlp_ratio) != shape["mlp_dim"]:
    _refuse(
      f"config.model.mlp_dim={shape['mlp_dim']} is not int(embed_dim * mlp_ratio) for any float "
      "ratio timm could be given; timm's VisionTransformer cannot build this MLP"
    )
  model_args = dict(
    img_size=shape["img_size"],
    patch_size=shape["patch_size"],
    in_chans=3,
    num_classes=shape["num_classes"],
    global_pool="token",
    embed_dim=shape["embed_dim"],
    depth=shape["depth"],
    num_heads=shape["num_heads"],
    mlp_ratio=mlp_ratio,
    qkv_bias=True,
    class_token=True,
    no_embed_class=False,
    pre_norm=False,
    fc_norm=False,
  )
  info = {"model_args": model_args, "eps": shape["ln_eps"]}
  norm = configlib.NORMALISATION.get(run.config.data.get("normalisation", ""))
  if norm:
    info.update(mean=list(norm[0]), std=list(norm[1]))
  # The eval transform in timm's terms: a resize to the input size, or ImageNet's centre crop.
  imagenet = run.config.data.augment == "imagenet"
  info["pretrained_cfg"] = {
    "num_classes": shape["num_classes"],
    "input_size": [3, shape["img_size"], shape["img_size"]],
    "interpolation": "bilinear",
    "crop_pct": 0.875 if imagenet else 1.0,
    "crop_mode": "center" if imagenet else "squash",
    **({"mean": info["mean"], "std": info["std"]} if norm else {}),
    **({"label_names": list(class_names)} if class_names else {}),
  }
  return {"": pretrained.timm_state_dict(run.params["vit"])}, info


def label_fields(class_names: Sequence[str]) -> dict[str, Any]:
  """The class names by label index as timm's config.json and Hugging Face's name them."""
  return {
    "label_names": list(class_names),
    "id2label": {str(i): name for i, name in enumerate(class_names)},
    "label2id": {name: i for i, name in enumerate(class_names)},
  }


def _class_names(workdir: str, run: Run) -> tuple[tuple[str, ...], list[str]]:
  """(the run's class names, or none with a note saying why)."""
  from vitboot_jax.data import workdir_record

  try:
    names = workdir_record.class_names(run.config, workdir_rules.saved_data(workdir))
  except errors.DataError as error:
    return (), [f"no class names: {error}"]
  if len(names) != run.config.data.num_classes:
    return (), [
      f"no class names: {len(names)} recorded for the {run.config.data.num_classes} classes of "
      "config.data.num_classes"
    ]
  return names, []


def _agent_stem(run: Run, notes: list[str]) -> str:
  stem = run.config.agent.stem
  if stem == "patch":
    return "vit_like"
  if stem != "res_like":  # small / small_full: res_like's tensors, other kernel sizes.
    notes.append(
      f"config.agent.stem={stem!r} has no counterpart in the authors' code: its tensors are under "
      "res_like's names (input_proj.conv1/norm/conv2) with a 3x3 conv1, so their agent needs an "
      "input_proj built to match"
    )
  return "res_like"


def _check_taps(run: Run) -> None:
  from vitboot_jax.models.agent import tap_positions

  heads, taps = int(run.config.model.num_heads), run.config.agent.taps
  try:
    same = tap_positions(heads, "official") == tap_positions(heads, taps)
  except ValueError:
    same = False
  if not same:
    _refuse(
      f"config.agent.taps={taps!r} with {heads} heads places the CONV taps where the authors' "
      "code does not (its taps are the first raster positions of an odd window); this agent "
      "cannot be expressed in --format=official"
    )


def official_export(run: Run) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
  """({file suffix: state_dict}, JSON fields) in the authors' layout: "" is OUTPUT itself."""
  from vitboot_jax.models import convert

  mode = run.config.mode
  if mode == "cnn":
    _refuse(
      "mode 'cnn' trains a CNN baseline (resnet50/efficientnet_b2); the authors' ViT/agent layout "
      "has no place for it"
    )
  notes: list[str] = []
  info: dict[str, Any] = {}
  files: dict[str, dict[str, np.ndarray]] = {}
  if mode in ("vit", "joint", "shared"):
    _check_vit(run, "official")
    info["vit"] = _vit_shape(run)
  if mode in ("agent", "joint", "shared"):
    _check_taps(run)
    stem = _agent_stem(run, notes)
    a = run.config.agent
    heads = int(run.config.model.num_heads)
    info["agent"] = dict(
      input_proj=stem,
      conv_block="shared" if mode == "shared" else convert.conv_block_for(heads),
      num_taps=heads,
      pre_norm=bool(a.pre_norm),
      down_sample_layers=list(a.downsample_after),
      bn_eps=float(a.bn_eps),
    )
  depth, stats = int(run.config.model.depth), run.batch_stats.get("agent", {})
  if mode == "shared":
    files[""] = convert.export_shared(
      run.params["vit"], run.params["agent"], stats, depth, heads, stem=stem, batches=run.step
    )
    info["model"] = "shared JointModel (models.vit.*, models.cnn.*)"
    return files, {**info, "notes": notes}
  if "vit" in run.params:
    files[""] = convert.export_vit(run.params["vit"], depth)
  if "agent" in run.params:
    agent = convert.export_agent(
      run.params["agent"], stats, depth, heads, stem=stem, batches=run.step
    )
    files[".agent" if mode == "joint" else ""] = agent
  return files, {**info, "notes": notes}


def export(workdir: str, fmt: str, output: str, step: int | None = None) -> dict[str, Any]:
  """Writes the export of `workdir` to `output` (+ .json); returns what the JSON holds."""
  from safetensors.numpy import save

  if fmt not in FORMATS:
    _refuse(errors.unknown_choice("--format", fmt, FORMATS))
  if not output.endswith(SUFFIX):
    _refuse(f"--output={output} must end in {SUFFIX} (the JSON goes beside it)")
  run = reader.read_run(workdir, step)
  class_names, notes = _class_names(workdir, run)
  state_dicts, info = timm_export(run, class_names) if fmt == "timm" else official_export(run)
  if class_names:
    info.update(label_fields(class_names))
  notes = info.pop("notes", []) + notes + _drloc_notes(run)
  base = output[: -len(SUFFIX)]
  written = {}
  for suffix, state_dict in state_dicts.items():
    path = base + suffix + SUFFIX
    files.write_atomically(path, save(state_dict))
    written["agent_weights" if suffix else "weights"] = os.path.basename(path)
  summary = {
    "format": fmt,
    **written,
    **info,
    "source": {
      "workdir": os.path.abspath(workdir),
      "step": run.step,
      "mode": run.config.mode,
      "config": run.config.model.get("name", ""),
    },
    "notes": notes,
  }
  files.write_atomically(base + ".json", (json.dumps(summary, indent=2) + "\n").encode())
  return summary


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """Defines this tool's flags when it runs as a program (tests import it without them)."""
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "The run's workdir (read only).")
  _FLAGS["step"] = flags.DEFINE_integer("step", None, "Checkpoint step; default: the newest.")
  _FLAGS["format"] = flags.DEFINE_enum("format", "timm", FORMATS, "Layout to write.")
  _FLAGS["output"] = flags.DEFINE_string("output", None, f"The {SUFFIX} file to write.")
  flags.mark_flags_as_required(["workdir", "output"])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  from vitboot_jax.base import library_logs

  library_logs.libraries()
  output = _FLAGS["output"].value
  try:
    summary = export(_FLAGS["workdir"].value, _FLAGS["format"].value, output, _FLAGS["step"].value)
  except errors.UsageError as error:
    cli.fail(str(error))
  names = ", ".join(summary[k] for k in ("weights", "agent_weights") if k in summary)
  json_name = os.path.basename(output[: -len(SUFFIX)]) + ".json"
  print(f"wrote {names} and {json_name} (step {summary['source']['step']})")
  for note in summary["notes"]:
    print(f"note: {note}")


if __name__ == "__main__":
  define_flags()
  app.run(main)

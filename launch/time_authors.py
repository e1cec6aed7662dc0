#!/usr/bin/env python
"""Time the AUTHORS' official PyTorch training iteration (Bootstrapping-ViTs-pytorch).

Our harness; the authors' code is never in this repository: `bash launch/authors_carry.sh` puts
it in the ignored carry/authors/ (Bootstrapping-ViTs-pytorch/ at commit 85f12e9 and
cv-lib-PyTorch/ at tag bootstrapping_vits), where --authors_dir finds it. On a lent GPU, from
the repository root (docs/accelerators.md):
  python launch/time_authors.py --steps 50 --warmup 3 --budget_s 240 --out $OUT/authors.jsonl

What it times, per row (mode x dtype):
  * vit:    the official `vit_mutual.tasks.worker.Trainer.train_iter`, the model built by
            `vit_mutual.models.get_model` from config/cifar100/vit/vit-small.yaml, the optimizer
            by `cv_lib.optimizers.get_optimizer` (AdamW lr 1e-3 wd 0.05), the loss by
            `vit_mutual.loss.get_loss_fn` (ce_loss, weight cls 1.0), clip_max_norm 0.1.
  * shared: the official `vit_mutual.tasks.worker_mutual.MutualTrainer.train_iter`, the model
            built by `vit_mutual.models.mutual.get_mutual_model` from
            config/cifar100/shared/agent-small-res_like-vit-small.yaml (joint_model; the res-like
            Agent-S, as ours; mode shared_vit_like: the vit_like stem), optimizer by the
            official `get_mutual_learners`, loss joint_mutual_loss with the yaml's weights.
  The Trainer objects are constructed through their real __init__, exactly as the official
  workers construct them, with a length-only stand-in for the DataLoader (only len() is read),
  no evaluator (never called by train_iter) and no TensorBoard writer (only used when a step
  logs, which the harness keeps from happening by starting at iter 1 with a huge print
  interval). Each timed step is one call of train_iter on one fixed random batch, blocked
  (torch.cuda.synchronize) after each call; step_s is the median.

dtype: float32 (torch defaults: matmul TF32 off, cuDNN TF32 on), tf32 (matmul TF32 on too:
the default of torch 1.7-1.11, which the authors' requirements, torch>=1.10.2, allow), amp
(the official --use-amp: torch.cuda.amp.autocast fp16 + GradScaler, as the README's
joint/shared commands use). amp and tf32 rows are CUDA only.

Prints one JSON line per row and appends the same lines to --out.
"""

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import types
import warnings

START = time.perf_counter()
REPO_NAME, CVLIB_NAME = "Bootstrapping-ViTs-pytorch", "cv-lib-PyTorch"
# The paper's Agent-S is the res-like one (configs/vits_cifar100.py's default); vit_like also runs.
CONFIGS = {
  "vit": "config/cifar100/vit/vit-small.yaml",
  "shared": "config/cifar100/shared/agent-small-res_like-vit-small.yaml",
  "shared_vit_like": "config/cifar100/shared/agent-small-vit-small.yaml",
}

# ----------------------------------------------------------------------------------------------
# Stubs for packages that the authors' modules import but the timed step never uses. A package
# is stubbed only when its real import fails here; every attribute of a stub is a class whose
# construction or call raises, so a stub reached by the timed computation fails loudly instead
# of changing it.

OPTIONAL = ("torchvision", "timm", "tensorboard", "tqdm", "PIL", "scipy", "pandas", "numpy")
STUBBED = []


class StubUsed(RuntimeError):
  pass


class _StubMeta(type):
  """Stub classes: any attribute is another stub; calling (constructing) one raises."""

  def __getattr__(cls, name):
    return _stub_member(cls, cls.__qualname__, name)

  def __call__(cls, *args, **kwargs):
    raise StubUsed(f"stub {cls.__qualname__} was used; the timed path must not reach it")


def _stub_member(owner, prefix, name):
  """owner.name as a stub class, made on first access and kept (dunders stay missing)."""
  if name.startswith("__"):
    raise AttributeError(name)
  value = _stub_attr(f"{prefix}.{name}")
  setattr(owner, name, value)
  return value


def _stub_attr(qualname):
  cls = _StubMeta(qualname.rsplit(".", 1)[-1], (), {})
  cls.__qualname__ = qualname
  return cls


class _StubModule(types.ModuleType):
  def __getattr__(self, name):
    return _stub_member(self, self.__name__, name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def __init__(self):
    self.roots = []

  def covers(self, fullname):
    return any(fullname == r or fullname.startswith(r + ".") for r in self.roots)

  def find_spec(self, fullname, path=None, target=None):
    if self.covers(fullname):
      return importlib.util.spec_from_loader(fullname, self, is_package=True)
    return None

  def create_module(self, spec):
    return _StubModule(spec.name)

  def exec_module(self, module):
    module.__path__ = []
    module.__all__ = []


def install_stubs(force=()):
  finder = _StubFinder()
  names = list(OPTIONAL) + ["torch.utils.tensorboard"]
  for name in names:
    if name not in force:
      try:
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")
          importlib.import_module(name)
        continue
      except Exception as e:  # noqa: BLE001  (missing, or broken beside this torch)
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
    else:
      reason = "forced"
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
      del sys.modules[mod]
    finder.roots.append(name)
    STUBBED.append(f"{name} ({reason})")
  sys.meta_path.insert(0, finder)


# ----------------------------------------------------------------------------------------------


class LengthOnlyLoader:
  """Stands in for the train DataLoader: the Trainers' __init__ read only len() of it."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __iter__(self):
    raise RuntimeError("the harness never iterates the loader")


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--modes", default="vit,shared")
  p.add_argument(
    "--dtypes",
    default="float32,tf32,amp",
    help="comma list of float32, tf32, amp (tf32/amp are skipped off CUDA)",
  )
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--image_size", type=int, default=224)
  p.add_argument("--patch_size", type=int, default=0, help="0: the yaml's (16)")
  p.add_argument("--num_classes", type=int, default=100, help="CIFAR-100, the configs' dataset")
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument(
    "--budget_s",
    type=float,
    default=300.0,
    help="whole-run wall budget: rows not started in time are skipped, a row "
    "whose timed loop reaches it stops early (truncated: true)",
  )
  p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cpu")
  p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: default)")
  p.add_argument(
    "--host_batch",
    action="store_true",
    help="keep the batch on the host so each train_iter copies it to the device "
    "(default: the batch already on the device, as our benchmark does)",
  )
  p.add_argument(
    "--force_stub", default="", help="comma list of OPTIONAL packages to stub even if installed"
  )
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="", help="append the JSON lines to this file")
  p.add_argument(
    "--authors_dir",
    default="carry/authors",
    help=f"holds {REPO_NAME}/ and {CVLIB_NAME}/ (launch/authors_carry.sh)",
  )
  return p.parse_args()


def elapsed():
  return time.perf_counter() - START


def main():
  args = parse_args()
  repo, cvlib = (os.path.join(args.authors_dir, name) for name in (REPO_NAME, CVLIB_NAME))
  for path in (repo, cvlib):
    if not os.path.isdir(path):
      print(
        f"time_authors.py: {path} not found; run `bash launch/authors_carry.sh` first",
        file=sys.stderr,
      )
      sys.exit(2)
  import torch  # before the stubs, so torch's own optional imports see the machine as it is

  install_stubs(force=tuple(x for x in args.force_stub.split(",") if x))
  sys.path[:0] = [repo, cvlib]
  warnings.filterwarnings("ignore", category=FutureWarning)  # torch.cuda.amp deprecation
  logging.basicConfig(level=logging.WARNING)

  if args.threads:
    torch.set_num_threads(args.threads)
  import vit_mutual.tasks.worker as worker_mod
  import vit_mutual.tasks.worker_mutual as mutual_mod
  import vit_mutual.utils as vit_utils
  from cv_lib.config_parsing import get_cfg
  from cv_lib.optimizers import get_optimizer
  from cv_lib.schedulers import get_scheduler
  from vit_mutual.loss import get_loss_fn
  from vit_mutual.models import get_model
  from vit_mutual.models.mutual import get_mutual_model

  # The Trainers' __init__ open a TensorBoard writer; train_iter uses it only when it logs.
  worker_mod.get_tb_writer = lambda *a, **k: (None, None)
  mutual_mod.get_tb_writer = lambda *a, **k: (None, None)

  if args.device == "auto":
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
  else:
    device = torch.device("cuda:0" if args.device == "cuda" else args.device)
  cuda = device.type == "cuda"
  if cuda:
    # as the official workers do
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_device(device)
    dev_name = torch.cuda.get_device_name(device)
  else:
    dev_name = f"cpu ({torch.get_num_threads()} threads)"
  tmp = tempfile.mkdtemp(prefix="time_authors_")
  log_args = vit_utils.LogArgs(None, tmp, "harness", tmp)
  default_tf32 = torch.backends.cuda.matmul.allow_tf32

  def sync():
    if cuda:
      torch.cuda.synchronize(device)

  def common(model, cfg, use_amp):
    """The arguments both official trainers take alike, as their workers pass them."""
    loss = get_loss_fn(cfg["loss"])
    loss.to(device)
    return dict(
      train_cfg=cfg["training"],
      log_args=log_args,
      train_loader=LengthOnlyLoader(782),
      val_loader=None,
      model=model,
      loss=loss,
      loss_weights=cfg["loss"]["weight_dict"],
      evaluator=None,
      distributed=False,
      device=device,
      resume="",
      use_amp=use_amp,
    )

  def build(mode, use_amp):
    cfg = get_cfg(os.path.join(repo, CONFIGS[mode]))
    train_cfg = cfg["training"]
    train_cfg["print_interval"] = 10**12  # never log (a log step syncs and writes TB)
    if mode == "vit":
      model_cfg = cfg["model"]
      model_cfg["patch_embed"]["img_size"] = args.image_size
      if args.patch_size:
        model_cfg["patch_embed"]["patch_size"] = args.patch_size
      # --- as vit_mutual.tasks.worker.worker ---
      model = get_model(model_cfg, args.num_classes)
      model.to(device)
      optimizer = get_optimizer(model.parameters(), train_cfg["optimizer"])
      lr_scheduler = get_scheduler(optimizer, train_cfg["lr_schedule"])
      trainer = worker_mod.Trainer(
        optimizer=optimizer, lr_scheduler=lr_scheduler, **common(model, cfg, use_amp)
      )
      clip = train_cfg.get("clip_max_norm")
      patch = model_cfg["patch_embed"]["patch_size"]
      params = sum(p.numel() for p in model.parameters())
    else:
      mutual_cfg = cfg["mutual"]
      vit_cfg = mutual_cfg["cfg"]["vit"]
      vit_cfg["patch_embed"]["img_size"] = args.image_size
      if args.patch_size:
        vit_cfg["patch_embed"]["patch_size"] = args.patch_size
        if "patch_size" in mutual_cfg["cfg"]["cnn"]["input_proj"]:  # The vit_like stem only.
          mutual_cfg["cfg"]["cnn"]["input_proj"]["patch_size"] = args.patch_size
      # --- as vit_mutual.tasks.worker_mutual.mutual_worker ---
      model = get_mutual_model(mutual_cfg["cfg"], args.num_classes)
      model.to(device)
      optimizers, lr_schedulers = mutual_mod.get_mutual_learners(train_cfg, mutual_cfg, model)
      trainer = mutual_mod.MutualTrainer(
        mutual_cfg=mutual_cfg,
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        master_model_name=mutual_cfg["master"],
        **common(model, cfg, use_amp),
      )
      clip = mutual_cfg["cfg"]["joint"].get("clip_max_norm")
      patch = vit_cfg["patch_embed"]["patch_size"]
      params = sum(p.numel() for p in model.parameters())  # shared weights counted once
    trainer.iter = 1  # iter 0 would log; the epoch stays 0 (loss-weight decay factor 1)
    return trainer, dict(config=CONFIGS[mode], clip_max_norm=clip, patch_size=patch, params=params)

  rows = []
  out_fp = open(args.out, "a") if args.out else None

  def emit(row):
    line = json.dumps(row)
    print(line, flush=True)
    if out_fp:
      out_fp.write(line + "\n")
      out_fp.flush()

  for mode in [m for m in args.modes.split(",") if m]:
    for dtype in [d for d in args.dtypes.split(",") if d]:
      row = {
        "item": "authors",
        "mode": mode,
        "batch": args.batch,
        "img_per_s": None,
        "step_s": None,
        "device": dev_name,
        "torch": torch.__version__,
        "dtype": dtype,
        "image_size": args.image_size,
        "num_classes": args.num_classes,
      }
      if dtype not in ("float32", "tf32", "amp"):
        raise SystemExit(f"unknown dtype {dtype}")
      if dtype != "float32" and not cuda:
        row["skipped"] = f"{dtype} needs CUDA"
      elif elapsed() > args.budget_s:
        row["skipped"] = f"budget {args.budget_s:.0f} s spent"
      if "skipped" in row:
        emit(row)
        continue
      torch.backends.cuda.matmul.allow_tf32 = True if dtype == "tf32" else default_tf32
      torch.manual_seed(args.seed)
      t_build = time.perf_counter()
      trainer, info = build(mode, use_amp=(dtype == "amp"))
      row.update(info)
      g = torch.Generator().manual_seed(args.seed)
      x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
      y = torch.randint(0, args.num_classes, (args.batch,), generator=g)
      if args.host_batch:
        x = x.pin_memory() if cuda else x
      else:
        x, y = x.to(device), y.to(device)
      if cuda:
        torch.cuda.reset_peak_memory_stats(device)
      sync()
      build_s = time.perf_counter() - t_build

      def step(trainer=trainer, x=x, y=y):
        # train_iter moves x and the target dict to the device (a no-op when already there)
        trainer.train_iter(x, {"label": y})

      t0 = time.perf_counter()
      for _ in range(args.warmup):
        step()
      sync()
      warmup_s = time.perf_counter() - t0
      times, truncated = [], False
      for i in range(args.steps):
        if i > 0 and elapsed() > args.budget_s:
          truncated = True
          break
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
      step_s = statistics.median(times)
      row.update(
        {
          "img_per_s": round(args.batch / step_s, 2),
          "step_s": round(step_s, 6),
          "step_s_mean": round(statistics.fmean(times), 6),
          "step_s_min": round(min(times), 6),
          "steps": len(times),
          "warmup": args.warmup,
          "truncated": truncated,
          "warmup_s": round(warmup_s, 3),
          "build_s": round(build_s, 3),
          "amp": dtype == "amp",
          "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
          "cudnn_tf32": torch.backends.cudnn.allow_tf32,
          "cudnn_benchmark": torch.backends.cudnn.benchmark,
          "batch_on_device": not args.host_batch,
          "stubs": [s.split(" ")[0] for s in STUBBED],
        }
      )
      if cuda:
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
      emit(row)
      rows.append(row)
      del trainer, x, y
      if cuda:
        torch.cuda.empty_cache()
  torch.backends.cuda.matmul.allow_tf32 = default_tf32
  if out_fp:
    out_fp.close()
  print(
    json.dumps(
      {
        "item": "authors_summary",
        "rows": len(rows),
        "stubs": STUBBED,
        "wall_s": round(elapsed(), 1),
      }
    ),
    flush=True,
  )


if __name__ == "__main__":
  main()

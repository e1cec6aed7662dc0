r"""Table 1's "Pre-trained ViTs" rows: a ViT pre-trained on ImageNet-1k, fine-tuned on CIFAR.

Args (comma-separated): dataset=cifar10|cifar100 (default cifar100), vit=vit_b|vit_s (default
vit_b), weights=PATH (default below), mode=vit (default; joint/shared bootstrap from the
pre-trained ViT), lr=LR, epochs=N, and the method switches of configs/vits_cifar100.py.

ViT-B row (the paper's ViT-B is DeiT-S: 384 wide, 12 layers, 6 heads, LayerNorm eps 1e-6, "initial
weights from the official repository of DeiT"). Fetch timm's `deit_small_patch16_224.fb_in1k`
`model.safetensors` (Hugging Face hub, timm/deit_small_patch16_224.fb_in1k) to
pretrained/deit_small_patch16_224.safetensors, or convert DeiT's own .pth once with
`python -m vitboot_jax.tools.convert_checkpoint deit_small_patch16_224-cd65a155.pth OUT`, then:
  python -m vitboot_jax.main --config=configs/pretrained_cifar.py:dataset=cifar10,vit=vit_b \
    --workdir=workdirs/pretrained_vitb_c10
ViT-S row (288/6/9, the paper's own model: no public weights). Pre-train it on ImageNet-1k first
(the paper does not say how; this is the official ImageNet recipe on the full training set,
`--config.num_epochs` shortens it), then fine-tune from that workdir:
  python -m vitboot_jax.main --config=configs/vits_imagenet.py:mode=vit,subset=1.0 \
    --workdir=workdirs/vits_in1k_pretrain --config.data.dir=DATA_DIR
  python -m vitboot_jax.main --config=configs/pretrained_cifar.py:dataset=cifar10,vit=vit_s \
    --workdir=workdirs/pretrained_vits_c10
Any other checkpoint: --config.init_from=PATH (.safetensors, .npz, .pth with torch, a workdir).
The 1000-class head is replaced by a fresh CIFAR head; at another image size the position
embeddings are resampled (see the log).

Recipe. The official code has no fine-tuning config: its single-model worker loads
`model.pre_train` and then runs the ViT yaml's training block, so that block is what produced the
published rows and is the default here: 224 px (CIFAR upsampled, pad-4 crop + flip), CIFAR
normalisation, batch 64, 240 epochs, AdamW lr 1e-3 wd 0.05 on every leaf, per-epoch cosine, no
warmup, clip 0.1, ViT-B dropout 0. DeiT's own CIFAR fine-tuning (AdamW lr ~1e-5 at batch 768,
1000 epochs, strong augmentation) is a different recipe; lr= and epochs= change the two knobs
that matter most. Not run by us at this scale (hardware: as configs/vitb_cifar10.py).
Expected final-epoch top-1 (paper, CIFAR-10 / CIFAR-100): pre-trained ViT-S 95.70 / 80.91,
pre-trained ViT-B 97.17 / 84.95.
"""

from vitboot_jax import configlib

DEFAULT_WEIGHTS = {
  "vit_b": "pretrained/deit_small_patch16_224.safetensors",
  "vit_s": "workdirs/vits_in1k_pretrain",
}


def get_config(arg=None):
  args = configlib.parse_arg(arg)
  dataset = args.pop("dataset", "cifar100")
  vit = args.pop("vit", "vit_b")
  if vit not in DEFAULT_WEIGHTS:
    raise ValueError(f"vit={vit!r} has no pre-trained row; choose one of {sorted(DEFAULT_WEIGHTS)}")
  weights = args.pop("weights", DEFAULT_WEIGHTS[vit])
  lr, epochs = args.pop("lr", None), args.pop("epochs", None)
  args.setdefault("mode", "vit")
  c = configlib.paper_config(dataset, vit, ",".join(f"{k}={v}" for k, v in args.items()))
  c.init_from = weights
  if lr is not None:
    c.optim.lr = float(lr)
  if epochs is not None:
    c.num_epochs = int(epochs)
  return c

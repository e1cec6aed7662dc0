"""The resolved recipe of every paper row that tools/sweep/__main__.py runs, as data.

Values are the authors': github zhfeing/Bootstrapping-ViTs-pytorch at 85f12e9 (paths relative to
its root) with its library cv-lib-PyTorch at tag bootstrapping_vits ("cvlib:"), as read field by
field in docs/reference/official_recipe_audit.md and official_pytorch_code.md. Where this
project deliberately runs something else, the value is ours and its comment says what the
authors do (docs/differences.md). Nothing here is computed from the project's code.

RECIPES maps a runner row's config ("configs/<file>.py:<args>") to its flattened config fields
("optim.lr"); "normalisation.mean" / "normalisation.std" are the resolved per-channel values.
tests/test_paper_recipes.py compares every row with get_config(args).
"""

# ---------------------------------------------------------------------------------------------
# Blocks, each the values of one place in the authors' code. Rows below combine them.

# Every config's `training` block: 240 epochs, global batch 64 (2 GPUs x 32, drop_last), 224 px.
RUN = {
  "num_epochs": 240,
  "total_steps": -1,
  "batch_size": 64,
  "image_size": 224,
  # Authors: fp16 autocast + GradScaler in joint/shared runs (--use-amp), float32 elsewhere.
  "compute_dtype": "float32",
  "sam.rho": 0.0,
}

# cvlib:cv_lib/optimizers/__init__.py + every `training.optimizer`: AdamW 1e-3 / 0.05 over every
# parameter (no no-decay groups), torch's betas and eps; CosineAnnealingLR(T_max=240) stepped once
# per epoch, eta_min 0, no warmup (no config sets warmup_iters).
ADAMW = {
  "optim.name": "adamw",
  "optim.lr": 1e-3,
  "optim.weight_decay": 0.05,
  "optim.decay_all": True,
  "optim.b1": 0.9,
  "optim.b2": 0.999,
  "optim.eps": 1e-8,
  "optim.momentum": 0.0,
  "optim.schedule": "cosine_epoch",
  "optim.warmup_epochs": 0.0,
}

# config/cifar100/cnn/{resnet50,efficientnet_b2}.yaml: SGD lr 0.05, wd 5e-4 on every parameter,
# momentum unset (torch's 0), cosine 240 per epoch, no clip_max_norm.
SGD = {
  "optim.name": "sgd",
  "optim.lr": 0.05,
  "optim.weight_decay": 5e-4,
  "optim.decay_all": True,
  "optim.momentum": 0.0,
  "optim.schedule": "cosine_epoch",
  "optim.warmup_epochs": 0.0,
  "optim.clip_norm": 0.0,
}

# vit_mutual/tasks/worker.py clips at the vit yaml's clip_max_norm 0.1.
CLIP_VIT_WORKER = {"optim.clip_norm": 0.1}
# No clipping in effect: agent/CNN yamls set none; sam_train_worker.py ignores clip_max_norm 1.0;
# worker_mutual.py clips a used-up parameter generator, so only iteration 0 (joint-B 2.0, shared-B
# 0.1) is clipped.
NO_CLIP = {"optim.clip_norm": 0.0}

# vit_mutual/data/aug.py + cvlib:cv_lib/classification/data: CIFAR train = zero-pad 4, crop 32,
# flip, bilinear resize to 224; test = resize 224; full split, new permutation every epoch
# (cached decoded images: our shuffle covers the whole split).
CIFAR100 = {
  "data.name": "cifar100",
  "data.num_classes": 100,
  "data.train_split": "train",
  "data.eval_split": "test",
  "data.train_fraction": 1.0,
  "data.augment": "cifar",
  "data.normalisation": "cifar100",
  # The CIFAR-100 mean with the CIFAR-10 std, as the authors' code.
  "normalisation.mean": (0.5071, 0.4867, 0.4408),
  "normalisation.std": (0.2023, 0.1994, 0.2010),
  "data.cache": True,
  "data.shuffle_buffer": 50_000,
}
# The authors ship CIFAR-100 configs only; their README: set the dataset to cifar_10.
CIFAR10 = {
  "data.name": "cifar10",
  "data.num_classes": 10,
  "data.train_split": "train",
  "data.eval_split": "test",
  "data.train_fraction": 1.0,
  "data.augment": "cifar",
  "data.normalisation": "cifar10",
  "normalisation.mean": (0.4914, 0.4822, 0.4465),
  "normalisation.std": (0.2023, 0.1994, 0.2010),
  "data.cache": True,
  "data.shuffle_buffer": 50_000,
}
# config/imagenet-0.1/*: RandomResizedCrop(224, scale 0.6-1, ratio 3/4-4/3) + flip; val: resize
# 256, centre crop 224, the full 50k; the train subset per class (make_partial), fraction below.
IMAGENET = {
  "data.name": "imagenet2012",
  "data.num_classes": 1000,
  "data.train_split": "train",
  "data.eval_split": "validation",
  "data.augment": "imagenet",
  "data.normalisation": "imagenet",
  "normalisation.mean": (0.485, 0.456, 0.406),
  "normalisation.std": (0.229, 0.224, 0.225),
  "data.cache": False,
  # Authors: a full permutation per epoch; ours streams through a 20k-record shuffle buffer.
  "data.shuffle_buffer": 20_000,
}

# config/cifar100/vit/vit-small.yaml: 288 wide, 6 layers, 9 heads, MLP 1152, dropout 0.1 on
# attention probabilities, MLP hidden and both residuals, LayerNorm eps 1e-5 (torch default),
# patch 16, softmax, the authors' init (patch conv N(0,1), MLP biases N(1e-6, 1)).
VIT_S = {
  "model.patch_size": 16,
  "model.embed_dim": 288,
  "model.depth": 6,
  "model.num_heads": 9,
  "model.mlp_dim": 1152,
  "model.dropout": 0.1,
  "model.ln_eps": 1e-5,
  "model.init": "official",
  "model.attention": "softmax",
  "drloc.weight": 0.0,
}
# config/cifar100/vit/vit-base.yaml: 384 wide, 12 layers, 6 heads, MLP 1536, no dropout, eps 1e-6.
VIT_B = {
  "model.patch_size": 16,
  "model.embed_dim": 384,
  "model.depth": 12,
  "model.num_heads": 6,
  "model.mlp_dim": 1536,
  "model.dropout": 0.0,
  "model.ln_eps": 1e-6,
  "model.init": "official",
  "model.attention": "softmax",
  "drloc.weight": 0.0,
}
# vit-*-entmax.yaml: every softmax -> alpha-entmax (learnable alpha per layer, init 1.5).
ENTMAX = {"model.attention": "entmax"}
# vit-*-sam.yaml + sam_train_worker.py: SAM around AdamW, rho 0.1, non-adaptive.
SAM = {"sam.rho": 0.1}

# The agents' shapes (the agent is built from the model fields): cnn/agent-small*.yaml 288 wide,
# 6 blocks, 3x3 conv (9 taps), MLP 1152; cnn/agent-base*.yaml 384, 12 blocks, 6-head conv, 1536.
AGENT_S_SHAPE = {
  "model.patch_size": 16,
  "model.embed_dim": 288,
  "model.depth": 6,
  "model.num_heads": 9,
  "model.mlp_dim": 1152,
}
AGENT_B_SHAPE = {
  "model.patch_size": 16,
  "model.embed_dim": 384,
  "model.depth": 12,
  "model.num_heads": 6,
  "model.mlp_dim": 1536,
}
# config/cifar100/cnn/agent-small-res_like.yaml + cnn/blocks/input_proj.py (resnet_like, 64 mid
# channels; MaxPool + BN + GELU as the code): pre-norm, avg-pool after blocks 0 and 1, MLP dropout
# 0.1, block (residual) dropout none, BatchNorm eps 1e-5, momentum 0.1 (flax 0.9).
AGENT_S = {
  "agent.stem": "res_like",
  "agent.stem_channels": 64,
  "agent.pre_norm": True,
  "agent.downsample_after": (0, 1),
  "agent.taps": "official",
  "agent.mlp_dropout": 0.1,
  "agent.residual_dropout": 0.0,
  "agent.bn_momentum": 0.9,
  "agent.bn_eps": 1e-5,
  "agent.init": "official",
}
# config/cifar100/cnn/agent-small.yaml: the ViT-like (patch) stem, no down-sampling.
AGENT_S_BASE_STEM = {
  "agent.stem": "patch",
  "agent.stem_channels": 64,
  "agent.pre_norm": True,
  "agent.downsample_after": (),
  "agent.taps": "official",
  "agent.mlp_dropout": 0.1,
  "agent.residual_dropout": 0.0,
  "agent.bn_momentum": 0.9,
  "agent.bn_eps": 1e-5,
  "agent.init": "official",
}
# config/cifar100/cnn/agent-base-res_like.yaml: post-norm, avg-pool after blocks 2 and 8, the
# 6-head conv on the first 6 raster taps of the 3x3 window (cnn/blocks/conv.py).
AGENT_B = {
  "agent.stem": "res_like",
  "agent.stem_channels": 64,
  "agent.pre_norm": False,
  "agent.downsample_after": (2, 8),
  "agent.taps": "official",
  "agent.mlp_dropout": 0.1,
  "agent.residual_dropout": 0.0,
  "agent.bn_momentum": 0.9,
  "agent.bn_eps": 1e-5,
  "agent.init": "official",
}
# shared/*.yaml + mutual/__init__.py get_joint_model: the shared agent takes its dropout from
# the ViT's transformer cfg (S: 0.1 on MLP and residuals; B: none).
SHARED_AGENT_S = {**AGENT_S, "agent.mlp_dropout": 0.1, "agent.residual_dropout": 0.1}
SHARED_AGENT_B = {**AGENT_B, "agent.mlp_dropout": 0.0, "agent.residual_dropout": 0.0}

# vit_mutual/tasks/worker.py: one model, cross-entropy only (no smoothing).
CE_VIT = {"loss.ce_vit": 1.0}
CE_AGENT = {"loss.ce_agent": 1.0}
CE_CNN = {"loss.ce_cnn": 1.0}
# config/*/joint/*.yaml + vit_mutual/loss: cls 1, kd 1 both ways (T 4, T^2 KL batchmean), hint_vit
# 10 (hint_cnn 0): LayerNorm without affine on both sides + MSE, cls token dropped, the longer
# sequence 1-D average-pooled (auto_resample), decay max(0, 1 - e/240) per epoch
# (utils/decay_strategy.py).
JOINT_LOSS = {
  "loss.ce_vit": 1.0,
  "loss.ce_agent": 1.0,
  "loss.kd_vit": 1.0,
  "loss.kd_agent": 1.0,
  "loss.feature_vit": 10.0,
  "loss.temperature": 4.0,
  "loss.feature_loss": "official",
  "loss.adapt": "seq1d",
  "loss.feature_decay": "epoch",
}
# config/*/shared/*.yaml + worker_mutual.py: .5 on each CE and KD, hint_vit 5, one summed loss,
# one backward, one AdamW: no Align (align "none").
SHARED_LOSS = {
  "loss.ce_vit": 0.5,
  "loss.ce_agent": 0.5,
  "loss.kd_vit": 0.5,
  "loss.kd_agent": 0.5,
  "loss.feature_vit": 5.0,
  "loss.temperature": 4.0,
  "loss.feature_loss": "official",
  "loss.adapt": "seq1d",
  "loss.feature_decay": "epoch",
  "align": "none",
  "align_granularity": "global",
}
# Not the authors' code: the paper's Algorithm 1 (Align on the shared weights' gradients).
PAPER_ALIGN = {"align": "pcgrad"}


# ---------------------------------------------------------------------------------------------
# Rows.


def _cifar(dataset: str, data: dict) -> dict[str, dict]:
  """Table 1 on one CIFAR dataset (config/cifar100/<file>; CIFAR-10 the same with cifar_10)."""
  s, b = f"configs/vits_{dataset}.py:", f"configs/vitb_{dataset}.py:"
  base = {**RUN, **ADAMW, **data}
  return {
    # cnn/agent-small-res_like.yaml
    s + "mode=agent": {**base, "mode": "agent", **NO_CLIP, **AGENT_S_SHAPE, **AGENT_S, **CE_AGENT},
    # cnn/agent-base-res_like.yaml
    b + "mode=agent": {**base, "mode": "agent", **NO_CLIP, **AGENT_B_SHAPE, **AGENT_B, **CE_AGENT},
    # vit/vit-small.yaml
    s + "mode=vit": {**base, "mode": "vit", **CLIP_VIT_WORKER, **VIT_S, **CE_VIT},
    # vit/vit-base.yaml
    b + "mode=vit": {**base, "mode": "vit", **CLIP_VIT_WORKER, **VIT_B, **CE_VIT},
    # joint/agent-small-res_like-vit-small.yaml -> cnn/agent-small-res_like.yaml + vit-small.yaml
    s + "mode=joint": {**base, "mode": "joint", **NO_CLIP, **VIT_S, **AGENT_S, **JOINT_LOSS},
    # joint/agent-base-res_like-vit-base.yaml -> cnn/agent-base-res_like.yaml + vit/vit-base.yaml
    b + "mode=joint": {**base, "mode": "joint", **NO_CLIP, **VIT_B, **AGENT_B, **JOINT_LOSS},
    # shared/agent-small-res_like-vit-small.yaml (the authors' README also names the patch-stem
    # shared/agent-small-vit-small.yaml for this row; Table 5 favours the res-like agent)
    s + "mode=shared,align=none": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_S,
      **SHARED_AGENT_S,
      **SHARED_LOSS,
    },
    # shared/agent-small-res_like-vit-small.yaml + the paper's Algorithm 1
    s + "mode=shared,align=pcgrad": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_S,
      **SHARED_AGENT_S,
      **SHARED_LOSS,
      **PAPER_ALIGN,
    },
    # shared/agent-base-res_like-vit-base.yaml
    b + "mode=shared,align=none": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_B,
      **SHARED_AGENT_B,
      **SHARED_LOSS,
    },
    # shared/agent-base-res_like-vit-base.yaml + the paper's Algorithm 1
    b + "mode=shared,align=pcgrad": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_B,
      **SHARED_AGENT_B,
      **SHARED_LOSS,
      **PAPER_ALIGN,
    },
    # vit/vit-small-sam.yaml (sam_train_worker.py)
    s + "mode=vit,sam=1": {**base, "mode": "vit", **NO_CLIP, **VIT_S, **SAM, **CE_VIT},
    # vit/vit-base-sam.yaml
    b + "mode=vit,sam=1": {**base, "mode": "vit", **NO_CLIP, **VIT_B, **SAM, **CE_VIT},
    # vit/vit-small-entmax.yaml; also the authors' vit-base-entmax.yaml, a byte-identical copy.
    s + "mode=vit,attention=entmax": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_S,
      **ENTMAX,
      **CE_VIT,
    },
    # Not a shipped config: vit/vit-base.yaml with entmax, the paper's ViT-B-Sparse label.
    b + "mode=vit,attention=entmax": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_B,
      **ENTMAX,
      **CE_VIT,
    },
    # Pre-trained ViTs: the authors ship no fine-tuning config; their single-model worker loads
    # `model.pre_train` and then runs the vit yaml's training block, which is what these pin.
    f"configs/pretrained_cifar.py:dataset={dataset},vit=vit_s": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_S,
      **CE_VIT,
      "init_from": "workdirs/vits_in1k_pretrain",
    },
    # vit/vit-base.yaml from DeiT-S's ImageNet-1k weights (timm deit_small_patch16_224.fb_in1k).
    f"configs/pretrained_cifar.py:dataset={dataset},vit=vit_b": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_B,
      **CE_VIT,
      "init_from": "pretrained/deit_small_patch16_224.safetensors",
    },
    # cnn/resnet50.yaml (cvlib ImageNet-style resnet50 at 224 px)
    f"configs/cnn_baselines.py:model=resnet50,dataset={dataset}": {
      **RUN,
      **SGD,
      **data,
      "mode": "cnn",
      "cnn.name": "resnet50",
      **CE_CNN,
    },
    # cnn/efficientnet_b2.yaml (timm efficientnet_b2, no dropout / drop-path)
    f"configs/cnn_baselines.py:model=efficientnet_b2,dataset={dataset}": {
      **RUN,
      **SGD,
      **data,
      "mode": "cnn",
      "cnn.name": "efficientnet_b2",
      **CE_CNN,
    },
  }


def _ablation() -> dict[str, dict]:
  """Tables 4 and 5 (CIFAR-100, ViT-S joint). Table 4 ships no configs: joint/agent-small-
  res_like-vit-small.yaml with one loss switch. Table 5's "Base" agent: cnn/agent-small.yaml."""
  s = "configs/vits_cifar100.py:"
  joint = {**RUN, **ADAMW, **CIFAR100, "mode": "joint", **NO_CLIP, **VIT_S, **AGENT_S, **JOINT_LOSS}
  return {
    s + "mode=joint,feature=0": {**joint, "loss.feature_vit": 0.0},  # KD Only
    s + "mode=joint,kd=0": {**joint, "loss.kd_vit": 0.0, "loss.kd_agent": 0.0},  # Feat Only
    s + "mode=joint,kd=0,decay=none": {  # Feat Only, No Decay: a constant feature weight
      **joint,
      "loss.kd_vit": 0.0,
      "loss.kd_agent": 0.0,
      "loss.feature_decay": "none",
    },
    s + "mode=joint,kd=0,adapt=pool2d": {  # Feat Only, AP-2D: 2-D average pooling
      **joint,
      "loss.kd_vit": 0.0,
      "loss.kd_agent": 0.0,
      "loss.adapt": "pool2d",
    },
    s + "mode=joint,decay=none": {**joint, "loss.feature_decay": "none"},  # Both, No Decay
    # cnn/agent-small.yaml (Table 5 "Base")
    s + "mode=agent,agent=base": {
      **RUN,
      **ADAMW,
      **CIFAR100,
      "mode": "agent",
      **NO_CLIP,
      **AGENT_S_SHAPE,
      **AGENT_S_BASE_STEM,
      **CE_AGENT,
    },
    # joint/agent-small-vit-small.yaml -> cnn/agent-small.yaml + vit/vit-small.yaml
    s + "mode=joint,agent=base": {**joint, **AGENT_S_BASE_STEM},
  }


def _imagenet(fraction: float) -> dict[str, dict]:
  """Table 3 on one subset: config/imagenet-0.1/<file> with make_partial = `fraction` (only the
  10% configs ship; every ImageNet config differs from its CIFAR twin only in `dataset`)."""
  b = f"configs/vitb_imagenet.py:subset={fraction},"
  data = {**IMAGENET, "data.train_fraction": fraction}
  base = {**RUN, **ADAMW, **data}
  return {
    # cnn/agent-base-res_like.yaml
    b + "mode=agent": {**base, "mode": "agent", **NO_CLIP, **AGENT_B_SHAPE, **AGENT_B, **CE_AGENT},
    # vit/vit-base.yaml
    b + "mode=vit": {**base, "mode": "vit", **CLIP_VIT_WORKER, **VIT_B, **CE_VIT},
    # joint/agent-base-res_like-vit-base.yaml
    b + "mode=joint": {**base, "mode": "joint", **NO_CLIP, **VIT_B, **AGENT_B, **JOINT_LOSS},
    # shared/agent-base-res_like-vit-base.yaml
    b + "mode=shared,align=none": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_B,
      **SHARED_AGENT_B,
      **SHARED_LOSS,
    },
    # shared/agent-base-res_like-vit-base.yaml + the paper's Algorithm 1
    b + "mode=shared,align=pcgrad": {
      **base,
      "mode": "shared",
      **NO_CLIP,
      **VIT_B,
      **SHARED_AGENT_B,
      **SHARED_LOSS,
      **PAPER_ALIGN,
    },
    # vit/vit-base-sam.yaml
    b + "mode=vit,sam=1": {**base, "mode": "vit", **NO_CLIP, **VIT_B, **SAM, **CE_VIT},
    # Not a shipped config: vit/vit-base.yaml with entmax (the paper's label).
    b + "mode=vit,attention=entmax": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_B,
      **ENTMAX,
      **CE_VIT,
    },
    # vit/vit-base-entmax.yaml as shipped: a copy of vit-small-entmax.yaml (ViT-S shape).
    f"configs/vits_imagenet.py:subset={fraction},mode=vit,attention=entmax": {
      **base,
      "mode": "vit",
      **CLIP_VIT_WORKER,
      **VIT_S,
      **ENTMAX,
      **CE_VIT,
    },
    # cnn/resnet50.yaml
    f"configs/cnn_baselines.py:model=resnet50,dataset=imagenet,subset={fraction}": {
      **RUN,
      **SGD,
      **data,
      "mode": "cnn",
      "cnn.name": "resnet50",
      **CE_CNN,
    },
  }


RECIPES: dict[str, dict] = {
  **_cifar("cifar10", CIFAR10),
  **_cifar("cifar100", CIFAR100),
  **_ablation(),
  **_imagenet(0.05),
  **_imagenet(0.1),
  **_imagenet(0.5),
}

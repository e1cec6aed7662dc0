"""The device plan (launch/device_plan.py): its order, its budget and its guards; the
measurements themselves need the accelerator (docs/accelerators.md)."""

import json
import sys

import pytest

from launch import device_plan
from tests.config_files import load_config
from vitboot_jax import sharding
from vitboot_jax.base import errors


def test_the_issue_targets_come_first_and_every_item_once():
  ctx = device_plan.Context(config=None, mesh=None, plan=device_plan.Plan(), peak={})
  names = [name for name, _ in device_plan.items(ctx)]
  assert names[:4] == [
    "step/vit/64/bfloat16",
    "step/shared/64/bfloat16",
    "steps_per_call/vit/64/bfloat16",
    "steps_per_call/shared/64/bfloat16",
  ]
  assert names[4:7] == ["timm/64", "hint_shares/shared/64/bfloat16", "timm/256"]
  assert len(names) == len(set(names))
  every_step = {
    f"step/{m}/{b}/{d}"
    for m in device_plan.MODES
    for b in (64, 256)
    for d in ("bfloat16", "float32")
  }
  assert every_step <= set(names)
  assert {"attention/64/bfloat16", "eval/vit/bfloat16", "eval/shared/bfloat16"} <= set(names)


def test_past_the_budget_items_are_listed_not_run():
  printed = []
  plan = device_plan.Plan(budget_s=0.0, peak_size=64, steps=3)
  rows = device_plan.run(load_config("tiny_config"), plan, emit=printed.append)
  assert [json.loads(line) for line in printed] == rows
  assert rows[0]["item"] == "peak" and rows[0]["bfloat16_flops_per_s"] > 0
  assert rows[-1]["item"] == "done" and len(rows) == 2
  assert rows[-1]["skipped_over_budget"][0] == "step/vit/64/bfloat16"


def test_a_later_call_skips_what_an_earlier_one_measured():
  done = ["step/vit/64/bfloat16", "steps_per_call/vit/64/bfloat16"]
  plan = device_plan.Plan(budget_s=0.0, peak_size=64, steps=3, skip=done)
  rows = device_plan.run(load_config("tiny_config"), plan, emit=lambda line: None)
  assert rows[-1]["skipped_as_asked"] == done
  over = rows[-1]["skipped_over_budget"]
  assert over[0] == "step/shared/64/bfloat16" and not set(done) & set(over)
  typo = device_plan.Plan(budget_s=0.0, skip=["step/vit/64/bf16"])
  with pytest.raises(errors.UsageError, match="step/vit/64/bf16"):
    device_plan.run(load_config("tiny_config"), typo, emit=lambda line: None)


def test_timm_is_skipped_with_a_note_without_torch(monkeypatch):
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError.
  ctx = device_plan.Context(load_config("vits_cifar100"), None, device_plan.Plan(), {})
  row = device_plan.timm_row(ctx, 64)
  assert row["item"] == "timm" and "torch/timm absent" in row["skipped"]


@pytest.mark.slow
def test_the_hint_shares_row_times_the_step_without_and_with_the_diagnostic():
  plan = device_plan.Plan(steps=2)
  ctx = device_plan.Context(load_config("tiny_config"), sharding.make_mesh(), plan, {})
  row = device_plan.hint_shares_row(ctx, "shared", 16, "float32")
  assert row["step_s_off"] > 0 and row["step_s_on"] > 0
  assert row["slowdown_on"] == pytest.approx(row["step_s_on"] / row["step_s_off"])
  # The conditional keeps the ViT's forward residuals alive through the step.
  assert row["temp_bytes_on"] > row["temp_bytes_off"]

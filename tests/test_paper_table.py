"""The paper-table runner: every row is a valid config, and the report reads final.json."""

import json
import pathlib

import pytest

from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.tools import paper_table

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(row):
  return load_config(row.config)


@pytest.mark.parametrize("table", paper_table.TABLES)
def test_every_row_is_a_valid_config_of_its_model(table):
  rows = paper_table.rows(table)
  assert len(rows) == {"cifar10": 25, "cifar100": 25, "imagenet": 27, "ablation": 10}[table]
  for row in rows:
    config = _config(row)
    configlib.validate(config)
    expected_mode = {"cnn": "cnn"}.get(row.model, config.mode)
    assert config.mode == expected_mode, row
    if "sam=1" in row.config:
      assert config.sam.rho == 0.1
    if "entmax" in row.config:
      assert config.model.attention == "entmax"
    classes = {"cifar10": 10, "cifar100": 100, "imagenet": 1000, "ablation": 100}[table]
    assert config.data.num_classes == classes


@pytest.mark.parametrize("table", ["cifar10", "cifar100", "imagenet"])
def test_shared_and_sparse_b_rows_run_both_recipes(table):
  """Shared: the authors' summed gradients and the paper's Align; Sparse-B: ViT-B with entmax
  and the authors' shipped config (ViT-S shape), each labelled."""
  rows = paper_table.rows(table)
  shared = {(r.recipe, _config(r).align) for r in rows if r.name.startswith("Ours-Shared")}
  assert shared == {(paper_table.CODE, "none"), (paper_table.ALIGN, "pcgrad")}
  sparse_b = {(r.recipe, _config(r).model.embed_dim) for r in rows if "ViT-B-Sparse" in r.name}
  assert sparse_b == {(paper_table.PAPER_B, 384), (paper_table.SHIPPED_S, 288)}


def test_table4_rows_switch_one_loss_term():
  by_name = {r.name: _config(r) for r in paper_table.rows("ablation")}
  both = by_name["T4 Both (Ours-Joint S)"]
  assert (both.loss.kd_vit, both.loss.feature_vit, both.loss.feature_decay) == (1.0, 10.0, "epoch")
  assert by_name["T4 KD Only"].loss.feature_vit == 0.0
  assert by_name["T4 Feat Only"].loss.kd_vit == by_name["T4 Feat Only"].loss.kd_agent == 0.0
  assert by_name["T4 Feat Only, No Decay"].loss.feature_decay == "none"
  assert by_name["T4 Both, No Decay"].loss.feature_decay == "none"
  assert by_name["T4 Feat Only, AP-2D"].loss.adapt == "pool2d"


def test_report_reads_final_json(tmp_path):
  rows = paper_table.rows("cifar100")
  shared_s = [r for r in rows if r.name == "Ours-Shared S"]
  workdir = pathlib.Path(paper_table.command(shared_s[0], tmp_path, [])[4].split("=", 1)[1])
  workdir.mkdir(parents=True)
  (workdir / "final.json").write_text(
    json.dumps({"top1_vit": 0.7512, "top1_agent": 0.7, "epochs": 240})
  )
  report = paper_table.report("cifar100", tmp_path, [])
  assert "| Ours-Shared S | vit | authors' code | 75.50 | 75.12 | 240 |" in report
  assert "| Ours-Shared S | agent | authors' code | 74.06 | 70.00 | 240 |" in report
  assert report.count("not run") == len(rows) - 2


@pytest.mark.parametrize(
  "arg, field",
  [("decay=linear", "config.loss.feature_decay='linear'"), ("adapt=bilinear", "config.loss.adapt")],
)
def test_bad_ablation_switch_names_the_field(arg, field):
  config = load_config("vits_cifar100", f"mode=joint,{arg}")
  with pytest.raises(ValueError, match=field.replace("(", r"\(")):
    configlib.validate(config)

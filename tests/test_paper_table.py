"""The paper-table runner: every row is a valid config, and the report reads final.json."""

import importlib.util
import json
import pathlib

import pytest

from vitboot_jax import configlib
from vitboot_jax.tools import paper_table

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(row):
  path, _, arg = row.config.partition(":")
  spec = importlib.util.spec_from_file_location("row", REPO / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("table", ["cifar10", "cifar100", "imagenet"])
def test_every_row_is_a_valid_config_of_its_model(table):
  rows = paper_table.rows(table)
  assert len(rows) == (20 if table != "imagenet" else 21)
  for row in rows:
    config = _config(row)
    configlib.validate(config)
    expected_mode = {"cnn": "cnn"}.get(row.model, config.mode)
    assert config.mode == expected_mode, row
    if "sam=1" in row.config:
      assert config.sam.rho == 0.1
    if "entmax" in row.config:
      assert config.model.attention == "entmax"
    if "vitb" in row.config:
      assert config.model.embed_dim == 384  # Sparse-B really is ViT-B here.
    classes = {"cifar10": 10, "cifar100": 100, "imagenet": 1000}[table]
    assert config.data.num_classes == classes


def test_report_reads_final_json(tmp_path):
  rows = paper_table.rows("cifar100")
  shared_s = [r for r in rows if r.name == "Ours-Shared S"]
  workdir = pathlib.Path(paper_table.command(shared_s[0], tmp_path, [])[4].split("=", 1)[1])
  workdir.mkdir(parents=True)
  (workdir / "final.json").write_text(
    json.dumps({"top1_vit": 0.7512, "top1_agent": 0.7, "epochs": 240})
  )
  report = paper_table.report("cifar100", tmp_path, [])
  assert "| Ours-Shared S | vit | 75.50 | 75.12 | 240 |" in report
  assert "| Ours-Shared S | agent | 74.06 | 70.00 | 240 |" in report
  assert report.count("not run") == len(rows) - 2

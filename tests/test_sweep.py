"""The sweep runner's paper tables: valid rows, the paper's numbers, runnable printed commands."""

import json
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.tools.sweep import paper_results, study_rows
from vitboot_jax.tools.sweep import report as sweep_report
from vitboot_jax.tools.sweep import rules as sweep_rules
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import tables as sweep_tables

REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(config):
  return load_config(config)


def _lines(table):
  """(row, model) pairs the table reports: the report's lines."""
  return [(row, model) for row in sweep_tables.rows(table) for model in row.models]


@pytest.mark.parametrize("table", sweep_tables.PAPER_TABLES)
def test_every_row_is_a_valid_config_of_its_model(table):
  assert (
    len(_lines(table)) == {"cifar10": 25, "cifar100": 25, "imagenet": 27, "ablation": 10}[table]
  )
  for row in sweep_tables.rows(table):
    config = _config(row.config)
    configlib.validate(config)
    if row.models == ("cnn",):
      assert config.mode == "cnn", row
    else:
      assert config.mode in ("vit", "agent", "joint", "shared"), row
      assert set(row.models) <= {"vit", "agent"} and (
        len(row.models) == 2 or config.mode in (row.models[0], "joint", "shared")
      ), row
    if "sam=1" in row.config:
      assert config.sam.rho == 0.1
    if "entmax" in row.config:
      assert config.model.attention == "entmax"
    classes = {"cifar10": 10, "cifar100": 100, "imagenet": 1000, "ablation": 100}[table]
    assert config.data.num_classes == classes


@pytest.mark.parametrize("table", sweep_tables.PAPER_TABLES)
def test_every_line_has_its_published_number_and_every_number_a_line(table):
  published = paper_results.TABLES[sweep_tables.TABLES[table].paper].top1
  lines = _lines(table)
  for row, model in lines:
    assert paper_results.top1(table, row.name, model) is not None, (row.name, model)
  assert {(r, m) for r, models in published.items() for m in models} == {
    (row.name, model) for row, model in lines
  }


def test_paper_numbers_spot_checks():
  assert paper_results.top1("cifar100", "Ours-Joint S", "vit") == 76.19
  assert paper_results.top1("cifar10", "Ours-Shared B", "agent") == 92.66
  assert paper_results.top1("imagenet", "Ours-Joint 50%", "vit") == 71.36
  assert paper_results.top1("ablation", "T5 Joint base", "agent") == 73.79
  assert paper_results.top1("cifar10", "Agent-S", "vit") is None


def test_markdown_renders_table_1_with_a_column_per_dataset():
  text = paper_results.markdown("cifar10", "cifar100")
  assert "| row | model | CIFAR-10 top-1 (%) | CIFAR-100 top-1 (%) |" in text
  assert "| Ours-Joint S | ViT | 95.14 | 76.19 |" in text
  assert "| Pre-trained ViT-B | ViT | 97.17 | 84.95 |" in text
  assert text.count("\n| ") == 1 + 20  # Header + a line per published (row, model).
  with pytest.raises(ValueError, match="unknown tables"):
    paper_results.markdown("table9")


@pytest.mark.parametrize("table", ["cifar10", "cifar100", "imagenet"])
def test_shared_and_sparse_b_rows_run_both_recipes(table):
  """Shared: the authors' summed gradients and the paper's Align; Sparse-B: ViT-B with entmax
  and the authors' shipped config (ViT-S shape), each labelled."""
  rows = sweep_tables.rows(table)
  shared = {(r.note, _config(r.config).align) for r in rows if r.name.startswith("Ours-Shared")}
  assert shared == {(sweep_tables.CODE, "none"), (sweep_tables.ALIGN, "pcgrad")}
  sparse_b = {(r.note, _config(r.config).model.embed_dim) for r in rows if "ViT-B-Sparse" in r.name}
  assert sparse_b == {(sweep_tables.PAPER_B, 384), (sweep_tables.SHIPPED_S, 288)}


def test_table4_rows_switch_one_loss_term():
  by_name = {r.name: _config(r.config) for r in sweep_tables.rows("ablation")}
  both = by_name["T4 Both (Ours-Joint S)"]
  assert (both.loss.kd_vit, both.loss.feature_vit, both.loss.feature_decay) == (1.0, 10.0, "epoch")
  assert by_name["T4 KD Only"].loss.feature_vit == 0.0
  assert by_name["T4 Feat Only"].loss.kd_vit == by_name["T4 Feat Only"].loss.kd_agent == 0.0
  assert by_name["T4 Feat Only, No Decay"].loss.feature_decay == "none"
  assert by_name["T4 Both, No Decay"].loss.feature_decay == "none"
  assert by_name["T4 Feat Only, AP-2D"].loss.adapt == "pool2d"


def test_rows_of_one_config_share_one_run():
  rows = sweep_tables.rows("cifar100")
  runs = sweep_tables.runs(rows)
  assert len(runs) == len(rows) - 1  # ViT-B-Sparse (shipped) is the ViT-S-Sparse run.
  sparse = [r for r in rows if r.config.endswith("vits_cifar100.py:mode=vit,attention=entmax")]
  assert [r.name for r in sparse] == ["ViT-S-Sparse", "ViT-B-Sparse"]
  assert len({r.run_name for r in sparse}) == 1


def test_report_reads_final_json(tmp_path):
  table = sweep_tables.TABLES["cifar100"]
  s = sweep_runs.settings(table, root=tmp_path)
  shared_s = next(r for r in table.rows if r.name == "Ours-Shared S")
  workdir = sweep_runs.workdir(s, shared_s, 0)
  assert workdir == tmp_path / "vits_cifar100_mode-shared_align-none_seed0"
  workdir.mkdir(parents=True)
  (workdir / "final.json").write_text(
    json.dumps({"top1_vit": 0.7512, "top1_agent": 0.7, "epochs": 240})
  )
  report = sweep_report.table_markdown(sweep_report.build_report(table, s))
  assert "| Ours-Shared S | ViT | authors' code | 75.50 | 75.12 | done | 0 | 240 |" in report
  assert "| Ours-Shared S | agent | authors' code | 74.06 | 70.00 | done | 0 | 240 |" in report
  assert report.count("| not run | not run |") == len(_lines("cifar100")) - 2


def test_bad_ablation_switch_names_the_field():
  for arg, field in [("decay=linear", "config.loss.feature_decay='linear'")]:
    config = _config(f"configs/vits_cifar100.py:mode=joint,{arg}")
    with pytest.raises(ValueError, match=field):
      configlib.validate(config)
  with pytest.raises(ValueError, match="config.loss.adapt"):
    configlib.validate(_config("configs/vits_cifar100.py:mode=joint,adapt=bilinear"))


def _sweep(*args, cwd=REPO):
  return subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.sweep", *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    check=True,
  ).stdout


def test_table_flag_prints_rows_paper_numbers_commands_and_ours():
  """`--table=NAME` alone (the configs' pointer) lists every run: runnable from the repo root."""
  out = _sweep("--table=cifar100", "--override=--config.data.dir=/data/tfds dir")
  lines = out.splitlines()
  assert "run the commands from the repository root" in lines[0]
  commands = [line for line in lines if "vitboot_jax.main" in line and not line.startswith("|")]
  assert len(commands) == len(sweep_tables.runs(sweep_tables.rows("cifar100")))
  for line in commands:
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "vitboot_jax.main"], line
    flags = dict(arg.split("=", 1) for arg in argv[3:])
    assert (REPO / flags["--config"].split(":")[0]).is_file(), line
    assert flags["--workdir"].startswith("workdirs/cifar100/")  # Relative to the repo root.
    assert flags["--config.data.dir"] == "/data/tfds dir"  # Quoted: one argument.
  assert "# Ours-Joint S (authors' code): paper top-1 agent 74.06, ViT 76.19" in lines
  assert "| Ours-Joint S | ViT | authors' code | 76.19 | not run |" in out


def test_markdown_flag_prints_the_paper_table():
  out = _sweep("--table=ablation", "--markdown")
  assert out == sweep_tables.rows_markdown(sweep_tables.TABLES["ablation"])
  assert "| T4 KD Only | 67.16 | `configs/vits_cifar100.py:mode=joint,feature=0` |" in out


def test_paper_tables_take_no_epochs():
  with pytest.raises(ValueError, match="num_epochs"):
    sweep_runs.settings(sweep_tables.TABLES["cifar10"], epochs=3)


_STOPPABLE_RUN = """
import pathlib, signal, sys, time
ready = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (ready.with_suffix(".saved").touch(), sys.exit(143)))
ready.touch()
time.sleep(300)
sys.exit(0)
"""


def test_a_signal_to_the_sweep_stops_the_run_through_its_save(tmp_path):
  ready = tmp_path / "run.ready"

  def interrupt_when_ready():
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
      time.sleep(0.01)
    # Ctrl-C to the sweep, aimed at the thread that handles it: the kernel may hand a signal sent
    # to the process to any thread, and then the one blocked in wait() sleeps on.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

  threading.Thread(target=interrupt_when_ready, daemon=True).start()
  code, received = sweep_runs.run_training(["python", "-c", _STOPPABLE_RUN, str(ready)])
  # The run got SIGTERM (its save path ran) rather than being killed or finishing its sleep.
  assert (code, received) == (143, signal.SIGINT)
  assert ready.with_suffix(".saved").exists()
  assert signal.getsignal(signal.SIGINT) is not None  # The sweep's own handlers are back.


def test_a_run_stopped_by_a_signal_stops_the_sweep(tmp_path, monkeypatch):
  table = sweep_tables.TABLES["replication"]
  s = sweep_runs.settings(table, root=tmp_path, seeds=(0, 1))
  started = []

  def stopped_run(table, s, row, seed):
    started.append((row.name, seed))
    return ["python", "-c", "import sys; sys.exit(143)"]

  monkeypatch.setattr(sweep_runs, "command", stopped_run)
  with pytest.raises(sweep_runs.Stopped, match="SIGTERM") as stop:
    sweep_runs.run_missing(table, s, table.rows[:2])
  assert stop.value.exit_code == 143 and started == [("vit", 0)]


def test_the_helps_report_sets_every_vit_against_the_vit_alone(tmp_path):
  table = sweep_tables.TABLES["helps"]
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0, 1])
  finals = {  # run -> per seed (ViT top-1, agent top-1, training seconds)
    "vit": [(0.50, None, 100.0), (0.52, None, 100.0)],
    "agent": [(None, 0.55, 200.0), (None, 0.56, 200.0)],
    "kd_teacher": [(0.56, 0.55, 50.0), (0.57, 0.56, 50.0)],  # +5.5 points in both seeds.
    "joint": [(0.40, 0.54, 300.0), (0.53, 0.55, 300.0)],  # Below on average, above in seed 1.
  }
  for run, seeds in finals.items():
    for seed, (vit, agent, seconds) in enumerate(seeds):
      wd = tmp_path / f"{run}_seed{seed}"
      wd.mkdir()
      final = {"epochs": 20, "train_seconds_this_run": seconds}
      # The teacher's seed 1 resumed: its time, and so its pupils' compute, is a lower bound.
      final.update({"resumed_from_step": 400} if (run, seed) == ("agent", 1) else {})
      final.update({"top1_vit": vit} if vit is not None else {})
      final.update({"top1_agent": agent} if agent is not None else {})
      (wd / "final.json").write_text(json.dumps(final))
      evals = [{"step": 390, "epoch": 5.0, "eval/top1_vit": (vit or 0) - 0.1}]
      (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
      # The code of each launch; the agent's seed 1 resumed at another, changed checkout.
      codes = [("a" * 40, False)] + ([("b" * 40, True)] if (run, seed) == ("agent", 1) else [])
      if run != "joint":  # The joint's runs predate launches.jsonl.
        launches = [{"code": {"commit": c, "dirty": d}} for c, d in codes]
        (wd / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches))
  report = sweep_report.build_report(table, s)
  by_name = {r["name"]: r for r in report["rows"]}
  kd = by_name["kd_teacher"]["vs_reference"]
  assert kd["diff"] == pytest.approx(5.5) and kd["helps"]
  assert kd["per_seed"] == {0: pytest.approx(6.0), 1: pytest.approx(5.0)}
  assert kd["pooled_std"] == pytest.approx(((0.5 + 2.0) / 2) ** 0.5)  # Sample variances 0.5, 2.
  joint = by_name["joint"]["vs_reference"]
  assert not joint["helps"] and joint["per_seed"][1] > 0
  assert "vs_reference" not in by_name["vit"] and "vs_reference" not in by_name["agent"]
  # A teacher row costs its teacher's training too.
  assert by_name["kd_teacher"]["train_seconds_with_teacher"] == 100.0 + 400.0
  assert by_name["kd_teacher"]["evaluations"][0] == [{"epoch": 5.0, "vit": pytest.approx(46.0)}]
  text = sweep_report.table_markdown(report)
  assert "| kd_teacher | 46.50 | +5.50 ± " in text and "| yes | 8m20s (incl. agent) (*) |" in text
  assert "| no | 10m00s |" in text  # The joint resumed nothing and reads no teacher.
  assert report["run_codes"] == {"aaaaaaa": 6, "bbbbbbb+": 1, "unrecorded": 2}
  assert "`aaaaaaa` (6), `bbbbbbb+` (1), `unrecorded` (2)." in text


def test_well_trained_reuses_the_helps_commands_and_matches_their_compute():
  """Its reference and teacher rows are the helps runs (the same commands, so their records are
  reused), and the matched epochs are the counted ones: ceil(20 x (teacher_corr's step + its
  teacher's) / the ViT's) and ceil(20 x teacher_corr's / the ViT's), MACs an image."""
  import math

  from vitboot_jax.tools import train_compute

  helps, table = sweep_tables.TABLES["helps"], sweep_tables.TABLES["well_trained"]
  s_helps = sweep_runs.settings(helps, root="/r", seeds=[0])
  s_table = sweep_runs.settings(table, root="/r", seeds=[0])
  for name in ("vit", "agent", "teacher_corr", "kd_teacher"):
    (a,) = [r for r in helps.rows if r.name == name]
    (b,) = [r for r in table.rows if r.name == name]
    assert sweep_runs.command(helps, s_helps, a, 0) == sweep_runs.command(table, s_table, b, 0)
  macs = {}
  for name in ("vit", "agent", "teacher_corr"):
    (row,) = [r for r in table.rows if r.name == name]
    config = load_config(row.config).to_dict()
    macs[name] = train_compute._macs_per_image(json.dumps(config, sort_keys=True))
  own, teacher = 20 * macs["teacher_corr"], 20 * macs["agent"]
  assert study_rows.MATCHED_TOTAL_EPOCHS == math.ceil((own + teacher) / macs["vit"])
  assert study_rows.MATCHED_OWN_EPOCHS == math.ceil(own / macs["vit"])
  (deit,) = [r for r in table.rows if r.name == "teacher_corr_deit"]
  assert sweep_tables.teacher_run(deit) == "agent_deit"


def test_the_compute_column_counts_flops_with_the_teacher_apart(tmp_path):
  table = sweep_tables.TABLES["well_trained"]
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0])
  for run in ("vit", "agent", "teacher_corr"):
    source = REPO / "docs" / "helps" / f"{run}_seed0"
    (tmp_path / f"{run}_seed0").mkdir()
    for name in ("config.json", "final.json", "metrics.jsonl"):
      (tmp_path / f"{run}_seed0" / name).write_text((source / name).read_text())
  report = sweep_report.build_report(table, s)
  by_name = {r["name"]: r for r in report["rows"]}
  images = 1560 * 64
  assert by_name["vit"]["train_pflops"][0] == pytest.approx(2 * 216_880_416 * images / 1e15)
  corr = by_name["teacher_corr"]
  assert corr["train_pflops"][0] == pytest.approx(2 * 395_156_160 * images / 1e15)
  assert corr["teacher_pflops"][0] == pytest.approx(2 * 533_057_760 * images / 1e15)
  text = sweep_report.table_markdown(report)
  # teacher_corr and kd_teacher read the same agent run: amortised, each carries half of it.
  shared = "| 0.0789 + 0.1064 teacher (amortised over its 2 students: 0.0532) PFLOPs; "
  assert shared in text and "| 0.0433 PFLOPs; " in text
  assert sweep_report.plot_compute(report, tmp_path).exists()


def test_a_live_runs_torn_last_metrics_line_is_one_warning(tmp_path, caplog):
  """A table read while a run writes: metrics.jsonl's last line half-written is dropped."""
  records = [
    {"step": 5, "epoch": 0.5, "train/hint_grad_ratio": 2.0},
    {"step": 10, "epoch": 1.0, "train/hint_grad_ratio": 4.0, "eval/top1_vit": 0.25},
  ]
  text = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 15, "epoch": 1.'
  (tmp_path / "metrics.jsonl").write_text(text)
  with caplog.at_level("WARNING"):
    assert sweep_report.epoch_means(tmp_path, sweep_report.RATIO) == [3.0]
    assert sweep_report.evaluations(tmp_path) == [{"epoch": 1.0, "vit": 25.0}]
  dropped = [r for r in caplog.records if "unfinished last line" in r.getMessage()]
  assert len(dropped) == 2  # One per read.
  assert sweep_report.epoch_means(tmp_path / "none", sweep_report.RATIO) == []


def test_the_baseline_table_chooses_on_validation_never_on_test(tmp_path):
  """The winner is the best validation top-1 at the final epoch, the first in table order within
  0.2 of it; the test split's numbers, which point elsewhere, play no part."""
  table = sweep_tables.TABLES["baseline"]
  assert "--config.data.val_split=held_out" in table.overrides
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0])
  finals = {  # run -> (test top-1, validation top-1)
    "base_official": (0.60, 0.50),
    "base_hygiene": (0.58, 0.551),  # Within 0.2 of the best: fewer switches, so it wins.
    "aug_medium": (0.70, 0.552),  # The best on validation.
    "aug_deit": (0.75, 0.40),  # The best on test: must not matter.
  }
  for run, (test, val) in finals.items():
    wd = tmp_path / f"{run}_seed0"
    wd.mkdir()
    final = {"epochs": 100, "train_seconds_this_run": 1.0, "top1_vit": test, "val_top1_vit": val}
    (wd / "final.json").write_text(json.dumps(final))
    evals = [{"epoch": e, "eval/top1_vit": test, "val/top1_vit": val * e / 100} for e in (5, 100)]
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
  report = sweep_report.build_report(table, s)
  pick = report["chosen"]
  assert (pick["row"], pick["best_row"]) == ("base_hygiene", "aug_medium")
  assert pick["rows_with_validation"] == 4 and pick["rows"] == len(table.rows)
  by_name = {r["name"]: r for r in report["rows"]}
  assert by_name["aug_medium"]["val_evaluations"][0][-1] == {"epoch": 100, "vit": 55.2}
  text = sweep_report.table_markdown(report)
  assert "| validation top-1 |" in text and "| 55.10 |" in text
  assert "Chosen on validation, never on the test split: **base_hygiene** (55.10" in text
  assert "so far: 4 of 7 rows have finished." in text
  assert sweep_report.plot_validation(report, tmp_path) == tmp_path / "validation.png"


def test_the_seed_methods_table_adds_one_switch_to_the_winner():
  """Fixed before its runs: the grid's winner (its seed-0 run reused at the grid's schedule), and
  mimetic init, impulse-3 init and DrLoc each on top of it, every config valid."""
  table = sweep_tables.baseline_methods_table("aug_medium", epochs=100)
  winner, *methods = table.rows
  grid = {r.name: r for r in sweep_tables.rows("baseline")}
  assert (
    winner.run_name == grid["aug_medium"].run_name and winner.config == grid["aug_medium"].config
  )
  assert [r.name for r in methods] == ["mimetic", "impulse3", "drloc"]
  for row in methods:
    assert row.overrides == grid["aug_medium"].overrides
    assert row.config.startswith(grid["aug_medium"].config.split(",randaug")[0].split(":")[0])
    configlib.validate(_config(row.config))
  assert _config(methods[0].config).model.init == "mimetic"
  # DrLoc at its paper's weight for a plain ViT (0.01, Supp. C), not its T2T/CvT weight (0.1).
  assert _config(methods[2].config).drloc.weight == 0.01
  std = sweep_tables.baseline_methods_table("base_hygiene_std", epochs=200)
  assert std.rows[0].run_name == "base_hygiene_std_e200"  # Another schedule: a run of its own.
  assert ",epochs=200," in std.rows[1].config and "init=standard" not in std.rows[1].config
  assert table.root == sweep_tables.TABLES["baseline"].root and table.seeds == (0, 1)


def test_the_seed_methods_verdict_waits_for_both_seeds_and_reads_both_splits(tmp_path):
  """The rule written before the runs: "helps" by the report's rule (test), else "goes its
  paper's way" where ahead in every seed on test and validation, else "no gain shown"; nothing
  until the method and the baseline have both seeds."""
  table = sweep_tables.baseline_methods_table("aug_light", epochs=200)
  assert dict(table.paper_gains) == {"mimetic": 2.53, "impulse3": 2.99, "drloc": 2.21}
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0, 1])
  finals = {  # run -> per seed (test top-1, validation top-1)
    "aug_light_e200": [(0.58, 0.59), (0.59, 0.60)],
    "mimetic_e200": [(0.62, 0.63), (0.63, 0.64)],  # +4 in both seeds, spread 0.7: helps.
    "impulse3_e200": [(0.581, 0.595), (0.60, 0.601)],  # Ahead everywhere, within the noise.
    "drloc_e200": [(0.59, 0.58)],  # One seed only.
  }
  for run, seeds in finals.items():
    for seed, (test, val) in enumerate(seeds):
      wd = tmp_path / f"{run}_seed{seed}"
      wd.mkdir()
      final = {"epochs": 200, "top1_vit": test, "val_top1_vit": val}
      (wd / "final.json").write_text(json.dumps(final))
  report = sweep_report.build_report(table, s)
  found = {v["row"]: v for v in report["verdicts"]}
  assert found["mimetic"]["verdict"] == "helps"
  assert found["mimetic"]["test_diff"] == pytest.approx(4.0)
  assert found["impulse3"]["verdict"] == "goes its paper's way"
  assert found["impulse3"]["per_seed"]["val_top1"] == pytest.approx({0: 0.5, 1: 0.1})
  assert found["drloc"] == {"row": "drloc", "reference": "aug_light", "waiting_for": ["drloc"]}
  # Behind on validation in one seed: no gain shown, however the test split reads.
  (tmp_path / "impulse3_e200_seed1" / "final.json").write_text(
    json.dumps({"epochs": 200, "top1_vit": 0.60, "val_top1_vit": 0.599})
  )
  found = {v["row"]: v for v in sweep_report.build_report(table, s)["verdicts"]}
  assert found["impulse3"]["verdict"] == "no gain shown"
  text = sweep_report.table_markdown(sweep_report.build_report(table, s))
  assert (
    "- mimetic: **helps**: test +4.00 (per seed +4.00, +4.00), validation +4.00; its "
    "paper: +2.53." in text
  )
  assert "- drloc: waits for every seed of drloc." in text
  # A table without paper gains has no verdicts.
  assert sweep_report.build_report(sweep_tables.TABLES["baseline"], s)["verdicts"] == []


def test_the_schedule_check_doubles_the_winner_and_keeps_the_shorter_within_half_a_point():
  """Item 4: the winner's grid run (reused) and the winner at 200 epochs, seed 0, whose run the
  methods table at 200 epochs would reuse; the longer wins only with a gain of 0.5 or more."""
  table = sweep_tables.baseline_schedule_table("aug_light")
  short, long = table.rows
  grid = {r.name: r for r in sweep_tables.rows("baseline")}
  assert (short.run_name, short.config) == (grid["aug_light"].run_name, grid["aug_light"].config)
  assert long.config == grid["aug_light"].config.replace("epochs=100", "epochs=200")
  assert long.overrides == grid["aug_light"].overrides == short.overrides
  methods_200 = sweep_tables.baseline_methods_table("aug_light", epochs=200)
  assert long.run_name == methods_200.rows[0].run_name == "aug_light_e200"
  assert table.seeds == (0,) and table.root == sweep_tables.TABLES["baseline"].root

  def pick(val_short, val_long):
    entries = [
      {"name": short.name, "val_top1": {"vit": {"mean": val_short}}},
      {"name": long.name, "val_top1": {"vit": {"mean": val_long}}},
    ]
    return sweep_rules.chosen(table, entries)["row"]

  assert pick(58.70, 59.18) == "aug_light"  # +0.48: the shorter schedule stays.
  assert pick(58.70, 59.20) == "aug_light_e200"  # +0.50: doubling pays.
  assert pick(58.70, 58.10) == "aug_light"


def test_the_teachers_rule_picks_the_resnet_size_then_it_or_the_agent_cheaper_within_a_margin():
  """Written before the teachers' runs: the ResNet's size by validation, then the better of it
  and the agent; within 0.2 point, the cheaper to train; the other is the other."""
  table = sweep_tables.TABLES["teachers"]
  # Training PFLOPs a seed (2 x MACs an image x 4,992 x epochs): the agent (533.1M, 100 epochs)
  # between ResNet-20 (121.2M) and ResNet-56 (376.0M, 180 epochs each).
  pflops = {"agent_e100": 0.532, "resnet20": 0.218, "resnet56": 0.676}

  def pick(**val):
    entries = [
      {
        "name": r.name,
        "models": list(r.models),
        "val_top1": {r.models[0]: {"mean": val[r.name]}} if r.name in val else {},
        "train_pflops": {0: pflops[r.name]},
      }
      for r in table.rows
    ]
    return sweep_rules.chosen_teacher(table, entries)

  got = pick(agent_e100=70.0, resnet20=74.22, resnet56=76.0)
  assert (got["resnet"], got["teacher"], got["other"]) == ("resnet56", "resnet56", "agent_e100")
  # Within 0.2: the agent costs less than ResNet-56.
  got = pick(agent_e100=75.80, resnet20=74.22, resnet56=76.0)
  assert (got["teacher"], got["other"], got["close"]) == ("agent_e100", "resnet56", True)
  got = pick(agent_e100=75.78, resnet20=74.22, resnet56=76.0)
  assert (got["teacher"], got["close"]) == ("resnet56", False)
  # ResNet-20 wins its size; the agent within 0.2 costs more than it.
  got = pick(agent_e100=74.30, resnet20=74.22, resnet56=74.0)
  assert (got["resnet"], got["teacher"], got["other"]) == ("resnet20", "resnet20", "agent_e100")
  assert pick(resnet20=74.22, resnet56=76.0) == {"waiting_for": ["agent_e100"]}
  assert sweep_rules.chosen_teacher(sweep_tables.TABLES["baseline"], []) is None
  lines = sweep_rules.teacher_lines(pick(agent_e100=75.80, resnet20=74.22, resnet56=76.0))
  assert "the ResNet is **resnet56** (validation top-1: resnet20 74.22, resnet56 76.00)" in lines[1]
  assert "the teacher is **agent_e100** (75.80), the other **resnet56** (76.00)" in lines[1]
  assert "the cheaper to train, 0.532 PFLOPs against 0.676" in lines[1]

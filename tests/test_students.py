"""The small-data study's students (issue 84, items 4-6): fixed before their runs, on the baseline
grid's winner, in the root the grid and the teachers share, so their runs are reused and each
student's compute counts its teacher's run."""

import json
import math

import pytest

from tests import runs
from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.tools.sweep import report as sweep_report
from vitboot_jax.tools.sweep import rules as sweep_rules
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import study_rows
from vitboot_jax.tools.sweep import tables as sweep_tables


def _command(table, row, seed=0, root="/r"):
  s = sweep_runs.settings(table, root=root, seeds=[seed], data_dir="/d")
  return sweep_runs.command(table, s, row, seed)


def _row(table, name):
  (row,) = [r for r in table.rows if r.name == name]
  return row


def test_the_study_shares_one_root_and_keeps_its_reports_apart():
  names = ("baseline", "teachers")
  tables = [sweep_tables.TABLES[n] for n in names]
  methods = sweep_tables.baseline_methods_table("base_hygiene")
  students = sweep_tables.students_table("base_hygiene", "resnet20", "agent_e100")
  tables += [methods, students]
  assert {t.root for t in tables} == {sweep_tables.SMALL_DATA_ROOT}
  assert len({t.files for t in tables}) == len(tables)


@pytest.mark.parametrize("winner", ["base_hygiene", "aug_medium"])
def test_students_reuse_the_winner_and_teacher_runs_and_add_one_change_each(winner):
  table = sweep_tables.students_table(winner, "resnet20", "agent_e100")
  grid, teachers = sweep_tables.TABLES["baseline"], sweep_tables.TABLES["teachers"]
  assert [r.name for r in table.rows] == [
    winner,
    "resnet20",
    "agent_e100",
    "corr_resnet20",
    "corr_resnet20_eval",
    "kd_resnet20",
    "corr_agent_e100",
    "vit_matched_resnet20",
    "joint",
  ]
  # The same commands as the grid's and the teachers' runs: their records are reused.
  assert _command(table, table.rows[0]) == _command(grid, _row(grid, winner))
  for name in ("resnet20", "agent_e100"):
    assert _command(table, _row(table, name)) == _command(teachers, _row(teachers, name))
  assert len({r.run_name for r in table.rows}) == len(table.rows)
  base = load_config(_row(grid, winner).config)
  for row in table.rows[3:]:
    config = load_config(row.config)
    configlib.validate(config)
    # The winner's recipe in every arm: its schedule (but the matched row's), init, augmentation.
    assert config.data.to_dict() == base.data.to_dict() and config.mix == base.mix
    for field in ("init", "drop_path"):
      assert config.model[field] == base.model[field]
    assert config.loss.label_smoothing == base.loss.label_smoothing
    if row.name != "vit_matched_resnet20":
      assert config.num_epochs == base.num_epochs
    # One clipping rule: the winner's flags (HYGIENE's 1.0) reach every student.
    assert "--config.optim.clip_norm=1.0" in _command(table, row)
  corr = load_config(_row(table, "corr_resnet20").config)
  assert (corr.mode, corr.agent_frozen, corr.cnn.name) == ("joint", True, "resnet20")
  assert load_config(_row(table, "corr_resnet20_eval").config).agent_frozen_eval
  assert not corr.agent_frozen_eval
  assert load_config(_row(table, "kd_resnet20").config).loss.feature_vit == 0
  assert load_config(_row(table, "corr_agent_e100").config).cnn.name != "resnet20"
  assert "--config.agent_init_from=/r/resnet20_seed1" in _command(table, table.rows[3], seed=1)
  assert "--config.agent_init_from=/r/agent_e100_seed0" in _command(table, table.rows[6])
  assert sweep_tables.teacher_run(_row(table, "kd_resnet20")) == "resnet20"
  matched = load_config(_row(table, "vit_matched_resnet20").config)
  assert (matched.mode, matched.num_epochs) == ("vit", study_rows.MATCHED_EPOCHS["resnet20"])
  joint = load_config(_row(table, "joint").config)
  assert (joint.mode, joint.agent_frozen) == ("joint", False)


def test_students_of_the_official_winner_clip_as_its_vit_alone_arm():
  """G1's ViT-alone arm clips at 0.1 and the official teacher arms not at all: the students get
  the ViT alone's clipping, so no arm of the comparison differs in it."""
  table = sweep_tables.students_table("base_official", "agent_e100", "resnet56")
  assert load_config(table.rows[0].config).optim.clip_norm == 0.1
  for row in table.rows[3:]:
    clip = [f for f in _command(table, row) if f.startswith("--config.optim.clip_norm=")]
    assert clip in ([study_rows.STUDENT_CLIP], []) and (clip or row.name.startswith("vit_"))


@pytest.mark.slow
def test_the_matched_epochs_are_the_counted_ones():
  """ceil((100 x the student's MACs an image + the teacher's epochs x its MACs) / the ViT's): the
  strict reading, the teacher's run counted once per student."""
  from vitboot_jax.tools import train_compute

  def macs(config):
    config = load_config(config).to_dict()
    return train_compute._macs_per_image(json.dumps(config, sort_keys=True))

  grid = sweep_tables.TABLES["baseline"]
  vit = macs(_row(grid, "base_hygiene").config)
  for teacher, other in (
    ("agent_e100", "resnet20"),
    ("resnet20", "resnet56"),
    ("resnet56", "agent_e100"),
  ):
    table = sweep_tables.students_table("base_hygiene", teacher, other)
    own = study_rows.BASELINE_EPOCHS * macs(_row(table, f"corr_{teacher}").config)
    trained = study_rows.TEACHER_EPOCHS[teacher] * macs(_row(table, teacher).config)
    assert load_config(_row(table, teacher).config).num_epochs == study_rows.TEACHER_EPOCHS[teacher]
    assert study_rows.MATCHED_EPOCHS[teacher] == math.ceil((own + trained) / vit)


def test_a_students_report_counts_its_teachers_run_and_writes_its_own_files(tmp_path):
  table = sweep_tables.students_table("base_hygiene", "resnet20", "agent_e100")
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0])
  for run, top1 in (("base_hygiene", 0.6), ("resnet20", 0.8), ("corr_resnet20", 0.65)):
    wd = tmp_path / f"{run}_seed0"
    wd.mkdir()
    model = "cnn" if run == "resnet20" else "vit"
    final = {"epochs": 100, "train_seconds_this_run": 10.0, f"top1_{model}": top1}
    (wd / "final.json").write_text(json.dumps(final))
  report = sweep_report.build_report(table, s)
  by_name = {r["name"]: r for r in report["rows"]}
  assert by_name["corr_resnet20"]["train_seconds_with_teacher"] == 20.0
  assert by_name["corr_resnet20"]["vs_reference"]["per_seed"][0] == pytest.approx(5.0)
  # Three students read resnet20's run: the amortised reading shares it among them.
  assert by_name["corr_resnet20"]["teacher_shared_by"] == 3
  assert by_name["corr_agent_e100"]["teacher_shared_by"] == 1
  corr = by_name["corr_resnet20"]
  corr["train_pflops"], corr["teacher_pflops"] = {0: 1.3}, {0: 0.6}
  text = "\n".join(sweep_report.reference_markdown(report, [corr]))
  assert "1.3000 + 0.6000 teacher (amortised over its 3 students: 0.2000) PFLOPs" in text
  sweep_report.write_report(tmp_path, report)
  assert (tmp_path / "students_table.md").exists() and not (tmp_path / "table.md").exists()


def test_the_70_percent_target_reads_the_students_of_at_most_100_epochs_with_every_seed(tmp_path):
  table = sweep_tables.students_table("base_hygiene", "resnet20", "agent_e100")
  assert table.target == (70.0, 100)
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0, 1])
  results = {  # run -> the ViT's test top-1 per finished seed
    "base_hygiene": (0.55, 0.56),
    "corr_resnet20": (0.66, 0.68),
    "kd_resnet20": (0.70,),  # One seed: waits, however high.
    "vit_matched_resnet20": (0.75, 0.75),  # 221 epochs: outside the target's schedule.
  }
  for run, seeds in results.items():
    for seed, top1 in enumerate(seeds):
      (tmp_path / f"{run}_seed{seed}").mkdir()
      final = {"epochs": 100, "top1_vit": top1}
      (tmp_path / f"{run}_seed{seed}" / "final.json").write_text(json.dumps(final))
  read = sweep_report.build_report(table, s)["target"]
  assert (read["best_row"], read["best_top1"], read["reached"]) == ("corr_resnet20", 67.0, [])
  assert "kd_resnet20" in read["waiting_for"] and "vit_matched_resnet20" not in read["waiting_for"]
  text = sweep_report.table_markdown(sweep_report.build_report(table, s))
  assert (
    "not reached yet: of the rows with every seed, the closest is **corr_resnet20** (67.00, 3.00 "
    "short); waiting for "
  ) in text
  final = dict(read, waiting_for=[])  # Every row in: the closest row is the verdict.
  assert sweep_rules.target_lines(final)[-1].endswith(
    "not reached: the closest is **corr_resnet20** (67.00, 3.00 short)."
  )
  (tmp_path / "kd_resnet20_seed1").mkdir()
  (tmp_path / "kd_resnet20_seed1" / "final.json").write_text('{"epochs": 100, "top1_vit": 0.71}')
  read = sweep_report.build_report(table, s)["target"]
  assert read["reached"] == ["kd_resnet20"] and read["best_top1"] == pytest.approx(70.5)


def test_the_teachers_mode_is_read_on_validation_once_both_rows_have_both_seeds(tmp_path):
  table = sweep_tables.students_table("base_hygiene", "resnet20", "agent_e100")
  assert table.choose_switch == ("corr_resnet20", "corr_resnet20_eval")
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0, 1])

  def finish(run, seed, test, val):
    (tmp_path / f"{run}_seed{seed}").mkdir(exist_ok=True)
    final = {"epochs": 100, "top1_vit": test, "val_top1_vit": val}
    (tmp_path / f"{run}_seed{seed}" / "final.json").write_text(json.dumps(final))

  finish("corr_resnet20", 0, 0.60, 0.66)
  finish("corr_resnet20", 1, 0.60, 0.66)
  finish("corr_resnet20_eval", 0, 0.70, 0.67)  # Better on test: must not matter.
  assert sweep_report.build_report(table, s)["switch"] == {"waiting_for": ["corr_resnet20_eval"]}
  finish("corr_resnet20_eval", 1, 0.70, 0.65)  # Validation mean 66.00: a tie keeps it off.
  read = sweep_report.build_report(table, s)["switch"]
  assert read["on"] is False and read["val_top1"] == pytest.approx([66.0, 66.0])
  finish("corr_resnet20_eval", 1, 0.50, 0.66)
  report = sweep_report.build_report(table, s)
  assert report["switch"]["on"] is True
  assert "Chosen on validation, never on the test split: **corr_resnet20_eval** (" in (
    sweep_report.table_markdown(report)
  )


@pytest.mark.parametrize("teacher_eval", [False, True])
def test_students_at_the_longer_schedule_change_only_their_epochs(teacher_eval):
  """Issue 84 item 4 where issue 81 chose 200 epochs: the winner's 200-epoch run (the schedule
  check's) and the teachers reused; corr in the mode the 100-epoch table chose, KD alone, corr from
  the other, each the 100-epoch student with only its epochs changed, in runs of their own."""
  table = sweep_tables.longer_students_table(
    "aug_light", "resnet20", "agent_e100", teacher_eval, epochs=200
  )
  short = sweep_tables.students_table("aug_light", "resnet20", "agent_e100")
  check = sweep_tables.baseline_schedule_table("aug_light", epochs=200)
  mode = "_eval" if teacher_eval else ""
  assert [r.run_name for r in table.rows] == [
    "aug_light_e200",
    "resnet20",
    "agent_e100",
    f"corr_resnet20{mode}_e200",
    "kd_resnet20_e200",
    "corr_agent_e100_e200",
  ]
  assert _command(table, table.rows[0]) == _command(check, check.rows[1])  # Reused.
  for name in ("resnet20", "agent_e100"):
    assert _command(table, _row(table, name)) == _command(short, _row(short, name))
  for row in table.rows[3:]:
    shorter = _row(short, row.run_name.removesuffix("_e200"))
    cmd, short_cmd = _command(table, row), _command(short, shorter)
    assert [a for a in cmd if "workdir" not in a and not a.startswith("--config=")] == [
      a for a in short_cmd if "workdir" not in a and not a.startswith("--config=")
    ]
    config, short_config = load_config(row.config), load_config(shorter.config)
    configlib.validate(config)
    assert config.num_epochs == 200 and short_config.num_epochs == 100
    with short_config.unlocked():
      short_config.num_epochs = 200
    assert config.to_dict() == short_config.to_dict()
  assert table.root == short.root and table.files == "students_e200_"


def test_the_students_rule_picks_the_best_on_validation_the_cheaper_within_a_margin():
  """Written before the students' results were read: of the rows whose ViT learns from a finished
  teacher, the best mean validation top-1 over both seeds; within 0.2 point, the cheapest with its
  teacher's run counted in full; the test split, the ViT alone and joint mode never decide it."""
  table = sweep_tables.students_table("base_hygiene", "resnet20", "agent_e100")
  assert table.choose_student_within == 0.2
  # Training PFLOPs a seed, own + teacher's: KD alone is the cheapest, the agent's the dearest.
  own = {"corr_resnet20": 1.0, "corr_resnet20_eval": 1.0, "kd_resnet20": 0.9}
  own |= {"corr_agent_e100": 1.5}
  teacher_cost = {"resnet20": 0.218, "agent_e100": 0.532}

  def read(seeds=(0, 1), **val):
    entries = []
    for r in table.rows:
      teacher = sweep_tables.teacher_run(r)
      done = list(seeds) if r.name in val or r.name not in own else []
      entries.append(
        {
          "name": r.name,
          "models": list(r.models),
          "teacher": teacher,
          "seeds_done": done,
          "val_top1": {"vit": {"mean": val.get(r.name, 99.0)}} if "vit" in r.models else {},
          "top1": {"vit": {"mean": 0.0}},  # The test split never decides.
          "train_pflops": {s: own.get(r.name, 5.0) for s in done},
          "teacher_pflops": {s: teacher_cost[teacher] for s in done} if teacher else {},
        }
      )
    return sweep_rules.chosen_student(table, entries)

  val = {"corr_resnet20": 66.0, "corr_resnet20_eval": 66.4, "kd_resnet20": 65.0}
  got = read(**val, corr_agent_e100=64.0)  # vit_matched and joint at 99.0 on validation: ignored.
  assert (got["row"], got["best_row"]) == ("corr_resnet20_eval", "corr_resnet20_eval")
  assert sorted(got["val_top1"]) == sorted(own)
  assert got["pflops"]["corr_agent_e100"] == pytest.approx(2.032)
  # Within 0.2 of the best: the cheaper (KD alone) wins; 0.22 behind it does not.
  assert read(**(val | {"kd_resnet20": 66.2}), corr_agent_e100=64.0)["row"] == "kd_resnet20"
  assert read(**(val | {"kd_resnet20": 66.18}), corr_agent_e100=64.0)["row"] == (
    "corr_resnet20_eval"
  )
  assert read(**val) == {"waiting_for": ["corr_agent_e100"]}
  assert read(seeds=(0,), **val, corr_agent_e100=64.0)["waiting_for"] == list(own)
  lines = sweep_rules.student_lines(read(**(val | {"kd_resnet20": 66.2}), corr_agent_e100=64.0))
  assert "the recipe is **kd_resnet20** (66.20: within 0.2 point of the best, " in lines[1]
  assert "corr_resnet20_eval (66.40), and cheaper: 1.118 PFLOPs against 1.218" in lines[1]
  assert sweep_rules.chosen_student(sweep_tables.TABLES["teachers"], []) is None


@pytest.mark.slow
def test_the_choices_set_in_tables_are_what_the_committed_records_read():
  """tables.BASELINE_WINNER, TEACHER, OTHER_TEACHER and TEACHER_EVAL are set by hand from their
  reports' rule lines: the same rules read on the records under docs/small_data must agree."""
  records = runs.REPO / "docs" / "small_data"

  def read(name, key):
    table = sweep_tables.TABLES[name]
    return sweep_report.build_report(table, sweep_runs.settings(table, root=str(records)))[key]

  assert read("baseline", "chosen")["row"] == sweep_tables.BASELINE_WINNER
  teachers = read("teachers", "chosen_teacher")
  assert (teachers["teacher"], teachers["other"]) == (
    sweep_tables.TEACHER,
    sweep_tables.OTHER_TEACHER,
  )
  assert read("students", "switch")["on"] is sweep_tables.TEACHER_EVAL

"""The curve plot and the sweep runner's CPU replication tables, on fake workdirs (no training)."""

import dataclasses
import json
import math
import os
import pathlib
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tests.config_files import flat, load_config
from vitboot_jax import configlib
from vitboot_jax.tools import plot
from vitboot_jax.tools.sweep import report as sweep_report
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import tables as sweep_tables

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = 10


def _write_metrics(workdir, mode, epochs=3, log_every=2):
  """A metrics.jsonl as train.py writes it: train lines every `log_every` steps, eval per epoch."""
  workdir.mkdir(parents=True, exist_ok=True)
  models = {"vit": ("vit",), "agent": ("agent",), "cnn": ("cnn",)}.get(mode, ("vit", "agent"))
  rng = np.random.default_rng(0)
  lines = []
  for step in range(1, epochs * STEPS_PER_EPOCH + 1):
    epoch = step / STEPS_PER_EPOCH
    if step % log_every == 0:
      train = {"step": step, "epoch": epoch, "train/lr": 1e-3, "train/grad_norm": 1.0}
      for m in models:
        train[f"train/loss_{m}"] = 2.0 / epoch + 0.1 * rng.random()
        train[f"train/ce_{m}"] = 2.0 / epoch
      if len(models) == 2:
        train.update({"train/feature": 3.0 / epoch, "train/feature_weight": 1.0 - epoch / 10})
        train.update({"train/kd_vit": 0.1, "train/kd_agent": 0.05})
      if mode == "shared":
        train["train/align_cosine"] = float(rng.normal(0.05, 0.1))
        train["train/align_conflict"] = float(rng.random() < 0.3)
      lines.append(train)
    if step % STEPS_PER_EPOCH == 0:
      evals = {"step": step, "epoch": epoch, "eval/count": 100.0}
      for m in models:
        evals[f"eval/top1_{m}"] = 0.1 + 0.1 * epoch
        evals[f"eval/ce_{m}"] = 2.0 / epoch
      lines.append(evals)
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _write_final(workdir, top1, epochs=3.0, seconds=100.0, mode="vit", resumed_from_step=0):
  workdir.mkdir(parents=True, exist_ok=True)
  final = {"step": 30, "epochs": epochs, "mode": mode, "count": 10000.0}
  final["train_seconds_this_run"] = seconds
  final["resumed_from_step"] = resumed_from_step
  final.update({f"top1_{m}": v for m, v in top1.items()})
  (workdir / "final.json").write_text(json.dumps(final))


# ---------------------------------------------------------------------------------------------
# plot


def test_moving_average_is_trailing_and_skips_nan():
  x = np.array([1.0, 3.0, 5.0, np.nan, 7.0])
  np.testing.assert_allclose(plot.moving_average(x, 2), [1.0, 2.0, 4.0, 5.0, 7.0])
  np.testing.assert_allclose(plot.moving_average(x[:3], 1), x[:3])
  assert plot.moving_average(np.zeros(0), 5).size == 0


def test_load_run_splits_train_and_eval(tmp_path):
  _write_metrics(tmp_path / "run", "shared")
  run = plot.load_run(tmp_path / "run")
  assert run.label == "run" and len(run.eval) == 3 and len(run.train) == 15
  x, y = plot.series(run.eval, "eval/top1_agent")
  np.testing.assert_allclose(x, [1.0, 2.0, 3.0])
  np.testing.assert_allclose(y, [0.2, 0.3, 0.4])


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path):
  pytest.importorskip("matplotlib")
  tf = pytest.importorskip("tensorflow")
  for mode in ("shared", "joint", "vit"):
    _write_metrics(tmp_path / mode, mode)
  out = tmp_path / "figs" / "curves.png"
  workdirs = [str(tmp_path / m) for m in ("shared", "joint", "vit")]
  result = subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.plot", f"--workdirs={','.join(workdirs)}"]
    + [f"--out={out}", "--labels=s,j,v", "--title=three runs"],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert json.loads(result.stdout.splitlines()[-1]) == {"out": str(out), "workdirs": workdirs}
  image = tf.io.decode_png(out.read_bytes()).numpy()
  default = subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.plot", f"--workdirs={workdirs[1]}"],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert default.returncode == 0, default.stderr[-2000:]
  assert json.loads(default.stdout.splitlines()[-1])["out"] == str(tmp_path / "joint/curves.png")
  assert (tmp_path / "joint" / "curves.png").stat().st_size > 0
  # Eval top-1 and the 7 training panels these runs log (no hint-gradient panels): 4 rows of 2.
  expected = (
    round(4 * plot.PANEL_INCHES[1] * plot.DPI),
    round(2 * plot.PANEL_INCHES[0] * plot.DPI),
  )
  assert image.shape[:2] == expected and image.shape[2] in (3, 4)
  assert image[..., :3].std() > 10  # Something was drawn.


def test_plot_shows_only_the_panels_some_run_logs(tmp_path):
  for mode in ("cnn", "vit", "joint", "shared"):
    _write_metrics(tmp_path / mode, mode)
  titles = lambda *modes: [  # noqa: E731
    p.title for p in plot.shown_panels([plot.load_run(tmp_path / m) for m in modes])
  ]
  assert titles("cnn") == ["loss_cnn"]
  assert titles("cnn", "vit") == ["loss_vit", "loss_cnn"]
  joint = ["feature weight w(t)", "loss_vit", "loss_agent", "feature loss"]
  assert titles("joint") == joint + ["KD (vit solid, agent dashed)"]
  assert titles("shared")[-2:] == ["Align: cos(g_vit, g_agent)", "Align: conflict rate"]
  # The feature weight only where a run has a feature loss (every mode logs the weight).
  (tmp_path / "w").mkdir()
  (tmp_path / "w/metrics.jsonl").write_text(
    json.dumps({"step": 2, "epoch": 0.2, "train/feature_weight": 1.0, "train/loss_vit": 2.0}) + "\n"
  )
  assert titles("w") == ["loss_vit"]


@pytest.mark.slow
def test_a_cnn_run_draws_two_panels(tmp_path):
  pytest.importorskip("matplotlib")
  _write_metrics(tmp_path / "cnn", "cnn")
  png = plot.plot_runs([tmp_path / "cnn"], tmp_path / "cnn.png").read_bytes()
  height, width = (int.from_bytes(png[i : i + 4], "big") for i in (20, 16))
  assert (height, width) == (
    round(plot.PANEL_INCHES[1] * plot.DPI),
    round(2 * plot.PANEL_INCHES[0] * plot.DPI),
  )


def test_plot_checks_labels_and_empty_workdirs(tmp_path):
  pytest.importorskip("matplotlib")
  _write_metrics(tmp_path / "a", "vit")
  with pytest.raises(ValueError, match="labels"):
    plot.plot_runs([tmp_path / "a"], tmp_path / "x.png", labels=["a", "b"])
  with pytest.raises(ValueError, match="metrics.jsonl"):
    plot.plot_runs([tmp_path / "empty"], tmp_path / "x.png")


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
  with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[plot\]'"):
    plot.plot_runs([tmp_path], tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------
# replication tables of the sweep runner

REPLICATION = sweep_tables.TABLES["replication"]


def _settings(root, seeds=(0, 1), epochs=3, table=REPLICATION):
  return sweep_runs.settings(table, root=root, seeds=seeds, epochs=epochs, data_dir="/data")


def test_aggregate_mean_spread_and_missing_rows(tmp_path):
  _write_final(tmp_path / "vit_seed0", {"vit": 0.50}, seconds=100.0)
  _write_final(tmp_path / "vit_seed1", {"vit": 0.54}, seconds=120.0)
  _write_final(tmp_path / "shared_noalign_seed0", {"vit": 0.60, "agent": 0.70}, mode="shared")
  resumed = {"mode": "shared", "resumed_from_step": 9}
  _write_final(tmp_path / "shared_noalign_seed1", {"vit": 0.64, "agent": 0.66}, **resumed)
  _write_final(tmp_path / "joint_seed0", {"vit": 0.61, "agent": 0.62}, epochs=5.0, mode="joint")
  (tmp_path / "agent_seed0").mkdir()  # Started, no final.json yet.

  report = sweep_report.build_report(REPLICATION, _settings(tmp_path))
  by_name = {r["name"]: r for r in report["rows"]}
  assert [r["name"] for r in report["rows"]] == [r.name for r in REPLICATION.rows]

  vit = by_name["vit"]
  assert vit["status"] == "done" and vit["seeds_done"] == [0, 1]
  assert vit["top1"]["vit"]["mean"] == pytest.approx(52.0)
  assert vit["top1"]["vit"]["std"] == pytest.approx(math.sqrt(8.0))  # Sample std of 50, 54.
  assert (vit["top1"]["vit"]["min"], vit["top1"]["vit"]["max"]) == pytest.approx((50.0, 54.0))
  assert list(vit["top1"]) == ["vit"] and vit["train_seconds"] == pytest.approx(220.0)
  assert vit["epochs"] == [3.0] and vit["epochs_match"]
  assert vit["paper_top1"] == {"vit": None}

  shared = by_name["shared_noalign"]
  assert shared["top1"]["vit"]["mean"] == pytest.approx(62.0)
  assert shared["top1"]["agent"]["mean"] == pytest.approx(68.0)
  assert shared["top1"]["agent"]["std"] == pytest.approx(math.sqrt(8.0))
  assert shared["config"] == "configs/quickstart.py:mode=shared,align=none,epochs=3"
  assert shared["seeds_resumed"] == [1] and vit["seeds_resumed"] == []

  joint = by_name["joint"]
  assert joint["status"] == "partial (1/2 seeds)" and joint["top1"]["vit"]["std"] is None
  assert not joint["epochs_match"]  # 5 epochs in a 3-epoch table.
  assert by_name["agent"]["status"] == "incomplete"
  mimetic = by_name["vit_mimetic"]
  assert mimetic["status"] == "not run" and mimetic["top1"]["vit"] is None
  assert report["train_seconds"] == pytest.approx(220.0 + 200.0 + 100.0)

  sweep_report.write_report(tmp_path, report)
  assert json.loads((tmp_path / "table.json").read_text())["rows"][0]["name"] == "vit"
  table = (tmp_path / "table.md").read_text()
  assert "| vit | ViT | ViT alone | 52.00 ± 2.83 [50.00, 54.00] | done |" in table
  assert "61.00 (1 seed)" in table and "(!)" in table
  # A resumed seed's earlier launches are timed from their logged rates: its row is marked.
  lines = table.splitlines()
  assert all("(*)" in line for line in lines if line.startswith("| shared_noalign |"))
  assert "(*)" not in next(line for line in lines if line.startswith("| vit |"))
  assert any(line.startswith("(*) a seed of this row") for line in lines)
  assert "not run" in next(line for line in lines if line.startswith("| vit_mimetic |"))


def test_a_resumed_seed_is_timed_from_its_earlier_launches_logged_rates(tmp_path):
  # Batch 10; the first launch logged steps 10-40 at 100 img/s and was killed after saving at 25;
  # the second resumed there, logged 30-50 at 50 img/s, saved at 50; the last ran 50-60 in 7 s.
  (tmp_path / "config.json").write_text(json.dumps({"batch_size": 10}))
  first = [{"step": k, "train/img_per_s": 100.0} for k in (10, 20, 30, 40)]
  second = [{"step": k, "train/img_per_s": 50.0} for k in (30, 40, 50, 60)]
  evals = [{"step": 20, "eval/top1_vit": 0.5}]  # Lines without a rate add nothing.
  lines = first + evals + second
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  final = {"train_seconds_this_run": 7.0, "resumed_from_step": 50}
  # Steps 1-20 at 100 img/s (2 s), 21-50 at the second launch's 50 img/s (6 s), then the last 7 s.
  assert sweep_report.seed_seconds(tmp_path, final) == pytest.approx(2.0 + 6.0 + 7.0)
  assert sweep_report.seed_seconds(tmp_path, {**final, "resumed_from_step": 0}) == 7.0


def test_plot_curves_over_first_seed(tmp_path):
  pytest.importorskip("matplotlib")
  _write_metrics(tmp_path / "shared_align_seed0", "shared")
  _write_metrics(tmp_path / "vit_seed0", "vit")
  _write_metrics(tmp_path / "vit_seed1", "vit")
  out = sweep_report.plot_curves(REPLICATION, _settings(tmp_path), seed=0)
  assert out == tmp_path / sweep_report.CURVES and out.stat().st_size > 1000
  assert sweep_report.plot_curves(REPLICATION, _settings(tmp_path), seed=7) is None


def _run_sweep(*args):
  return subprocess.run(
    [sys.executable, "-m", "vitboot_jax.tools.sweep", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  )


def _commands(stdout):
  return [
    shlex.split(line)
    for line in stdout.splitlines()
    if line.startswith("python -m vitboot_jax.main")
  ]


def test_printed_commands(tmp_path):
  root = tmp_path / "rep"
  result = _run_sweep(
    "--table=replication",
    f"--root={root}",
    "--epochs=4",
    "--seeds=0,1",
    "--data_dir=/data/c10",
    "--override=--config.batch_size=32",
  )
  commands = _commands(result.stdout)
  assert len(commands) == 2 * len(REPLICATION.rows)
  assert not root.exists()  # Without --run nothing is written.
  by_workdir = {}
  for cmd in commands:
    assert cmd[:3] == ["python", "-m", "vitboot_jax.main"]
    flags = dict(arg.split("=", 1) for arg in cmd[3:])
    workdir = pathlib.Path(flags["--workdir"])
    by_workdir[workdir.name] = (cmd, flags)
    seed = workdir.name.rsplit("_seed", 1)[1]
    assert workdir.parent == root
    assert flags["--config.seed"] == seed
    # The image folder explicitly, whatever the config's default data.
    assert flags["--config.data.name"] == "folder" and flags["--config.data.dir"] == "/data/c10"
    assert flags["--config"].startswith("configs/quickstart.py:mode=")
    assert (REPO / flags["--config"].split(":")[0]).is_file()
    assert flags["--config"].endswith(",epochs=4") and flags["--config.batch_size"] == "32"
    assert flags["--config.eval_every_epochs"] == "1"  # Per-epoch curves.
    assert not any(k.startswith("--config.align") for k in flags)  # Rows are config args.
  assert set(by_workdir) == {f"{r.name}_seed{s}" for r in REPLICATION.rows for s in (0, 1)}
  config = {name: flags["--config"].split(":", 1)[1] for name, (_, flags) in by_workdir.items()}
  assert config["shared_noalign_seed1"] == "mode=shared,align=none,epochs=4"
  assert config["shared_align_seed0"] == "mode=shared,align=pcgrad,epochs=4"
  assert config["vit_drloc_seed0"] == "mode=vit,drloc=0.1,epochs=4"
  assert config["vit_impulse_seed0"] == "mode=vit,init=impulse3,epochs=4"
  assert config["vit_mimetic_seed1"] == "mode=vit,init=mimetic,epochs=4"
  assert config["shared_drloc_seed0"] == "mode=shared,align=pcgrad,drloc=0.1,epochs=4"
  assert config["agent_seed0"] == "mode=agent,epochs=4"
  assert "not run" in result.stdout


def test_rows_flag_limits_the_commands_not_the_table(tmp_path):
  result = _run_sweep(
    "--table=replication", f"--root={tmp_path}", "--seeds=3", "--rows=shared_noalign,vit"
  )
  workdirs = [dict(a.split("=", 1) for a in c[3:])["--workdir"] for c in _commands(result.stdout)]
  assert workdirs == [str(tmp_path / "vit_seed3"), str(tmp_path / "shared_noalign_seed3")]
  assert f"epochs={REPLICATION.epochs}" in _commands(result.stdout)[0][3]
  table = json.loads((tmp_path / sweep_report.TABLE_JSON).read_text())  # ROOT exists: written.
  assert [r["name"] for r in table["rows"]] == [r.name for r in REPLICATION.rows]
  assert {r["status"] for r in table["rows"]} == {"not run"} and table["seeds"] == [3]
  lines = (tmp_path / sweep_report.TABLE_MD).read_text().splitlines()
  assert sum("| not run |" in line for line in lines) == sum(
    len(r.models) for r in REPLICATION.rows
  )


def test_tokens16_table_keeps_the_row_names():
  table = sweep_tables.TABLES["replication_tokens16"]
  assert [r.name for r in table.rows] == [
    *("vit", "agent", "joint", "shared_align", "shared_noalign"),
    *("joint_kd_only", "joint_feature_only", "joint_no_decay"),
  ]
  s = _settings("/root", table=table)
  assert all(r.config.startswith("configs/cifar10_tokens16.py:mode=") for r in table.rows)
  assert sweep_runs.workdir(s, table.rows[3], 1) == pathlib.Path("/root/shared_align_seed1")


def _row_config(row, seed=0, epochs=4, table=REPLICATION):
  """The config a row's command builds: the config file's args, then its --config.* flags."""
  cmd = sweep_runs.command(table, _settings("/root", epochs=epochs, table=table), row, seed)
  config = load_config(cmd[3].removeprefix("--config="))
  for flag in cmd[5:]:
    key, value = flag[len("--config.") :].split("=", 1)
    old = config[key] if "." not in key else config[key.split(".")[0]][key.split(".")[1]]
    config.update_from_flattened_dict({key: type(old)(value) if old is not None else value})
  return config


@pytest.mark.parametrize("name", ["replication", "replication_tokens16"])
def test_rows_differ_only_in_method(name):
  """Equal data, model, optimiser, epochs and seed in every row; only the method changes."""
  table = sweep_tables.TABLES[name]
  allowed = {
    "mode",
    "align",
    "drloc.weight",
    "model.init",
    "optim.clip_norm",  # The ViT-alone worker clips at 0.1.
    "agent.mlp_dropout",  # The standalone (and joint) agent's dropout.
  }
  by_name = {r.name: r for r in table.rows}
  reference = flat(_row_config(by_name["shared_align"], seed=1, table=table).to_dict())
  for row in table.rows:
    config = _row_config(row, seed=1, table=table)
    configlib.validate(config)
    assert config.num_epochs == 4 and config.seed == 1
    assert (config.data.name, config.data.dir) == ("folder", "/data")
    fields = flat(config.to_dict())
    changed = {k for k in fields if fields[k] != reference[k] and not k.startswith("loss.")}
    assert changed <= allowed, (row.name, changed - allowed)
  assert _row_config(by_name["shared_noalign"], table=table).align == "none"
  assert _row_config(by_name["shared_align"], table=table).align == "pcgrad"


def test_select_rows():
  assert [r.name for r in sweep_tables.select_rows(REPLICATION, ["joint", "vit"])] == [
    "vit",
    "joint",
  ]
  with pytest.raises(ValueError, match="unknown rows"):
    sweep_tables.select_rows(REPLICATION, ["nope"])


def test_rows_resolve_to_the_configs_of_runs_started_by_the_old_runner():
  """Runs begun by tools/replication.py (align as a flag) resume: their config is unchanged."""
  old_align_flag = {"shared_align": "pcgrad", "shared_noalign": "none", "shared_drloc": "pcgrad"}
  for row in REPLICATION.rows:
    args = row.config.split(":", 1)[1].replace(f",align={old_align_flag.get(row.name)}", "")
    old = _row_config(dataclasses.replace(row, config=f"configs/quickstart.py:{args}"))
    if row.name in old_align_flag:
      old.align = old_align_flag[row.name]
    assert old.to_dict() == _row_config(row).to_dict(), row.name


def test_launch_script_picks_the_table_from_config_and_skips_finished_runs(tmp_path):
  """launch/cpu_replication.sh keeps its arguments: --config picks the 16x16-token table."""
  table = sweep_tables.TABLES["replication_tokens16"]
  for row in table.rows:
    _write_final(tmp_path / f"{row.name}_seed0", {"vit": 0.4, "agent": 0.5})
  env = dict(
    os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
  )
  result = subprocess.run(
    ["bash", "launch/cpu_replication.sh", str(tmp_path), "3", "0"]
    + ["--config=configs/cifar10_tokens16.py", "--data_dir=/data"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert result.stdout.count("done already:") == len(table.rows)
  report = json.loads((tmp_path / sweep_report.TABLE_JSON).read_text())
  assert report["table"] == "replication_tokens16" and report["epochs"] == 3
  assert (tmp_path / "replication.log").exists()


def test_every_run_gets_its_own_colour():
  pytest.importorskip("matplotlib")
  for n in (3, 10, 15, 21):
    colours = plot.run_colours(n)
    assert len(colours) == n and len({str(c) for c in colours}) == n, n


@pytest.mark.slow
def test_many_runs_put_the_legend_below_the_panels(tmp_path):
  pytest.importorskip("matplotlib")
  heights = {}
  for n in (plot.LEGEND_INSIDE_MAX, plot.LEGEND_INSIDE_MAX + 1):
    workdirs = []
    for i in range(n):
      _write_metrics(tmp_path / f"{n}_{i}", "joint")
      workdirs.append(tmp_path / f"{n}_{i}")
    png = plot.plot_runs(workdirs, tmp_path / f"{n}.png").read_bytes()
    heights[n] = int.from_bytes(png[20:24], "big")  # The PNG header's height field.
  rows = 3  # Eval top-1 and a joint run's 5 training panels, 2 a row.
  assert heights[plot.LEGEND_INSIDE_MAX] == round(rows * plot.PANEL_INCHES[1] * plot.DPI)
  assert heights[plot.LEGEND_INSIDE_MAX + 1] > heights[plot.LEGEND_INSIDE_MAX]

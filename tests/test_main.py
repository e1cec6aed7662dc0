"""The entry point's answers to a user's mistakes: one line, exit code 2, nothing written.

Every run here stops before training (most before TensorFlow and JAX load), so each takes about a
second; none needs the network, and the offline case is made certain by disabling sockets.
"""

import json
import subprocess
import sys
import time

import pytest

from tests.runs import REPO, TINY
from tests.runs import env as _env

QUICKSTART = str(REPO / "configs" / "quickstart.py")
# Runs main as `python -m` does; with OFFLINE set every socket connection is refused (the machine
# is offline whatever it really is), and with IMPORTED_TO set the heavy libraries loaded by exit
# are written there.
_LAUNCH = (
  "import atexit, json, os, runpy, socket, sys\n"
  "def refuse(*args, **kwargs):\n"
  "  raise socket.gaierror(-2, 'Name or service not known')\n"
  "if os.environ.get('OFFLINE'):\n"
  "  socket.create_connection = socket.getaddrinfo = refuse\n"
  "def imported():\n"
  "  with open(os.environ['IMPORTED_TO'], 'w') as f:\n"
  "    json.dump([m for m in ('jax', 'tensorflow') if m in sys.modules], f)\n"
  "if os.environ.get('IMPORTED_TO'):\n"
  "  atexit.register(imported)\n"
  "sys.argv[0] = 'vitboot_jax.main'\n"
  "runpy.run_module('vitboot_jax.main', run_name='__main__', alter_sys=True)\n"
)


def _main(*args, offline=False, env=None, timeout=120):
  variables = _env(1)
  variables.update(env or {})
  if offline:
    variables["OFFLINE"] = "1"
  start = time.perf_counter()
  proc = subprocess.run(
    [sys.executable, "-c", _LAUNCH, *args],
    env=variables,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
  )
  return proc, time.perf_counter() - start


def _error_lines(proc):
  return [line for line in proc.stderr.splitlines() if line.strip()]


def _assert_usage_error(proc, *needles, lines=1):
  assert proc.returncode == 2, proc.stderr[-3000:]
  printed = _error_lines(proc)
  assert len(printed) == lines, printed
  assert printed[0].startswith("error: ")
  for needle in needles:
    assert needle in proc.stderr, (needle, proc.stderr)


@pytest.mark.parametrize(
  "args, needles",
  [
    (["--config=configs/quikstart.py"], ["no such file", "did you mean configs/quickstart.py"]),
    (["--config=configs/nope.py:mode=vit"], ["--config=configs/nope.py: no such file"]),
    (
      [f"--config={QUICKSTART}", "--config.batchsize=32"],
      ["config has no field 'batchsize'; did you mean --config.batch_size?", "--print_config"],
    ),
    ([f"--config={QUICKSTART}", "--config.data.foo=1"], ["config.data has no field 'foo'"]),
    ([f"--config={QUICKSTART}", "--config.batch_size=abc"], ["--config.batch_size=abc"]),
    ([f"--config={QUICKSTART}:mode=bootstrap"], ["mode='bootstrap' is unknown"]),
    ([f"--config={QUICKSTART}", "--config.mode=bootstrap"], ["config.mode='bootstrap'"]),
    (
      [f"--config={QUICKSTART}", "--config.optim.name=lamb"],
      ["config.optim.name='lamb' is unknown; choose one of 'adamw', 'sgd'"],
    ),
    ([f"--config={QUICKSTART}", "--config.drloc.pool=half"], ["config.drloc.pool='half'"]),
    ([f"--config={QUICKSTART}:mode=vit,form=paper"], ["mode 'vit'", "has no feature term"]),
    ([f"--config={QUICKSTART}:recipe=deitt"], ["recipe='deitt' is unknown", "'deit'"]),
    (
      [f"--config={QUICKSTART}:mode=vit,randaug=rand-m9-foo1"],
      ["config.data.randaugment='rand-m9-foo1'", "unknown part 'foo1'"],
    ),
    ([f"--config={QUICKSTART}:mode=vit,randaug=auto-m9"], ["does not start with 'rand'"]),
    ([f"--config={QUICKSTART}", "--config.mix.mixup_alpha=-0.5"], ["mixup_alpha=-0.5", ">= 0"]),
    ([f"--config={QUICKSTART}", "--config.mix.prob=1.5"], ["config.mix.prob=1.5", "[0, 1]"]),
    ([f"--config={QUICKSTART}:mode=vit,erase=-0.1"], ["config.data.random_erase=-0.1"]),
    ([f"--config={QUICKSTART}:mode=vit,smoothing=1"], ["config.loss.label_smoothing=1.0"]),
    ([f"--config={QUICKSTART}", "--bogus=1"], ["bogus"]),
    ([f"--config={QUICKSTART}", "extra"], ["unexpected arguments: extra"]),
    (["--config.batch_size=8"], ["--config is required"]),
  ],
)
def test_config_mistakes_are_one_line_and_exit_2_before_anything_loads(args, needles, tmp_path):
  workdir, imported = tmp_path / "run", tmp_path / "imported.json"
  proc, _ = _main(*args, f"--workdir={workdir}", env={"IMPORTED_TO": str(imported)})
  _assert_usage_error(proc, *needles)
  assert "\\n" not in proc.stderr and "\\'" not in proc.stderr  # Nothing printed escaped.
  assert "Traceback" not in proc.stderr
  assert json.loads(imported.read_text()) == []  # TensorFlow and JAX are not even imported.
  assert not workdir.exists()


def test_missing_workdir_flag():
  proc, _ = _main(f"--config={QUICKSTART}")
  _assert_usage_error(proc, "--workdir is required")


def test_help_exits_0_and_shows_configs_args_and_how_to_list_fields():
  proc, _ = _main("--help")
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert "quickstart.py" in out and "vits_cifar100.py" in out
  assert "Args: mode=shared|joint|vit|agent" in out  # A config's `:ARGS` variants.
  assert "--config=configs/quickstart.py --print_config" in out
  assert "--workdir" in out and "--print_config" in out
  one, _ = _main(f"--config={QUICKSTART}", "--help")
  assert one.returncode == 0 and "epochs=N (default 5)" in one.stdout


def test_print_config_lists_every_field_with_overrides():
  proc, _ = _main(f"--config={QUICKSTART}:epochs=2", "--config.batch_size=32", "--print_config")
  assert proc.returncode == 0, proc.stderr
  assert "batch_size: 32" in proc.stdout and "num_epochs: 2" in proc.stdout
  assert "train_fraction: 0.1" in proc.stdout


def test_missing_image_folder(tmp_path):
  workdir = tmp_path / "run"
  proc, _ = _main(
    f"--config={TINY}", f"--workdir={workdir}", f"--config.data.dir={tmp_path / 'nowhere'}"
  )
  _assert_usage_error(proc, "config.data.dir=", "not found", "--config.data.name=cifar10")
  assert not workdir.exists()


def test_unwritable_workdir(tmp_path, image_folder):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  proc, _ = _main(
    f"--config={TINY}", f"--workdir={blocker / 'run'}", f"--config.data.dir={image_folder}"
  )
  _assert_usage_error(proc, f"{blocker} is a file")


def test_offline_first_use_fails_fast_naming_both_ways(tmp_path):
  """The README's first command on a machine without the data or a network."""
  workdir, data_dir = tmp_path / "workdirs" / "quickstart", tmp_path / "tfds"
  proc, seconds = _main(
    f"--config={QUICKSTART}",
    f"--workdir={workdir}",
    offline=True,
    env={"TFDS_DATA_DIR": str(data_dir)},
  )
  _assert_usage_error(
    proc,
    "tfds dataset 'cifar10' is not prepared",
    "python -m vitboot_jax.tools.prepare_data cifar10 --data_dir=DIR",
    "--config.data.name=folder --config.data.dir=ROOT",
    lines=3,
  )
  assert seconds < 60  # No network retries (TensorFlow's import alone takes ~4 s on an idle VM).
  assert not workdir.exists() and not (tmp_path / "workdirs").exists()


def test_multi_process_runs_never_download(tmp_path):
  proc, _ = _main(
    f"--config={QUICKSTART}",
    f"--workdir={tmp_path / 'run'}",
    "--coordinator_address=127.0.0.1:1",
    "--num_processes=2",
    "--process_id=0",
    env={"TFDS_DATA_DIR": str(tmp_path / "tfds")},
  )
  _assert_usage_error(proc, "multi-process run does not download", "prepare_data cifar10")
  assert not (tmp_path / "run").exists() and not (tmp_path / "tfds").exists()


@pytest.mark.slow
def test_finished_workdir_refuses_another_config_and_reruns_the_same(uninterrupted, image_folder):
  base = [f"--config={TINY}", f"--workdir={uninterrupted}", f"--config.data.dir={image_folder}"]
  same = ["--config.num_epochs=3", "--config.checkpoint_every_steps=4"]
  before = (uninterrupted / "metrics.jsonl").read_text()
  proc, _ = _main(*base, "--config.num_epochs=4")
  _assert_usage_error(proc, "holds a finished run of a different config (num_epochs: 3 -> 4)")
  proc, _ = _main(*base, *same)
  assert proc.returncode == 0 and "already holds a finished run" in proc.stderr
  final = json.loads((uninterrupted / "final.json").read_text())
  top1 = f"agent {100 * final['top1_agent']:.2f}%"
  assert f"Final top-1 (step {final['step']}): {top1}" in proc.stderr
  assert (uninterrupted / "metrics.jsonl").read_text() == before
  assert json.loads((uninterrupted / "config.json").read_text())["num_epochs"] == 3

r"""Issue 83's queue items 1 and 2 on one GPU, each in one device call, every row side by side
through the product's own `vitboot_jax.main`, on the carried folder of the small-data images.

  python launch/gpu_small_data.py ITEM ROOT [--budget_s=420] [--epochs=N] [--dry] ...
  ITEM schedule240: table paper_schedule_240 (the quickstart's ViT alone, agent alone, joint and
    shared with Align: the official recipe, every switch off; 240 epochs, evaluation of the
    validation and test splits every 10 epochs), seed 0's four rows at once, then each seed-1 row
    as soon as a slot frees and the same row's measured seed-0 wall time fits what is left.
  ITEM small_data: the small-data study's rows not yet run on CPU, in the issues' order, all
    in ROOT (the tables share one root, as on CPU): table baseline_methods (the grid's winner and
    the seeds' methods on it, seeds 0 and 1), then teachers (the agent at 100 epochs, ResNet-20
    and ResNet-56, seeds 0 and 1), then students where tables.TEACHER has named the teachers
    (each student after its teacher's run of the same seed), and the students at the
    baseline's longer schedule once tables.TEACHER_EVAL is set too. A run two tables share (the
    winner, a teacher) runs once. The grid itself (table baseline, G1-G7) ran on CPU and chose
    the winner.
GPU rows are tables of their own: ROOT is never a CPU table's root.

The data: carry/cifar10_small (tools/prepare_data folder --folder_out: the 5,000 training images
of the paper's subset, the 5,000 held out for validation and the 10,000 test images, the same
JPEG files), travelling as carry/cifar10_small.tar.gz (one file: 20,000 small files would count
their disk blocks) and unpacked here on first use. Every run gets, after its table's flags:
  --config.data.dir=DATA --config.data.train_fraction=1.0 --config.data.val_split=val
  --config.data.pipeline=device --config.steps_per_call=39 --config.checkpoint_every_steps=1560
(39 steps a call: half an epoch of 78; it divides the 390- and 780-step evaluation intervals and
the checkpoint interval, so no call is cut to single steps; a checkpoint every 20 epochs: the
saves only matter for a stop, which saves anyway.)

Every run stops at the deadline (--budget_s after the start) with SIGTERM: it saves and exits,
and is reported "cut" (its schedule is the full one's: never a result; the same command again on
the same machine while it is warm resumes it, and keeps the finished runs). A run not yet started
when what is left cannot hold its estimate (x1.1) is "skipped" and listed. Then each table is
written by the sweep (table.md, table.json, curves), and ROOT/summary.json and ROOT/rows.txt say
what ran: each run's status, exit code, wall time, steps, last logged img/s, final top-1s, and the
init choice. SIGTERM to this script stops every run the same way and still writes them.
Each run has XLA_PYTHON_CLIENT_PREALLOCATE=false (several processes share the GPU) and
JAX_COMPILATION_CACHE_DIR=ROOT/jax_cache (seed 1 reuses seed 0's compilations).

The device calls (docs/accelerators.md, "Issue 83's queue items 1 and 2"), after
`bash launch/gpu_carry.sh` here; carry=["carry/cifar10_small.tar.gz", "carry/wheels"],
timeout_s=560, one call each:
  item 1: python -m pip install -q --no-deps carry/wheels/*.whl && timeout -s TERM -k 15 525 \
    python launch/gpu_small_data.py schedule240 /tmp/s240 --budget_s=420; bash \
    launch/device_pack.sh /tmp/s240 $OUT
  item 2: python -m pip install -q --no-deps carry/wheels/*.whl && timeout -s TERM -k 15 525 \
    python launch/gpu_small_data.py small_data /tmp/small --budget_s=420; bash \
    launch/device_pack.sh /tmp/small $OUT
Checked on CPU at toy size with the same script: JAX_PLATFORMS=cpu, --epochs=1 or 2, --data a
toy folder packed by the same tool (docs/accelerators.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitboot_jax.tools.sweep import runs as sweep_runs  # noqa: E402
from vitboot_jax.tools.sweep import tables as sweep_tables  # noqa: E402

ITEMS = ("schedule240", "small_data")
# Item 2's tables in the issues' order: the seeds' methods (issue 81), the teachers, then their
# students (issue 84), at 100 epochs and at the baseline's longer schedule.
SMALL_DATA_TABLES = ("baseline_methods", "teachers", "students", "students_long")
DATA = "carry/cifar10_small"
STEPS_PER_CALL = 39  # Half an epoch (78 steps at batch 64 on 5,000 images).
CHECKPOINT_EVERY = 1560  # 20 epochs; a multiple of STEPS_PER_CALL.
DATA_FLAGS = (
  "--config.data.train_fraction=1.0",
  "--config.data.val_split=val",
  "--config.data.pipeline=device",
)
MARGIN = 1.1  # A run starts only where MARGIN x its estimate fits what is left.
GRACE_S = 45  # After SIGTERM: a run saves and exits within this, else SIGKILL.
POLL_S = 2.0
REPORT_EVERY_S = 30.0
_STEP_LINE = re.compile(r"step (\d+)/(\d+) .*?(\d+) img/s\s+ETA (\S+)")


@dataclasses.dataclass
class Job:
  table: sweep_tables.Table
  row: sweep_tables.Row
  seed: int
  root: str
  after: tuple[str, ...] = ()  # Keys of the runs that must finish first.
  like: str | None = None  # Key of the run whose wall time estimates this one's.
  status: str = "waiting"  # waiting, running, finished, failed, cut, skipped
  note: str = ""
  proc: subprocess.Popen | None = None
  started: float | None = None  # Seconds after the launcher's start.
  wall: float | None = None
  returncode: int | None = None
  terminated: bool = False

  @property
  def key(self) -> str:
    return f"{self.table.name}/{self.row.run_name}_seed{self.seed}"

  @property
  def workdir(self) -> pathlib.Path:
    return pathlib.Path(self.root) / f"{self.row.run_name}_seed{self.seed}"

  @property
  def log(self) -> pathlib.Path:
    return pathlib.Path(self.root) / f"{self.row.run_name}_seed{self.seed}.log"


def key(table: str, run: str, seed: int) -> str:
  return f"{table}/{run}_seed{seed}"


def plan(item: str, root: str, seeds: list[int] | None = None) -> list[Job]:
  """The item's runs in the order they start."""
  tables = sweep_tables.TABLES
  if item == "schedule240":
    table = tables["paper_schedule_240"]
    seeds = list(seeds or table.seeds)
    return [
      Job(
        table,
        row,
        seed,
        root,
        like=None if seed == seeds[0] else key(table.name, row.run_name, seeds[0]),
      )
      for seed in seeds
      for row in table.rows
    ]
  if item != "small_data":
    raise ValueError(f"ITEM must be one of {ITEMS}, not {item!r}")
  jobs: list[Job] = []
  workdirs = set()
  for name in SMALL_DATA_TABLES:
    if name not in tables:  # students: registered once tables.TEACHER names the teachers.
      continue
    table = tables[name]
    for seed in seeds or table.seeds:
      for row in table.rows:
        job = Job(table, row, seed, root)
        if job.workdir in workdirs:  # The winner's or a teacher's run, which a table before owns.
          continue
        teacher = sweep_tables.teacher_run(row)
        if teacher:
          job.after = (key("teachers", teacher, seed),)
        workdirs.add(job.workdir)
        jobs.append(job)
  return jobs


def read_final(workdir: pathlib.Path) -> dict | None:
  try:
    return json.loads((workdir / "final.json").read_text())
  except (OSError, ValueError):
    return None


def last_progress(log: pathlib.Path) -> tuple[int, int, int, str] | None:
  """(step, total, img/s, ETA) of a run's last progress line, or None before its first."""
  try:
    with open(log, "rb") as f:
      f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
      tail = f.read().decode(errors="replace")
  except OSError:
    return None
  found = _STEP_LINE.findall(tail)
  if not found:
    return None
  step, total, rate, eta = found[-1]
  return int(step), int(total), int(rate), eta


class Launcher:
  def __init__(self, args: argparse.Namespace, jobs: list[Job]):
    self.args, self.jobs = args, jobs
    self.by_key = {j.key: j for j in jobs}
    self.start = time.monotonic()
    self.stop_requested = False
    self.lines: list[str] = []

  def now(self) -> float:
    return time.monotonic() - self.start

  def say(self, line: str) -> None:
    line = f"[{self.now():6.0f}s] {line}"
    print(line, flush=True)
    self.lines.append(line)

  # Commands.
  def extra(self) -> list[str]:
    flags = [*DATA_FLAGS]
    flags += [f"--config.steps_per_call={self.args.steps_per_call}"]
    flags += [f"--config.checkpoint_every_steps={self.args.checkpoint_every}"]
    if self.args.epochs:
      flags += [f"--config.num_epochs={self.args.epochs}"]
    return flags + list(self.args.override)

  def settings(self, job: Job) -> sweep_runs.Settings:
    seeds = sorted({j.seed for j in self.jobs if j.table.name == job.table.name})
    return sweep_runs.settings(job.table, job.root, seeds, None, self.args.data, self.extra())

  def command(self, job: Job) -> list[str]:
    return sweep_runs.command(job.table, self.settings(job), job.row, job.seed)

  # Scheduling.
  def readiness(self, job: Job) -> str:
    """'start', 'wait', or why the run is skipped."""
    for dep in job.after:
      d = self.by_key[dep]
      if d.status in ("failed", "cut", "skipped"):
        return f"needs {dep}, which {d.status}"
      if d.status != "finished":
        return "wait"
    if job.like:
      like = self.by_key.get(job.like)
      if like is None or like.status in ("failed", "cut", "skipped"):
        return f"no estimate: {job.like} {like.status if like else 'absent'}"
      if like.status != "finished":
        return "wait"
      if like.wall is None:  # Done in an earlier call: its training loop's time.
        like.wall = (read_final(like.workdir) or {}).get("train_seconds_this_run", 0.0) + 60
      estimate = like.wall
      left = self.args.budget_s - self.now()
      if estimate * MARGIN > left:
        return f"estimate {estimate:.0f} s (x{MARGIN}) > {left:.0f} s left"
      job.note = f"estimate {estimate:.0f} s from {job.like}"
    return "start"

  def launch(self, job: Job) -> None:
    cmd = self.command(job)
    job.workdir.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(self.args.root) / "jax_cache"))
    env.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    with open(job.log, "w") as log:
      log.write(shlex.join(cmd) + "\n")
      log.flush()
      job.proc = subprocess.Popen(
        [sys.executable, *cmd[1:]], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env
      )
    job.status, job.started = "running", self.now()
    self.say(f"start {job.key}" + (f" ({job.note})" if job.note else ""))

  def reap(self, job: Job) -> None:
    job.returncode = job.proc.returncode
    job.wall = self.now() - job.started
    final = read_final(job.workdir)
    if final is not None:
      job.status = "finished"
    elif job.terminated or self.stop_requested or job.returncode in (-15, 143):
      job.status = "cut"  # Stopped by a signal (one sent to the process group included).
    else:
      job.status = "failed"
    progress = last_progress(job.log)
    step = f", step {progress[0]}/{progress[1]}" if progress else ""
    self.say(f"{job.status} {job.key}: exit {job.returncode} after {job.wall:.0f} s{step}")

  def report_progress(self) -> None:
    """One line: each running run's step, img/s and its own ETA (or how long it has started)."""
    parts = []
    for job in self.jobs:
      if job.status == "running":
        name, p = job.key.split("/")[1], last_progress(job.log)
        if p:
          parts.append(f"{name} {p[0]}/{p[1]} {p[2]} img/s ETA {p[3]}")
        else:
          parts.append(f"{name} starting")
    if parts:
      self.say("running: " + "; ".join(parts))

  def terminate(self, why: str) -> None:
    running = [j for j in self.jobs if j.status == "running" and not j.terminated]
    if running:
      self.say(f"{why}: SIGTERM to {len(running)} run(s); each saves and exits")
    for job in running:
      job.terminated = True
      job.proc.send_signal(signal.SIGTERM)
    self.term_time = self.now()

  def run(self) -> None:
    last_report = 0.0
    stopping = False
    for job in self.jobs:  # ROOT again on a warm machine: finished runs stay, cut ones resume.
      if read_final(job.workdir) is not None:
        job.status, job.note = "finished", "done already"
        self.say(f"done already: {job.key}")
    while True:
      for job in self.jobs:
        if job.status == "running" and job.proc.poll() is not None:
          self.reap(job)
      out_of_time = self.now() >= self.args.budget_s
      if (out_of_time or self.stop_requested) and not stopping:
        stopping = True
        self.terminate("stop requested" if self.stop_requested else "budget spent")
      running = [j for j in self.jobs if j.status == "running"]
      if not stopping:
        for job in self.jobs:
          if job.status != "waiting" or len(running) >= self.args.max_procs:
            continue
          verdict = self.readiness(job)
          if verdict == "start":
            self.launch(job)
            running.append(job)
          elif verdict != "wait":
            job.status, job.note = "skipped", verdict
            self.say(f"skip {job.key}: {verdict}")
      if not running and (stopping or all(j.status != "waiting" for j in self.jobs)):
        break
      if not running:  # Waiting on nothing that runs: none of them can start.
        for job in self.jobs:
          if job.status == "waiting":
            job.status, job.note = "skipped", "waits on runs that never started"
            self.say(f"skip {job.key}: {job.note}")
        break
      if stopping and running and self.now() - self.term_time > GRACE_S:
        for job in running:
          self.say(f"{job.key} still running {GRACE_S} s after SIGTERM: SIGKILL")
          job.proc.kill()
      if self.now() - last_report >= REPORT_EVERY_S:
        last_report = self.now()
        self.report_progress()
      time.sleep(POLL_S)
    for job in self.jobs:
      if job.status == "waiting":
        job.status, job.note = "skipped", "not started before the budget was spent"

  # Results.
  def write_tables(self) -> None:
    root = pathlib.Path(self.args.root)
    names = list(dict.fromkeys(j.table.name for j in self.jobs))
    markdown, tables = [], {}
    for name in names:
      job = next(j for j in self.jobs if j.table.name == name)
      s = self.settings(job)
      cmd = [sys.executable, "-m", "vitboot_jax.tools.sweep", f"--table={name}"]
      cmd += [f"--root={job.root}", f"--seeds={','.join(map(str, s.seeds))}"]
      cmd += [f"--data_dir={self.args.data}", *(f"--override={f}" for f in s.extra)]
      try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        ok = proc.returncode == 0
        why = proc.stderr.strip().splitlines()[-1:] if not ok else []
      except subprocess.TimeoutExpired:
        ok, why = False, ["timed out"]
      md, js = (pathlib.Path(job.root) / f"{job.table.files}table.{x}" for x in ("md", "json"))
      if md.exists():
        markdown.append(f"## {name}\n\n" + md.read_text())
        tables[name] = json.loads(js.read_text())
      self.say(f"table {name}: " + ("written" if ok else f"failed: {' '.join(why)}"))
    if len(names) > 1:  # One file each at ROOT's top, which device_pack.sh sends back.
      (root / "table.md").write_text("\n".join(markdown))
      (root / "table.json").write_text(json.dumps(tables, indent=1))

  def summary(self) -> dict:
    runs = []
    for job in self.jobs:
      final = read_final(job.workdir) or {}
      progress = last_progress(job.log)
      runs.append(
        {
          "run": job.key,
          "config": sweep_runs.row_config(self.settings(job), job.row),
          "status": job.status,
          "note": job.note,
          "exit": job.returncode,
          "started_s": None if job.started is None else round(job.started, 1),
          "wall_s": None if job.wall is None else round(job.wall, 1),
          "step": progress[0] if progress else None,
          "total_steps": progress[1] if progress else None,
          "last_img_per_s": progress[2] if progress else None,
          "train_seconds": final.get("train_seconds_this_run"),
          **{k: v for k, v in final.items() if k.startswith(("top1", "val_top1"))},
        }
      )
    return {
      "item": self.args.item,
      "budget_s": self.args.budget_s,
      "elapsed_s": round(self.now(), 1),
      "gpu": gpu_name(),
      "command": shlex.join(sys.argv),
      "runs": runs,
    }

  def write_summary(self) -> None:
    root = pathlib.Path(self.args.root)
    summary = self.summary()
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [
      f"{r['run']}: {r['status']}"
      + (f" (exit {r['exit']})" if r["exit"] not in (0, None) else "")
      + (f" after {r['wall_s']:.0f} s" if r["wall_s"] is not None else "")
      + (f", step {r['step']}/{r['total_steps']}" if r["step"] is not None else "")
      + (f": {r['note']}" if r["note"] else "")
      for r in summary["runs"]
    ]
    (root / "rows.txt").write_text("\n".join(lines) + "\n")
    (root / "launcher.log").write_text("\n".join(self.lines) + "\n")
    print("\n".join(lines), flush=True)


def gpu_name() -> str | None:
  if not shutil.which("nvidia-smi"):
    return None
  try:
    out = subprocess.run(
      ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
      capture_output=True,
      text=True,
      timeout=20,
    )
    return out.stdout.strip() or None
  except (OSError, subprocess.TimeoutExpired):
    return None


def unpack_data(data: str) -> None:
  """DATA from DATA.tar.gz (the carried form) where the folder is absent."""
  folder = pathlib.Path(data)
  archive = folder.parent / (folder.name + ".tar.gz")
  if folder.is_dir() or not archive.is_file():
    return
  start = time.monotonic()
  with tarfile.open(archive) as tar:
    tar.extractall(folder.parent, filter="data")
  print(f"unpacked {archive} in {time.monotonic() - start:.1f} s", flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("item", choices=ITEMS)
  p.add_argument("root")
  p.add_argument("--data", default=DATA, help="the carried folder (relative: to the repo root)")
  p.add_argument("--budget_s", type=float, default=420.0, help="every run stops by then")
  p.add_argument("--epochs", type=int, default=0, help="toy checks: every run's epochs")
  p.add_argument("--seeds", default="", help="e.g. 0 (default: the tables', 0,1 for item 1)")
  p.add_argument("--max_procs", type=int, default=0, help="runs at once (default 4; item 2: 8)")
  p.add_argument("--steps_per_call", type=int, default=STEPS_PER_CALL)
  p.add_argument("--checkpoint_every", type=int, default=CHECKPOINT_EVERY)
  p.add_argument("--only", default="", help="comma-separated run names (default all)")
  p.add_argument("--override", action="append", default=[], help="a flag for every run")
  p.add_argument("--dry", action="store_true", help="print the plan's commands, run nothing")
  args = p.parse_args(argv)
  args.root = os.path.abspath(args.root)
  args.data = str(REPO / args.data) if not os.path.isabs(args.data) else args.data
  args.max_procs = args.max_procs or (4 if args.item == "schedule240" else 8)
  return args


def main(argv: list[str]) -> int:
  args = parse(argv)
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  jobs = plan(args.item, args.root, seeds)
  if args.only:
    only = set(args.only.split(","))
    jobs = [j for j in jobs if j.row.run_name in only]
    for j in jobs:  # What was left out neither gates nor sizes the rest.
      j.after = tuple(k for k in j.after if any(o.key == k for o in jobs))
      j.like = j.like if any(o.key == j.like for o in jobs) else None
  launcher = Launcher(args, jobs)
  if args.dry:
    for job in jobs:
      print(f"# {job.key}" + (f" after {', '.join(job.after)}" if job.after else ""))
      print(shlex.join(launcher.command(job)))
    return 0
  data = pathlib.Path(args.data)
  unpack_data(args.data)
  if not (data / "train").is_dir() or not (data / "val").is_dir():
    print(
      f"gpu_small_data.py: {data}/train and /val not found: bash launch/gpu_carry.sh",
      file=sys.stderr,
    )
    return 2
  pathlib.Path(args.root).mkdir(parents=True, exist_ok=True)

  def stop(signum, frame):
    del signum, frame
    launcher.stop_requested = True

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  launcher.say(f"{args.item}: {len(jobs)} runs, budget {args.budget_s:.0f} s, GPU {gpu_name()}")
  launcher.run()
  launcher.write_tables()
  launcher.write_summary()
  return 1 if any(j.status == "failed" for j in jobs) else 0  # Cut and skipped runs are listed.


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

"""Reading a sweep's results into its table and figures: per row and model the paper's top-1
and the mean and spread of ours over the finished seeds (ROOT/table.md, ROOT/table.json), and the
first seed's curves (ROOT/curves.png, tools/plot.py).
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import shlex
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from etils import epath

from vitboot_jax.base import files
from vitboot_jax.run import progress, provenance
from vitboot_jax.tools.sweep import paper_results, rules
from vitboot_jax.tools.sweep.runs import Settings, absolute, command, row_config, workdir
from vitboot_jax.tools.sweep.tables import MODEL_LABELS, Table, paper_top1, runs, teacher_run

TABLE_MD = "table.md"
TABLE_JSON = "table.json"
CURVES = "curves.png"
COMPUTE = "compute.png"
VALIDATION = "validation.png"


def _read_json(path: epath.Path) -> dict[str, Any] | None:
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def spread(values: Sequence[float]) -> dict[str, Any] | None:
  """Mean, sample std (None for one value), min, max and n; None without values."""
  if not values:
    return None
  values = [float(v) for v in values]
  return {
    "mean": statistics.fmean(values),
    "std": statistics.stdev(values) if len(values) > 1 else None,
    "min": min(values),
    "max": max(values),
    "n": len(values),
    "values": values,
  }


# A training metric averaged per epoch in the report (runs with a feature term log it).
RATIO = "train/hint_grad_ratio"
# The hint share's scale under balance= (its cap): RATIO is measured before it, so times it applied.
CAP_SCALE = "train/feature_balance_scale"


def epoch_means(workdir: epath.Path, key: str, times: str | None = None) -> list[float]:
  """The mean of `key` (times `times` of the same step, where given) over the logged steps of each
  epoch (1-based: steps of epoch e have e - 1 < step / steps_per_epoch <= e); [] where the run
  never logged them."""
  sums: dict[int, list[float]] = {}
  for record in files.read_jsonl(workdir / "metrics.jsonl"):  # A live run's last line may be torn.
    if key in record and "epoch" in record and (times is None or times in record):
      value = float(record[key]) * (1.0 if times is None else float(record[times]))
      sums.setdefault(math.ceil(record["epoch"] - 1e-9), []).append(value)
  return [statistics.fmean(sums[e]) for e in sorted(sums)]


def evaluations(workdir: epath.Path, split: str = "eval") -> list[dict[str, float]]:
  """Every evaluation of a run: its epoch and each model's top-1 (%), in order; on the test split
  or (`split`="val") the validation split."""
  out = []
  prefix = f"{split}/top1_"
  for record in files.read_jsonl(workdir / "metrics.jsonl"):
    top1 = {k.removeprefix(prefix): v for k, v in record.items() if k.startswith(prefix)}
    if top1:
      out.append({"epoch": record.get("epoch"), **{m: 100.0 * v for m, v in top1.items()}})
  return out


RATE = "train/img_per_s"


def seed_seconds(workdir: epath.Path, final: dict[str, Any]) -> float:
  """A finished seed's training time: its last launch's (final.json), and where that launch
  resumed, the steps before it timed from the rates the earlier launches logged (each step once,
  at the rate of the latest line that logged it; their evaluations and start-ups not counted)."""
  seconds = float(final.get("train_seconds_this_run", 0.0))
  resumed = int(final.get("resumed_from_step", 0))
  if resumed <= 0:
    return seconds
  batch = (_read_json(workdir / "config.json") or {}).get("batch_size")
  rates = {}  # Step -> img/s; a step logged again after a kill keeps its latest rate.
  for record in files.read_jsonl(workdir / "metrics.jsonl"):
    if RATE in record and 0 < record["step"] <= resumed:
      rates[int(record["step"])] = float(record[RATE])
  previous = 0
  for step in sorted(rates):  # Each step once, at the rate of the line that logged it.
    if batch and rates[step] > 0:
      seconds += (step - previous) * batch / rates[step]
    previous = step
  return seconds


def against_reference(entries: list[dict[str, Any]], reference: str) -> None:
  """Adds to every entry with a ViT its ViT's final top-1 against the reference row's: the
  difference of the means, the pooled sample std, the per-seed differences and whether it helps
  (beats the reference by more than twice the pooled std, and in every common seed)."""
  ref = next((e for e in entries if e["name"] == reference), None)
  ref_top1 = ref and ref["top1"].get("vit")
  for e in entries:
    mine = e["top1"].get("vit")
    if not (mine and ref_top1) or e is ref:
      continue
    ours, theirs = rules.per_seed(e), rules.per_seed(ref)
    seeds = sorted(set(ours) & set(theirs))
    per_seed = [ours[k] - theirs[k] for k in seeds]
    pooled = None
    if mine["std"] is not None and ref_top1["std"] is not None:
      pooled = math.sqrt((mine["std"] ** 2 + ref_top1["std"] ** 2) / 2)
    diff = mine["mean"] - ref_top1["mean"]
    e["vs_reference"] = {
      "reference": reference,
      "diff": diff,
      "pooled_std": pooled,
      "per_seed": dict(zip(seeds, per_seed)),
      "helps": pooled is not None and diff > 2 * pooled and all(d > 0 for d in per_seed),
    }


def aggregate(table: Table, s: Settings) -> list[dict[str, Any]]:
  """Per row: status, the statistics of the finished seeds' final.json (top-1 in %), the
  paper's top-1 and the commands."""
  out = []
  for row in table.rows:
    finals, started = {}, []
    for seed in s.seeds:
      wd = absolute(workdir(s, row, seed))
      final = _read_json(wd / "final.json")
      if final is not None:
        finals[seed] = final
      elif wd.exists():
        started.append(seed)
    if len(finals) == len(s.seeds):
      status = "done"
    elif finals:
      status = f"partial ({len(finals)}/{len(s.seeds)} seeds)"
    else:
      status = "incomplete" if started else "not run"
    run_epochs = sorted({float(f["epochs"]) for f in finals.values() if "epochs" in f})
    entry = {
      "name": row.name,
      "note": row.note,
      "run": row.run_name,
      "config": row_config(s, row),
      "overrides": list(row.overrides),
      "models": list(row.models),
      "status": status,
      "seeds_done": sorted(finals),
      "seeds_incomplete": started,
      "epochs": run_epochs,
      "epochs_match": s.epochs is None or all(math.isclose(e, s.epochs) for e in run_epochs),
      "train_seconds": sum(
        seed_seconds(absolute(workdir(s, row, k)), f) for k, f in finals.items()
      ),
      # final.json times only the last launch of a workdir: a resumed seed's earlier steps are
      # timed from their logged rates (seed_seconds).
      "seeds_resumed": sorted(k for k, f in finals.items() if f.get("resumed_from_step", 0) > 0),
      "paper_top1": {m: paper_top1(table, row, m) for m in row.models},
      "top1": {
        m: spread([100.0 * f[f"top1_{m}"] for f in finals.values() if f"top1_{m}" in f])
        for m in row.models
      },
      # The validation split's, where the runs held one: what a choice among rows reads.
      "val_top1": {
        m: spread([100.0 * f[f"val_top1_{m}"] for f in finals.values() if f"val_top1_{m}" in f])
        for m in row.models
      },
      "commands": [shlex.join(command(table, s, row, seed)) for seed in s.seeds],
      # Per finished seed, the hint's gradient norm over the CE's on the ViT, mean per epoch.
      "hint_grad_ratio": {
        seed: ratio
        for seed in sorted(finals)
        if (ratio := epoch_means(absolute(workdir(s, row, seed)), RATIO))
      },
      # The same with the cap applied, where the hint's gradient was capped (balance=).
      "hint_grad_ratio_applied": {
        seed: ratio
        for seed in sorted(finals)
        if (ratio := epoch_means(absolute(workdir(s, row, seed)), RATIO, times=CAP_SCALE))
      },
      "evaluations": {
        seed: evaluations(absolute(workdir(s, row, seed))) for seed in sorted(finals)
      },
      "val_evaluations": {
        seed: evaluations(absolute(workdir(s, row, seed)), "val") for seed in sorted(finals)
      },
      "teacher": teacher_run(row),
      "codes": {seed: run_codes(absolute(workdir(s, row, seed))) for seed in sorted(finals)},
    }
    out.append(entry)
  if table.compute:
    add_compute(table, s, out)
  # A row that starts from a finished run's agent costs that run's training too.
  seconds = {e["run"]: e["train_seconds"] for e in out}
  resumed = {e["run"]: bool(e["seeds_resumed"]) for e in out}
  # The strict reading counts a teacher's run in full for each of its students; the amortised one
  # shares it among the table's runs that read it.
  students = collections.Counter(e["teacher"] for e in {e["run"]: e for e in out}.values())
  for e in out:
    e["teacher_shared_by"] = students[e["teacher"]] if e["teacher"] else 0
    e["train_seconds_with_teacher"] = e["train_seconds"] + seconds.get(e["teacher"], 0.0)
    e["compute_resumed"] = resumed[e["run"]] or resumed.get(e["teacher"], False)
  if table.reference:
    against_reference(out, table.reference)
  return out


def add_compute(table: Table, s: Settings, entries: list[dict[str, Any]]) -> None:
  """Per entry, each finished seed's training compute in PFLOPs (tools/train_compute.py) and,
  where it reads a finished teacher, the teacher run's of the same seed."""
  from vitboot_jax.tools import train_compute

  own: dict[str, dict[int, float]] = {}
  for row, e in zip(table.rows, entries):
    if e["run"] not in own:
      own[e["run"]] = {}
      for seed in e["seeds_done"]:
        found = train_compute.run_compute(absolute(workdir(s, row, seed)))
        if found:
          own[e["run"]][seed] = found["train_flops"] / 1e15
  for e in entries:
    e["train_pflops"] = own[e["run"]]
    teacher = own.get(e["teacher"], {}) if e["teacher"] else {}
    e["teacher_pflops"] = {seed: teacher[seed] for seed in e["train_pflops"] if seed in teacher}


def run_codes(workdir: epath.PathLike) -> list[str]:
  """The short commit of each launch of the run in `workdir` ("+" where its checkout had
  uncommitted changes, "?" where none was known); [] for a run from before launches were kept."""
  codes = []
  for launch in provenance.launches(workdir):
    code = launch.get("code") or {}
    commit_ = code.get("commit")
    codes.append((commit_[:7] if commit_ else "?") + ("+" if code.get("dirty") else ""))
  return codes


def build_report(table: Table, s: Settings) -> dict[str, Any]:
  """The content of table.json: the rows' statistics and the sweep's settings."""
  entries = aggregate(table, s)
  unique = {e["run"]: e for e in entries}.values()  # A run of two models is listed twice.
  train_seconds = sum(e["train_seconds"] for e in unique)
  # How many finished runs each commit ran (a resumed run counts under each of its commits).
  codes: dict[str, int] = {}
  for e in unique:
    for seed_codes in e["codes"].values():
      for code in sorted(set(seed_codes)) or ["unrecorded"]:
        codes[code] = codes.get(code, 0) + 1
  return {
    "table": table.name,
    "title": table.title,
    "paper_source": paper_results.TABLES[table.paper].source if table.paper else None,
    "note_header": table.note_header,
    "root": s.root,
    "epochs": s.epochs,
    "seeds": list(s.seeds),
    "data_dir": s.data_dir,
    "table_overrides": list(table.overrides),
    "extra_overrides": list(s.extra),
    "commit": provenance.code()["commit"],
    "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "train_seconds": train_seconds,
    "run_codes": codes,
    "rows": entries,
    "chosen": rules.chosen(table, entries),
    "chosen_teacher": rules.chosen_teacher(table, entries),
    "chosen_student": rules.chosen_student(table, entries),
    "verdicts": rules.verdicts(table, entries),
    "target": rules.target(table, entries),
    "switch": rules.switch(table, entries),
    "files": table.files,
    "curves": None,
  }


def _format_top1(stats: dict[str, Any] | None, seeds: int) -> str:
  if stats is None:
    return "not run"
  if stats["std"] is None:
    return f"{stats['mean']:.2f}" + (" (1 seed)" if seeds > 1 else "")
  return f"{stats['mean']:.2f} ± {stats['std']:.2f} [{stats['min']:.2f}, {stats['max']:.2f}]"


def table_markdown(report: dict[str, Any]) -> str:
  """The table of `report` (as written to table.json) in Markdown: a line per row and model."""
  epochs = "the configs' epochs" if report["epochs"] is None else f"epochs {report['epochs']:g}"
  lines = [f"# {report['title']}", ""]
  paper_header = " paper top-1 |" if report["paper_source"] else ""
  if report["paper_source"]:
    lines += [
      f"Paper top-1: {report['paper_source']} (vitboot_jax/tools/sweep/paper_results.py).",
      "",
    ]
  validated = any(v for r in report["rows"] for v in r.get("val_top1", {}).values())
  val_header = " validation top-1 |" if validated else ""
  lines += [
    f"Ours: {epochs}, seeds {report['seeds']}; final-epoch top-1 (%) on the test set"
    + (" and on the validation split (held out of the training split)" if validated else "")
    + ", mean ± sample std [min, max] over the finished seeds. Training time: sum over seeds.",
    "",
    f"| row | model | {report['note_header']} |{paper_header} ours top-1 |{val_header} status "
    "| seeds | epochs | train time | config |",
    "|---|---|---|---|---|---|---|---|---|"
    + ("---|" if paper_header else "")
    + ("---|" if validated else ""),
  ]
  for r in report["rows"]:
    epochs = ", ".join(f"{e:.3g}" for e in r["epochs"]) + ("" if r["epochs_match"] else " (!)")
    duration = progress.duration(r["train_seconds"]) + (" (*)" if r["seeds_resumed"] else "")
    config = " ".join([r["config"].removeprefix("configs/"), *r["overrides"]])
    for model in r["models"]:
      paper = r["paper_top1"][model]
      lines.append(
        f"| {r['name']} | {MODEL_LABELS[model]} | {r['note']} "
        + (f"| {'—' if paper is None else f'{paper:.2f}'} " if paper_header else "")
        + f"| {_format_top1(r['top1'][model], len(report['seeds']))} "
        + (
          f"| {_format_top1(r['val_top1'].get(model), len(report['seeds']))} " if validated else ""
        )
        + f"| {r['status']} "
        f"| {','.join(map(str, r['seeds_done'])) or '—'} | {epochs or '—'} "
        f"| {duration if r['seeds_done'] else '—'} | `{config}` |"
      )
  lines += rules.chosen_lines(report.get("chosen"))
  lines += rules.teacher_lines(report.get("chosen_teacher"))
  lines += rules.student_lines(report.get("chosen_student"))
  lines += rules.verdict_lines(report.get("verdicts"))
  lines += rules.switch_lines(report.get("switch"))
  lines += rules.target_lines(report.get("target"))
  lines += [
    "",
    f"Total training time {progress.duration(report['train_seconds'])}; table written at commit "
    f"`{report['commit'] or 'unknown'}`; generated {report['generated']}.",
  ]
  if report["run_codes"]:
    lines.append(
      "Code of the finished runs, with how many ran it (launches.jsonl; + uncommitted changes, "
      "unrecorded: a run from before launches were kept): "
      + ", ".join(f"`{code}` ({n})" for code, n in sorted(report["run_codes"].items()))
      + "."
    )
  if report["data_dir"]:
    lines.append(f"Data: the image folder `{report['data_dir']}`.")
  flags_of_all = report["table_overrides"] + report["extra_overrides"]
  if flags_of_all:
    lines.append(f"Flags of every run: `{' '.join(flags_of_all)}`.")
  if any(r["seeds_resumed"] for r in report["rows"]):
    lines.append(
      "(*) a seed of this row (in the compute column, or of its teacher) resumed from a "
      "checkpoint: the steps before its last launch are timed from the rates its earlier launches "
      "logged, without their evaluations and start-ups."
    )
  if not all(r["epochs_match"] for r in report["rows"]):
    lines.append(f"(!) a finished run of this row trained other than {report['epochs']:g} epochs.")
  ratios = [r for r in report["rows"] if r.get("hint_grad_ratio")]
  if ratios:
    width = max(len(v) for r in ratios for v in r["hint_grad_ratio"].values())
    capped = any(r.get("hint_grad_ratio_applied") for r in ratios)
    lines += [
      "",
      "The hint's pull on the ViT: the norm of the feature term's share of the ViT's gradient over "
      "the cross-entropy's (`hint_grad_ratio`), mean over each epoch's logged steps, per seed"
      + (
        "; a row whose hint gradient is capped (balance=) gives it before the cap and as applied "
        "(times the cap's scale, `feature_balance_scale`, at each step):"
        if capped
        else ":"
      ),
      "",
      "| row | seed | " + " | ".join(f"epoch {e + 1}" for e in range(width)) + " |",
      "|---|---|" + "---|" * width,
    ]
    for r in ratios:
      series = [(r["name"], r["hint_grad_ratio"])]
      if r.get("hint_grad_ratio_applied"):
        series = [
          (f"{r['name']}, before the cap", r["hint_grad_ratio"]),
          (f"{r['name']}, applied", r["hint_grad_ratio_applied"]),
        ]
      for name, by_seed in series:
        for seed, values in by_seed.items():
          cells = [f"{v:.3g}" for v in values] + [""] * (width - len(values))
          lines.append(f"| {name} | {seed} | " + " | ".join(cells) + " |")
  compared = [r for r in report["rows"] if r.get("vs_reference")]
  if compared:
    lines += ["", *reference_markdown(report, compared)]
  if report.get("curves"):
    lines += ["", f"![curves of seed {report['seeds'][0]}]({report.get('files', '')}{CURVES})"]
  return "\n".join(lines) + "\n"


def reference_markdown(report: dict[str, Any], compared: list[dict[str, Any]]) -> list[str]:
  """Each row's ViT against the reference row's: top-1 at every evaluation (mean over the finished
  seeds), the final difference with the pooled std and per seed, and the compute it costs."""
  reference = compared[0]["vs_reference"]["reference"]
  rows = [r for r in report["rows"] if r["name"] == reference] + compared
  epochs = sorted(
    {ev["epoch"] for r in rows for evs in r["evaluations"].values() for ev in evs},
    key=float,
  )
  lines = [
    f"The ViT of each row against the ViT of `{reference}`: top-1 (%) at each evaluation (mean "
    "over the finished seeds), the final difference of the means ± the pooled sample std, per "
    "seed, and whether the row helps (more than twice the pooled std, in every seed). Compute: "
    "the row's training time summed over seeds, with its teacher's run where it reads one; "
    "where counted, first its training FLOPs a seed (tools/train_compute.py, the teacher's run "
    "apart; where the table's rows share a teacher's run, its share amortised beside it).",
    "",
    "| row | "
    + " | ".join(f"epoch {float(e):g}" for e in epochs)
    + " | difference | per seed | helps | compute |",
    "|---|" + "---|" * (len(epochs) + 4),
  ]
  for r in rows:
    cells = []
    for epoch in epochs:
      values = [
        ev["vit"]
        for evs in r["evaluations"].values()
        for ev in evs
        if ev["epoch"] == epoch and "vit" in ev
      ]
      cells.append(f"{statistics.fmean(values):.2f}" if values else "")
    vs = r.get("vs_reference")
    if vs is None:
      diff = per_seed = helps = "reference"
    else:
      pooled = "" if vs["pooled_std"] is None else f" ± {vs['pooled_std']:.2f}"
      diff = f"{vs['diff']:+.2f}{pooled}"
      per_seed = ", ".join(f"{k}: {d:+.2f}" for k, d in vs["per_seed"].items())
      helps = "yes" if vs["helps"] else "no"
    teacher = f" (incl. {r['teacher']})" if r["teacher"] else ""
    compute = progress.duration(r["train_seconds_with_teacher"]) + teacher
    compute += " (*)" if r["compute_resumed"] else ""
    pflops = rules.mean_pflops(r)
    if pflops is not None:
      own, teacher_share = pflops
      counted = f"{own:.4f}" + (f" + {teacher_share:.4f} teacher" if teacher_share else "")
      if teacher_share and r.get("teacher_shared_by", 0) > 1:
        shared = r["teacher_shared_by"]
        counted += f" (amortised over its {shared} students: {teacher_share / shared:.4f})"
      compute = f"{counted} PFLOPs; {compute}"
    lines.append(
      f"| {r['name']} | " + " | ".join(cells) + f" | {diff} | {per_seed} | {helps} | {compute} |"
    )
  return lines


def plot_curves(table: Table, s: Settings, seed: int) -> epath.Path | None:
  """ROOT/curves.png over the runs of `seed` that have logged; None if none."""
  found = [(row.name, absolute(workdir(s, row, seed))) for row in runs(table.rows)]
  found = [(name, wd) for name, wd in found if (wd / "metrics.jsonl").exists()]
  if not found:
    return None
  from vitboot_jax.tools import plot

  try:
    return plot.plot_runs(
      [wd for _, wd in found],
      absolute(epath.Path(s.root)) / f"{table.files}{CURVES}",
      labels=[name for name, _ in found],
      title=f"{table.title}, seed {seed}",
    )
  except ModuleNotFoundError as error:
    if error.name != "matplotlib":
      raise
    print(f"warning: no {CURVES}: {error}", file=sys.stderr)
    return None


def _pyplot(what: str):
  """matplotlib's pyplot on the Agg backend, or None (with a warning) where it is missing."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
  except ModuleNotFoundError as error:
    print(f"warning: no {what} figure: {error}", file=sys.stderr)
    return None
  return plt


def _save(plt, figure, axes, title: str, path: epath.Path) -> epath.Path:
  """The report figures' title, grid and legend beside the axes, written to `path`."""
  axes.set_title(title, fontsize=9)
  axes.grid(alpha=0.3)
  axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
  figure.tight_layout()
  figure.savefig(str(path), dpi=120)
  plt.close(figure)
  return path


def plot_compute(report: dict[str, Any], root: epath.Path) -> epath.Path | None:
  """ROOT/compute.png: every finished seed's final ViT top-1 against its training PFLOPs, the
  teacher's run drawn apart (a line from the row's own compute to its total); None if none."""
  points = [
    (r, seed, top1)
    for r in report["rows"]
    if r.get("train_pflops") and r["top1"].get("vit")
    for seed, top1 in zip(r["seeds_done"], r["top1"]["vit"]["values"])
  ]
  if not points:
    return None
  plt = _pyplot("compute")
  if plt is None:
    return None
  figure, axes = plt.subplots(figsize=(8, 5))
  styles = {}  # Ten colours, then a new marker: past ten rows no two look alike.
  for r, seed, top1 in points:
    n = len(styles)
    colour, marker = styles.setdefault(r["name"], (f"C{n % 10}", "osD^v"[(n // 10) % 5]))
    own = r["train_pflops"].get(seed, r["train_pflops"].get(str(seed)))
    teacher = (r.get("teacher_pflops") or {}).get(seed, 0.0)
    label = r["name"] if seed == r["seeds_done"][0] else None
    axes.scatter([own + teacher], [top1], color=colour, marker=marker, label=label, zorder=3)
    if teacher:
      axes.plot([own, own + teacher], [top1, top1], color=colour, lw=1, ls=":")
      axes.scatter([own], [top1], color=colour, marker="|", zorder=3)
  axes.set_xlabel("training compute, PFLOPs (dotted: the teacher's run)")
  axes.set_ylabel("ViT final top-1 (%)")
  return _save(plt, figure, axes, report["title"], root / f"{report.get('files', '')}{COMPUTE}")


def plot_validation(report: dict[str, Any], root: epath.Path) -> epath.Path | None:
  """ROOT/validation.png: each row's ViT validation top-1 against epochs, the mean over its
  finished seeds (what the table chooses on); None where no run held a validation split."""
  curves = {}
  for r in report["rows"]:
    by_epoch: dict[float, list[float]] = {}
    for evs in r.get("val_evaluations", {}).values():
      for ev in evs:
        if "vit" in ev:
          by_epoch.setdefault(ev["epoch"], []).append(ev["vit"])
    if by_epoch and "vit" in r["models"]:
      curves[r["name"]] = sorted((e, statistics.fmean(v)) for e, v in by_epoch.items())
  if not curves:
    return None
  plt = _pyplot("validation")
  if plt is None:
    return None
  figure, axes = plt.subplots(figsize=(8, 5))
  for n, (name, points) in enumerate(curves.items()):
    epochs, top1 = zip(*points)
    axes.plot(epochs, top1, color=f"C{n % 10}", ls="-:"[(n // 10) % 2], label=name)
  axes.set_xlabel("epoch")
  axes.set_ylabel("ViT validation top-1 (%), mean over seeds")
  return _save(plt, figure, axes, report["title"], root / f"{report.get('files', '')}{VALIDATION}")


def write_report(root: epath.Path, report: dict[str, Any]) -> None:
  root.mkdir(parents=True, exist_ok=True)
  (root / f"{report['files']}{TABLE_JSON}").write_text(json.dumps(report, indent=2) + "\n")
  (root / f"{report['files']}{TABLE_MD}").write_text(table_markdown(report))

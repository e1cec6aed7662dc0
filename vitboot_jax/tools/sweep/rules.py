"""The rules a table reads its finished rows by, each written before its table's runs
(docs/results.md) and read from the report's entries (report.aggregate), with their lines in the
sweep's report. Choices read the validation split only, never the test split: the screening
grid's winner (Table.choose_within), the small-data study's teacher (Table.choose_teacher_within),
its students' recipe (Table.choose_student_within) and a one-switch choice (Table.choose_switch).
The readings of final rows read the test split with validation beside it: the verdict on methods
set against their papers (Table.paper_gains) and a target (Table.target)."""

from __future__ import annotations

import re
import statistics
from typing import Any

from vitboot_jax.tools.sweep.spec import Table


def mean_pflops(entry: dict[str, Any]) -> tuple[float, float] | None:
  """(own, teacher's) PFLOPs of a row, means over its finished seeds; None where not counted."""
  own = entry.get("train_pflops")
  if not own:
    return None
  teacher = entry.get("teacher_pflops") or {}
  return statistics.fmean(own.values()), statistics.fmean(teacher.values()) if teacher else 0.0


def chosen(table: Table, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
  """The row a table picks on validation (Table.choose_within), with the best one it was measured
  against; None where the table chooses nothing or no row has a validation top-1 yet."""
  if table.choose_within is None:
    return None
  scored = [(e["name"], e["val_top1"]["vit"]["mean"]) for e in entries if e["val_top1"].get("vit")]
  if not scored:
    return None
  best = max(scored, key=lambda item: item[1])
  winner = next(item for item in scored if item[1] >= best[1] - table.choose_within)
  return {
    "row": winner[0],
    "val_top1": winner[1],
    "best_row": best[0],
    "best_val_top1": best[1],
    "within": table.choose_within,
    "rows_with_validation": len(scored),
    "rows": len(table.rows),
  }


def chosen_teacher(table: Table, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
  """The teachers' rule (Table.choose_teacher_within; docs/results.md, "Finished teachers"): the
  CIFAR ResNet's size with the better validation top-1 (an exact tie: the cheaper), then the
  better of that ResNet and the agent, the cheaper in training FLOPs within the margin; the other
  of the two is the other teacher. {"waiting_for": rows} until every row has both numbers."""
  within = table.choose_teacher_within
  if within is None:
    return None
  val = {
    e["name"]: e["val_top1"][e["models"][0]]["mean"]
    for e in entries
    if e["val_top1"].get(e["models"][0])
  }
  flops = {e["name"]: mean_pflops(e)[0] for e in entries if e.get("train_pflops")}
  resnets = [e["name"] for e in entries if e["models"] == ["cnn"]]
  agents = [e["name"] for e in entries if e["models"] == ["agent"]]
  missing = [n for n in agents + resnets if n not in val or n not in flops]
  if missing or not resnets or len(agents) != 1:
    return {"waiting_for": missing}
  resnet = max(resnets, key=lambda n: (val[n], -flops[n]))
  pair = (resnet, agents[0])
  gap = abs(val[pair[0]] - val[pair[1]])
  close = gap <= within + 1e-9  # Top-1 in % of 5,000 images moves in 0.02 steps.
  teacher = min(pair, key=flops.get) if close else max(pair, key=val.get)
  return {
    "teacher": teacher,
    "other": pair[1] if teacher == pair[0] else pair[0],
    "resnet": resnet,
    "resnets": resnets,
    "val_top1": val,
    "pflops": flops,
    "within": within,
    "close": close,
  }


def chosen_lines(pick: dict[str, Any] | None) -> list[str]:
  """The winner `chosen` read, with how many rows it has read so far."""
  if not pick:
    return []
  read = (
    "."
    if pick["rows_with_validation"] == pick["rows"]
    else f"; so far: {pick['rows_with_validation']} of {pick['rows']} rows have finished."
  )
  return [
    "",
    f"Chosen on validation, never on the test split: **{pick['row']}** "
    f"({pick['val_top1']:.2f}; the best is {pick['best_row']}, {pick['best_val_top1']:.2f}: of "
    f"the rows within {pick['within']:g} point of the best, the first in table order){read}",
  ]


def teacher_lines(pick: dict[str, Any] | None) -> list[str]:
  """The teachers' rule as read (chosen_teacher), or what it waits for."""
  if not pick:
    return []
  if "teacher" not in pick:
    return ["", f"The teachers' rule waits for: {', '.join(pick['waiting_for'])}."]
  val, flops = pick["val_top1"], pick["pflops"]
  sizes = ", ".join(f"{n} {val[n]:.2f}" for n in pick["resnets"])
  teacher, other = pick["teacher"], pick["other"]
  why = (
    f"within {pick['within']:g} point of each other: the cheaper to train, {flops[teacher]:.3f} "
    f"PFLOPs against {flops[other]:.3f}"
    if pick["close"]
    else f"{val[teacher] - val[other]:+.2f} point on validation"
  )
  return [
    "",
    f"The teachers' rule, on validation, never on the test split: the ResNet is "
    f"**{pick['resnet']}** (validation top-1: {sizes}); the teacher is **{teacher}** "
    f"({val[teacher]:.2f}), the other **{other}** ({val[other]:.2f}): {why}.",
  ]


def _complete(entry: dict[str, Any] | None, table: Table) -> bool:
  """Whether a row has finished every seed of the table (what a rule over seeds reads)."""
  return bool(entry and entry["seeds_done"]) and sorted(entry["seeds_done"]) == sorted(table.seeds)


def switch(table: Table, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
  """Table.choose_switch read on validation once both rows have every seed of the table: "on"
  only where its row is higher (a tie keeps the switch off); {"waiting_for"} until then."""
  if table.choose_switch is None:
    return None
  by_name = {e["name"]: e for e in entries}
  pair = [by_name.get(n) for n in table.choose_switch]
  missing = [
    n
    for n, e in zip(table.choose_switch, pair)
    if not _complete(e, table) or not e["val_top1"].get("vit")
  ]
  if missing:
    return {"waiting_for": missing}
  off, on = (e["val_top1"]["vit"]["mean"] for e in pair)
  # Top-1 on 5,000 images moves in 0.02 steps: a difference under 1e-9 is a tie.
  return {"rows": list(table.choose_switch), "val_top1": [off, on], "on": on > off + 1e-9}


def switch_lines(read: dict[str, Any] | None) -> list[str]:
  """The switch as read on validation, or the rows it waits for."""
  if not read:
    return []
  if "on" not in read:
    return ["", f"The switch waits for every seed of: {', '.join(read['waiting_for'])}."]
  (off_row, on_row), (off, on) = read["rows"], read["val_top1"]
  pick = on_row if read["on"] else off_row
  return [
    "",
    f"Chosen on validation, never on the test split: **{pick}** ({on_row} {on:.2f} against "
    f"{off_row} {off:.2f}; a tie keeps the switch off).",
  ]


def chosen_student(table: Table, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
  """The students' rule (Table.choose_student_within; docs/results.md, "Finished teachers"): of
  the rows whose ViT learns from a finished teacher, the best mean validation top-1 over every
  seed of the table; within the margin, the cheapest in training PFLOPs, its teacher's run
  counted in full (the strict reading); an exact tie in both, the first in table order.
  {"waiting_for": rows} until every such row has every seed and its compute."""
  within = table.choose_student_within
  if within is None:
    return None
  taught = [e for e in entries if e.get("teacher") and "vit" in e["models"]]
  missing = [
    e["name"]
    for e in taught
    if not _complete(e, table) or not e["val_top1"].get("vit") or mean_pflops(e) is None
  ]
  if missing or not taught:
    return {"waiting_for": missing}
  val = {e["name"]: e["val_top1"]["vit"]["mean"] for e in taught}
  cost = {e["name"]: sum(mean_pflops(e)) for e in taught}
  order = list(val)
  best = max(order, key=val.get)  # max and min keep the first of equal keys: table order.
  close = [n for n in order if val[n] >= val[best] - within - 1e-9]  # Top-1 moves in 0.02 steps.
  pick = min(close, key=cost.get)
  return {"row": pick, "best_row": best, "val_top1": val, "pflops": cost, "within": within}


def student_lines(pick: dict[str, Any] | None) -> list[str]:
  """The students' rule as read (chosen_student), or the rows it waits for."""
  if not pick:
    return []
  if "row" not in pick:
    return ["", f"The students' rule waits for every seed of: {', '.join(pick['waiting_for'])}."]
  val, cost, row, best = pick["val_top1"], pick["pflops"], pick["row"], pick["best_row"]
  why = (
    "the best"
    if row == best
    else f"within {pick['within']:g} point of the best, {best} ({val[best]:.2f}), and cheaper: "
    f"{cost[row]:.3f} PFLOPs against {cost[best]:.3f}"
  )
  read = ", ".join(f"{n} {val[n]:.2f} ({cost[n]:.3f} PFLOPs)" for n in val)
  return [
    "",
    f"The students' rule, on validation, never on the test split: the recipe is **{row}** "
    f"({val[row]:.2f}: {why}; every student, its teacher's run counted in full: {read}).",
  ]


def per_seed(entry: dict[str, Any], split: str = "top1") -> dict[int, float]:
  """A report entry's final ViT top-1 per finished seed on `split` ("top1": test, "val_top1")."""
  stats = entry[split].get("vit")
  return dict(zip(entry["seeds_done"], stats["values"])) if stats else {}


def verdicts(table: Table, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per method of Table.paper_gains, once it and the reference have every seed of the table
  (docs/results.md, the seeds' methods' verdict): "helps" where the report's rule says so (the
  test mean ahead by more than twice the pooled std and ahead in every seed), else "goes its
  paper's way" where it is ahead in every seed on test and on validation, else "no gain shown";
  with the differences and the paper's gain. {"row", "waiting_for"} until then."""
  by_name = {e["name"]: e for e in entries}
  reference = by_name.get(table.reference) if table.reference else None
  out = []
  for name, paper_gain in table.paper_gains:
    entry = by_name.get(name)
    missing = [e["name"] if e else "?" for e in (entry, reference) if not _complete(e, table)]
    if missing:
      out.append({"row": name, "reference": table.reference, "waiting_for": missing})
      continue
    diffs = {}
    for split in ("top1", "val_top1"):
      theirs = per_seed(reference, split)
      diffs[split] = {k: v - theirs[k] for k, v in per_seed(entry, split).items()}
    ahead = all(split and all(d > 0 for d in split.values()) for split in diffs.values())
    helps = bool(entry.get("vs_reference", {}).get("helps"))
    out.append(
      {
        "row": name,
        "reference": table.reference,
        "verdict": "helps" if helps else "goes its paper's way" if ahead else "no gain shown",
        "test_diff": statistics.fmean(diffs["top1"].values()),
        "val_diff": statistics.fmean(diffs["val_top1"].values()),
        "per_seed": diffs,
        "paper_gain": paper_gain,
      }
    )
  return out


def verdict_lines(found: list[dict[str, Any]] | None) -> list[str]:
  """One line a method: its verdict against the table's reference, or what it waits for."""
  if not found:
    return []
  reference = found[0]["reference"]
  lines = [
    "",
    f"The methods against their papers, each set against {reference} (the rule written "
    "before the runs, docs/results.md):",
  ]
  for v in found:
    if "verdict" not in v:
      lines.append(f"- {v['row']}: waits for every seed of {', '.join(v['waiting_for'])}.")
      continue
    seeds = ", ".join(f"{d:+.2f}" for d in v["per_seed"]["top1"].values())
    lines.append(
      f"- {v['row']}: **{v['verdict']}**: test {v['test_diff']:+.2f} (per seed {seeds}), "
      f"validation {v['val_diff']:+.2f}; its paper: {v['paper_gain']:+.2f}."
    )
  return lines


def _epochs(entry: dict[str, Any]) -> float:
  """A row's schedule: its config's epochs= arg, else what its finished runs trained."""
  found = re.search(r"[:,]epochs=(\d+)", entry["config"])
  return float(found.group(1)) if found else max(entry["epochs"], default=0.0)


def target(table: Table, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
  """Table.target read on the ViT rows of at most its epochs with every seed of the table: the
  best of them, the rows that reach the target and the rows still waiting; None where the table
  has no target."""
  if table.target is None:
    return None
  top1, epochs = table.target
  vit = [e for e in entries if "vit" in e["models"] and _epochs(e) <= epochs]
  done = [e for e in vit if _complete(e, table)]
  best = max(done, key=lambda e: e["top1"]["vit"]["mean"], default=None)
  return {
    "target": top1,
    "epochs": epochs,
    "best_row": best["name"] if best else None,
    "best_top1": best["top1"]["vit"]["mean"] if best else None,
    "reached": [e["name"] for e in done if e["top1"]["vit"]["mean"] >= top1],
    "waiting_for": [e["name"] for e in vit if e not in done],
  }


def target_lines(read: dict[str, Any] | None) -> list[str]:
  """The target as read: reached by which rows, or how far the closest row is from it."""
  if not read:
    return []
  line = (
    f"The target, ViT test top-1 >= {read['target']:g} within {read['epochs']} epochs (mean of "
    "every seed): "
  )
  if read["reached"]:
    line += f"reached by **{', '.join(read['reached'])}**"
  elif read["best_row"]:
    short = read["target"] - read["best_top1"]
    # While rows wait, the closest finished row is no verdict on the target.
    line += (
      "not reached yet: of the rows with every seed, the closest is"
      if read["waiting_for"]
      else "not reached: the closest is"
    )
    line += f" **{read['best_row']}** ({read['best_top1']:.2f}, {short:.2f} short)"
  else:
    line += "no row has every seed yet"
  if read["waiting_for"]:
    line += f"; waiting for {', '.join(read['waiting_for'])}"
  return ["", line + "."]

"""What a sweep table is: rows of config files with their args and the models whose final top-1
each reports, gathered under a title with the settings every run of the table shares. The tables
themselves: tables.py (the paper's) and study_rows.py (the studies' rows)."""

from __future__ import annotations

import dataclasses

# The recipe of a paper row that runs the authors' config and code, which made the published
# numbers (the report's "recipe" column; tables.py names the others).
CODE = "authors' code"


@dataclasses.dataclass(frozen=True)
class Row:
  """One row: a config file with its args (+ flags), and whose final top-1 it reports."""

  name: str  # The paper's row label (its published top-1 is looked up by it) or ours.
  config: str  # "configs/<file>.py:<args>", relative to the repository root.
  models: tuple[str, ...] = ("vit",)  # "vit", "agent" or "cnn": the final top-1s reported.
  note: str = CODE  # Paper rows: the recipe; replication rows: what the row is.
  overrides: tuple[str, ...] = ()  # Extra --config.* flags of this row.
  run: str | None = None  # Workdir prefix; None: named after the config.

  @property
  def run_name(self) -> str:
    if self.run:
      return self.run
    stem = self.config.split("/")[-1].replace(".py:", "_").removesuffix(".py")
    return stem.replace(",", "_").replace("=", "-")


@dataclasses.dataclass(frozen=True)
class Table:
  name: str
  title: str
  rows: tuple[Row, ...]
  paper: str | None = None  # Key of paper_results.TABLES; None: no published numbers.
  note_header: str = "recipe"
  seeds: tuple[int, ...] = (0,)  # Default --seeds.
  epochs: int | None = None  # Default --epochs, appended to every row's args; None: the config's.
  data_folder: bool = False  # Pass the image folder --data_dir to every run.
  overrides: tuple[str, ...] = ()  # Flags of every run of this table.
  root: str = ""  # Default --root.
  # Prefix of the report files in ROOT (table.md, table.json, curves.png, ...): tables that share a
  # root, to read each other's runs, keep their reports apart.
  files: str = ""
  # A row every other row's ViT is set against (difference, pooled std, per seed; sweep_report).
  reference: str | None = None
  # Report each row's training compute in FLOPs from its traced train step (tools/train_compute.py).
  compute: bool = False
  # Pick the winner on the validation split (never the test split): the best mean validation
  # top-1 of the ViT at the final epoch; of the rows within this many points of it, the first in
  # table order (the fewest switches). None: the table chooses nothing.
  choose_within: float | None = None
  # Pick a teacher on validation (rules.chosen_teacher): the CIFAR ResNet's size by validation
  # top-1, then that ResNet or the agent, the cheaper in training FLOPs where they are within this
  # many points. None: no teacher is picked.
  choose_teacher_within: float | None = None
  # Methods set against their papers (rules.verdicts): (row name, the paper's gain in points over
  # the paper's own baseline), each row read against the table's reference once every seed of
  # both has finished. Empty: no verdicts.
  paper_gains: tuple[tuple[str, float], ...] = ()
  # A target for the ViT's test top-1 within a schedule, (top-1, most epochs) (rules.target):
  # which row of at most that many epochs reaches it on the mean of every seed of the table, or
  # which came closest and by how much. None: no target.
  target: tuple[float, int] | None = None
  # Two rows that differ in one switch, (off, on) (rules.switch): the switch is chosen only where
  # its row's mean validation top-1 over every seed of the table is higher. None: no such choice.
  choose_switch: tuple[str, str] | None = None
  # Pick the students' recipe on validation (rules.chosen_student): of the rows whose ViT learns
  # from a finished teacher, once each has every seed, the best mean validation top-1 of the ViT;
  # within this many points of it, the cheapest in training PFLOPs with its teacher's run counted
  # in full. None: no recipe is picked.
  choose_student_within: float | None = None

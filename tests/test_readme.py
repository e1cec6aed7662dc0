"""README: its paper tables are generated from paper_results (one place for the paper's numbers)
and the commands it gives exist; it and the code keep the house's size rules."""

import pathlib
import re

import pytest

from vitboot_jax.tools.sweep import tables as sweep_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAPER_TABLES = (ROOT / "docs" / "paper_tables.md").read_text()  # Table 3, too long for the README.
README_MAX_LINES = 520  # The front door stays readable in one sitting (big_vision's: 505).
README_MAX_LINE = 600  # Characters: a table row or bullet longer than this belongs in docs/.
MODULE_MAX_LINES = 600  # A module past this holds two concerns: split it along their seam.


def _block(marker: str, text: str = README) -> str:
  match = re.search(rf"<!-- {re.escape(marker)}[^>]*-->\n(.*?)<!-- end -->", text, re.S)
  assert match, f"no block <!-- {marker} ... -->"
  return match.group(1)


def test_readme_stays_short():
  lines = README.count("\n")
  assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
  long = [
    f"line {number} ({len(line)} characters)"
    for number, line in enumerate(README.splitlines(), 1)
    if len(line) > README_MAX_LINE
  ]
  assert not long, f"README.md lines over {README_MAX_LINE} characters: {long}; reflow them"


def test_no_module_is_over_the_house_limit():
  modules = [
    p for folder in ("vitboot_jax", "configs", "launch") for p in (ROOT / folder).rglob("*.py")
  ]
  long = [
    f"{path.relative_to(ROOT)} ({count} lines)"
    for path in sorted(modules)
    if (count := path.read_text().count("\n")) > MODULE_MAX_LINES
  ]
  assert not long, f"modules over {MODULE_MAX_LINES} lines: {long}; split each along a seam"


@pytest.mark.parametrize(
  "marker, table, also, text",
  [
    ("sweep --table=cifar100", "cifar100", ("cifar10",), README),
    ("sweep --table=imagenet", "imagenet", (), PAPER_TABLES),
    ("sweep --table=ablation", "ablation", (), README),
  ],
  ids=["cifar100", "imagenet", "ablation"],  # Not the documents' text: the durations print ids.
)
def test_paper_tables_are_generated_from_paper_results(marker, table, also, text):
  assert _block(marker, text) == sweep_tables.rows_markdown(sweep_tables.TABLES[table], *also)


def test_config_paths_in_readme_exist():
  root = pathlib.Path(__file__).resolve().parents[1]
  paths = set(re.findall(r"configs/[a-z0-9_]+\.py", README))
  assert paths, "README names no config"
  missing = sorted(p for p in paths if not (root / p).is_file())
  assert not missing, f"README names configs that do not exist: {missing}"


def test_tool_modules_in_readme_exist():
  root = pathlib.Path(__file__).resolve().parents[1]
  tools = set(re.findall(r"python -m (vitboot_jax(?:\.\w+)+)", README))
  path = lambda module: root / module.replace(".", "/")  # A module, or a package's __main__.
  missing = sorted(
    t
    for t in tools
    if not (path(t).with_suffix(".py").is_file() or (path(t) / "__main__.py").is_file())
  )
  assert not missing, f"README runs modules that do not exist: {missing}"


def test_the_code_map_names_every_module():
  section = README[README.index("## Code map") : README.index("## Documentation")]
  package = ROOT / "vitboot_jax"
  unnamed = []
  for path in sorted(package.rglob("*.py")):
    if path.name == "__init__.py":
      continue
    stem = path.stem
    named = re.search(rf"[`/]{re.escape(stem)}\.py`", section) or (
      path.parent.name == "data" and f"`{stem}`" in section
    )
    if not named:
      unnamed.append(str(path.relative_to(ROOT)))
  assert not unnamed, f"README's code map does not name: {unnamed}"

r"""Downloads and prepares a tfds dataset once, for runs that must not download themselves.

  python -m vitboot_jax.tools.prepare_data cifar10 --data_dir=/data/tfds

A single-process training run does this by itself on first use; a multi-process run (a pod, a
SLURM job) does not, since its processes would race to write the same files. Run this once on a
machine with internet, copy DIR where the run can read it if needed, and train with
`--config.data.dir=DIR`. Without --data_dir: tfds' default ($TFDS_DATA_DIR, else
~/tensorflow_datasets). Datasets that tfds cannot download (imagenet2012) get tfds' manual
instructions: put the archives in DIR/downloads/manual and run this again.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from vitboot_jax import cli, errors, progress

_DATA_DIR = flags.DEFINE_string("data_dir", None, "tfds data directory (default: tfds' own).")


def prepare(name: str, data_dir: str | None) -> str:
  """Prepares tfds dataset `name` in `data_dir` (a no-op if it is); returns its directory."""
  from vitboot_jax import datasets

  builder = datasets.tfds_builder(name, data_dir)
  if datasets.is_prepared(builder):
    logging.info("%s is already prepared in %s.", name, builder.data_dir)
    return builder.data_dir
  if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
    manual = builder.data_dir_root / "downloads" / "manual"
    if not manual.exists():
      raise errors.DataError(
        f"tfds cannot download {name!r} by itself: put its files in {manual} and run this again. "
        "tfds' instructions: " + " ".join(builder.MANUAL_DOWNLOAD_INSTRUCTIONS.split())
      )
  datasets.download_and_prepare(builder)
  logging.info("Prepared %s in %s.", name, builder.data_dir)
  return builder.data_dir


def main(argv):
  if len(argv) != 2:
    cli.fail("give one tfds dataset name, e.g. prepare_data cifar10 --data_dir=DIR")
  progress.quiet_libraries()
  progress.import_tensorflow()
  try:
    path = prepare(argv[1], _DATA_DIR.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  print(f"Prepared: {path}\nTrain on it with --config.data.name={argv[1]} ", end="")
  print(f"--config.data.dir={_DATA_DIR.value}" if _DATA_DIR.value else "(tfds' default dir)")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)

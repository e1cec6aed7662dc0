r"""Trains a config: `python -m vitboot_jax.main --config=CONFIG[:args] --workdir=DIR`.

Overrides: `--config.batch_size=128 --config.data.dir=/data/cifar10`. Re-running the same
command resumes from the newest complete checkpoint in DIR; a finished run exits at once.

Multi-process (several hosts, or several processes on one host): on TPU VMs and under SLURM,
`jax.distributed.initialize()` finds its peers by itself (pass --distributed); elsewhere pass
--coordinator_address=HOST:PORT --num_processes=N --process_id=I.
"""

from __future__ import annotations

import logging as logging_lib
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:args]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed", None, "Call jax.distributed.initialize(); default: on under SLURM/TPU pods."
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def _multi_process_environment() -> bool:
  """True under a launcher that runs one process per host/GPU (SLURM, multi-host TPU)."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return True
  return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def initialise_distributed() -> None:
  """Connects the processes of a multi-process run; a no-op for a single process."""
  import jax

  explicit = _COORDINATOR.value is not None
  wanted = _DISTRIBUTED.value if _DISTRIBUTED.value is not None else _multi_process_environment()
  if not (explicit or wanted):
    return
  # Cross-process collectives of the CPU backend (CPU-only runs, tests); no effect on GPU/TPU.
  # Set before initialize(): touching the backend first would make initialize() fail.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit:
    jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
    )
  else:
    jax.distributed.initialize()


class _QuietLibraries(logging_lib.Filter):
  """Drops INFO chatter of orbax and tfds (every checkpoint logs ~20 lines); keeps warnings."""

  def filter(self, record: logging_lib.LogRecord) -> bool:
    noisy = any(part in record.pathname for part in ("/orbax/", "/tensorflow_datasets/"))
    return record.levelno >= logging_lib.WARNING or not noisy


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  # TensorFlow is only the input pipeline: it must never take an accelerator from JAX.
  import tensorflow as tf

  tf.config.set_visible_devices([], "GPU")
  initialise_distributed()
  import jax

  from vitboot_jax import train

  logging.info(
    "JAX %s: process %d/%d, %d local / %d global devices (%s)",
    jax.__version__,
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
    jax.default_backend(),
  )
  from vitboot_jax import checkpoint, preemption

  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except preemption.Preempted as stopped:
    logging.warning("%s", stopped)
    sys.exit(stopped.exit_code)
  except (train.NonFiniteError, checkpoint.CheckpointSaveError) as error:
    logging.error("%s", error)  # The message names the step, the files and the fix.
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)

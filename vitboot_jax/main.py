r"""Trains a config: `python -m vitboot_jax.main --config=CONFIG[:ARGS] --workdir=DIR`.

Overrides: `--config.batch_size=128 --config.data.dir=/data/cifar10`; every field of a config:
`--config=CONFIG --print_config`. Re-running the same command resumes from the newest complete
checkpoint in DIR; a finished run exits at once; another config in DIR is refused, and so are a
second run while one holds DIR (DIR/claim.json), a resume on changed data (DIR/data.json) and
checkpoints without DIR/config.json (--adopt_config declares the command's config theirs). A
damaged checkpoint (its files fail the checksums of the save, or that record is gone) is moved
to DIR/checkpoints/damaged/ and the run resumes from the newest intact one.

Data: a tfds dataset is downloaded and prepared on first use into config.data.dir or tfds' default
directory ($TFDS_DATA_DIR, else ~/tensorflow_datasets); an image folder is
`--config.data.name=folder --config.data.dir=ROOT`; arrays are `--config.data.name=npz
--config.data.dir=DIR` (DIR/train.npz, DIR/test.npz). With `--config.data.pipeline=device` the
dataset is held on the accelerators and augmented there; on a folder or .npz such a run needs no
TensorFlow. A mistake in the command (config, data,
workdir) prints one line and exits with code 2.

Multi-process (several hosts, or several processes on one host): on TPU VMs and under SLURM,
`jax.distributed.initialize()` finds its peers by itself (pass --distributed); elsewhere pass
--coordinator_address=HOST:PORT --num_processes=N --process_id=I. Such runs never download data:
prepare it first with `python -m vitboot_jax.tools.prepare_data NAME --data_dir=DIR`.

A CPU-only host is split into one device per core and the batch sharded over them
(--cpu_devices=1: one device using every core).
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from vitboot_jax.base import cli, errors, library_logs
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import features as cpu_features
from vitboot_jax.cpu import host_memory

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:args]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_PRINT_CONFIG = flags.DEFINE_bool(
  "print_config", False, "Print every field of the config (overrides applied) and exit."
)
_ADOPT_CONFIG = flags.DEFINE_bool(
  "adopt_config",
  False,
  "The workdir holds checkpoints but no config.json: record this command's config as theirs.",
)
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed", None, "Call jax.distributed.initialize(); default: on under SLURM/TPU pods."
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_CPU_DEVICES = cpu_devices.define_flag()


def _multi_process_environment() -> bool:
  """True under a launcher that runs one process per host/GPU (SLURM, multi-host TPU)."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return True
  return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def _is_multi_process() -> bool:
  """Whether this run has several processes, known before jax.distributed starts."""
  if _COORDINATOR.value is not None:
    return True
  return _DISTRIBUTED.value if _DISTRIBUTED.value is not None else _multi_process_environment()


def initialise_distributed() -> None:
  """Connects the processes of a multi-process run; a no-op for a single process."""
  import jax

  explicit = _COORDINATOR.value is not None
  if not _is_multi_process():
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


def main(argv):
  del argv  # cli.parse_flags refused extra arguments.
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    print(config)
    return
  library_logs.libraries()
  from vitboot_jax.run import startup

  # The user's mistakes, in seconds: before JAX loads and before anything is written.
  split = None
  try:
    single_process = not _is_multi_process()
    checked = startup.check(
      config, _WORKDIR.value, single_process=single_process, adopt_config=_ADOPT_CONFIG.value
    )
    if checked is not None:
      return  # A finished run of this config: its results are logged.
    if single_process:
      split = cpu_devices.split_host_for(config, requested=_CPU_DEVICES.value)
  except errors.UsageError as error:
    cli.fail(str(error))
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
  if jax.default_backend() == "cpu":
    if split and split > 1:
      logging.info("CPU host split into %d devices; the batch is sharded over them.", split)
    allocator = host_memory.description()
    hint = host_memory.HINT if allocator == host_memory.SYSTEM else ""
    logging.info("Allocator: %s.%s", allocator, hint)
    bf16_warning = cpu_features.bf16_warning(
      config.get("compute_dtype", "float32"), cpu_features.cpu_flags()
    )
    if bf16_warning:
      logging.warning("%s", bf16_warning)
  from vitboot_jax.checkpoint import failures
  from vitboot_jax.run import failing, preemption

  with failing.watching():  # One process's failure ends every process, with its line.
    try:
      train.train_and_evaluate(config, _WORKDIR.value, checked=True)
    except errors.UsageError as error:
      failing.fail(str(error), cli.USAGE_EXIT_CODE)
    except preemption.Preempted as stopped:
      logging.warning("%s", stopped)
      sys.exit(stopped.exit_code)
    except (train.NonFiniteError, train.WriteError, failures.CheckpointError) as error:
      failing.fail(str(error), 1)  # The message names the step, the files and the fix.
    except Exception as error:
      if jax.process_count() == 1:
        raise
      failing.fail_unforeseen(error)  # Another process's line first, if it failed first.


if __name__ == "__main__":
  host_memory.reexec_with_allocator()
  app.run(main, flags_parser=functools.partial(cli.parse_flags, usage=__doc__))

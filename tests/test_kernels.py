"""The kernel seam: which set a mesh gets, models free of the CPU layer, the xla set's ops."""

import ast
import dataclasses
import functools
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jaxprs, runs
from tests.config_files import load_config
from vitboot_jax import configlib, kernel_sets
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.models import kernels as kernels_lib
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.models.build import build_models

MODELS = pathlib.Path(kernels_lib.__file__).parent


def test_auto_follows_the_devices_and_explicit_choices_win():
  devices = jax.devices()
  auto = kernel_sets.for_devices("auto", devices)
  if devices[0].platform == "cpu":
    assert auto.name == "cpu" and auto.batch_shards == len(devices)
  else:  # The suite run on an accelerator (launch/accelerator_check.sh).
    assert auto.name == "xla"
  assert kernel_sets.for_devices("xla", devices).name == "xla"
  for platform in ("cuda", "rocm", "gpu", "tpu"):
    assert kernel_sets.for_platform("auto", platform).name == "xla"
  assert kernel_sets.for_platform("cpu", "tpu").name == "cpu"


def test_config_kernels_choose_the_set_the_models_get():
  config = load_config("tiny_config")
  assert config.kernels == "auto"
  on_cpu = jax.default_backend() == "cpu"
  assert kernel_sets.for_config(config).name == ("cpu" if on_cpu else "xla")
  assert kernel_sets.for_config(config, platform="tpu").name == "xla"
  config.kernels = "xla"
  models = build_models(config, kernel_sets.for_config(config))
  assert models.kernels.name == "xla"
  assert models.vit.kernels is models.agent.kernels is models.kernels
  config.kernels = "gpu"
  with pytest.raises(ConfigError, match="config.kernels='gpu' is unknown"):
    configlib.validate(config)


def test_the_sets_follow_the_devices_the_batch_is_split_over():
  cpu = kernel_sets.for_platform("cpu", "cpu", batch_shards=4)
  assert cpu.batch_shards == cpu.attention.shards == 4
  assert kernel_sets.for_platform("xla", "cpu", batch_shards=4).batch_shards == 4
  resnet = build_models(load_config("tiny_config", "mode=cnn"), cpu).modules["cnn"]
  assert resnet.kernels is cpu  # The CNN baseline gets the injected set too.


def test_model_code_has_no_backend_logic():
  for path in MODELS.glob("*.py"):
    text = path.read_text()
    for name in ("default_backend", "device_count", "local_device_count"):
      assert name not in text, f"{path.name} uses jax.{name}"


@pytest.mark.slow
def test_models_never_import_the_cpu_layer():
  """models/ holds models; the CPU layer (vitboot_jax/cpu/) builds on it, never the reverse."""
  for name, path in _package_modules().items():
    if name.startswith("vitboot_jax.models"):
      for module in _imports(path.read_text(), name):
        assert not module.startswith("vitboot_jax.cpu"), f"{name} imports {module}"
  # Nor through anything they import: importing every model module loads no vitboot_jax.cpu.
  names = [f"vitboot_jax.models.{p.stem}" for p in sorted(MODELS.glob("*.py"))]
  probe = f"import sys, {', '.join(names)}; print(sorted(m for m in sys.modules if 'cpu' in m))"
  loaded = subprocess.run(
    [sys.executable, "-c", probe], env=runs.env(1), capture_output=True, text=True, check=True
  ).stdout
  assert "vitboot_jax.cpu" not in loaded, loaded


PACKAGE = MODELS.parent


@functools.cache
def _package_modules() -> dict[str, pathlib.Path]:
  """{dotted name: path} of every module of the package (a package by its __init__.py)."""
  return {
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
    for p in PACKAGE.rglob("*.py")
  }


def _imports(source: str, module: str, is_package: bool = False) -> set[str]:
  """What `source` (module `module`) imports, by absolute name, lazy imports inside functions
  and relative ones included: `from a import b` is a.b where that is a module of the package,
  else a."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # Relative: level 1 is the module's own package.
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      for alias in node.names:
        name = f"{base}.{alias.name}"
        names.add(name if name in _package_modules() else base)
  return names


@functools.cache
def _package_imports() -> dict[str, set[str]]:
  """{module: the package's modules it imports}, lazy and relative imports included."""
  modules = _package_modules()
  return {
    name: {m for m in _imports(path.read_text(), name, path.stem == "__init__") if m in modules}
    - {name}
    for name, path in modules.items()
  }


def test_the_package_has_no_import_circle_and_its_core_never_imports_a_tool():
  """Modules import in one direction: a circle (lazy imports too) means two modules are one
  concern split wrongly; tools/ builds on the core, never the reverse."""
  graph = _package_imports()
  for module, imported in graph.items():
    if not module.startswith("vitboot_jax.tools"):
      tools = sorted(m for m in imported if m.startswith("vitboot_jax.tools"))
      assert not tools, f"{module} (the core) imports {tools}"
  done, path = set(), []

  def visit(module: str) -> None:
    if module in path:
      circle = path[path.index(module) :] + [module]
      raise AssertionError("import circle: " + " -> ".join(circle))
    if module in done:
      return
    path.append(module)
    for other in sorted(graph[module]):
      visit(other)
    path.pop()
    done.add(module)

  for module in sorted(graph):
    visit(module)


# All models/ may import from the rest of the package: the bottom layer, the rest builds on it.
MODELS_MAY_IMPORT = frozenset({"vitboot_jax.base.files", "vitboot_jax.base.errors"})


def _outside_models(source: str, module: str, is_package: bool = False) -> list[str]:
  """What a models/ module imports from the package beyond models/ and MODELS_MAY_IMPORT."""
  return sorted(
    m
    for m in _imports(source, module, is_package)
    if (m == "vitboot_jax" or m.startswith("vitboot_jax."))
    and not (m == "vitboot_jax.models" or m.startswith("vitboot_jax.models."))
    and m not in MODELS_MAY_IMPORT
  )


def test_models_import_only_the_allowed_modules_of_the_package():
  for name, path in _package_modules().items():
    if name == "vitboot_jax.models" or name.startswith("vitboot_jax.models."):
      offending = _outside_models(path.read_text(), name, path.stem == "__init__")
      assert not offending, f"{name} imports {offending}: not in models/ or MODELS_MAY_IMPORT"
  for allowed in MODELS_MAY_IMPORT:  # Below models/: nothing of the package under it.
    assert not _package_imports()[allowed], f"{allowed} imports {_package_imports()[allowed]}"


def test_the_ground_floor_imports_nothing_else_of_the_package():
  """base/ is what every wing uses: an import from it into a wing would make a circle."""
  for name, imported in _package_imports().items():
    if name.startswith("vitboot_jax.base"):
      outside = sorted(m for m in imported if not m.startswith("vitboot_jax.base"))
      assert not outside, f"{name} (the ground floor) imports {outside}"


def test_packages_reexport_nothing():
  """A module has one name: a package's __init__ holds its docstring, never an import."""
  for name, path in _package_modules().items():
    if path.stem == "__init__":
      imports = _imports(path.read_text(), name, is_package=True)
      assert not imports, f"{name} re-exports {sorted(imports)}"


def test_the_models_import_check_counts_every_form_of_import():
  module = "vitboot_jax.models.probe"
  for source, found in [
    ("from vitboot_jax import sharding", "vitboot_jax.sharding"),
    ("import vitboot_jax.optim", "vitboot_jax.optim"),
    ("from vitboot_jax.run.progress import Progress", "vitboot_jax.run.progress"),
    ("from ..run import preemption", "vitboot_jax.run.preemption"),
    ("from ..sharding import make_mesh", "vitboot_jax.sharding"),
    ("from ..cpu import kernels", "vitboot_jax.cpu.kernels"),
    ("import vitboot_jax", "vitboot_jax"),
    ("def f():\n  from .. import optim", "vitboot_jax.optim"),
  ]:
    assert _outside_models(source, module) == [found], source
  for source in ("from . import vit", "from .vit import ViT", "from vitboot_jax.base import files"):
    assert not _outside_models(source, module), source
  assert _outside_models("from .. import optim", "vitboot_jax.models", is_package=True) == [
    "vitboot_jax.optim"
  ]


def test_xla_bf16_products_sum_in_float32_with_jax_derivatives():
  a = jax.random.normal(jax.random.key(0), (4, 64)).astype(jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (64, 8)).astype(jnp.bfloat16)
  out = kernels_lib.xla_einsum("ik,kj->ij", a, b)
  assert out.dtype == jnp.bfloat16
  exact = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32), exact, rtol=2**-7, atol=1e-2)
  dense = kernels_lib.xla_dot_general(a, b, (((1,), (0,)), ((), ())))
  np.testing.assert_array_equal(np.asarray(dense), np.asarray(out))
  loss = lambda a, b: kernels_lib.xla_einsum("ik,kj->ij", a, b).astype(jnp.float32).sum()
  jaxpr = str(jax.make_jaxpr(jax.grad(loss, (0, 1)))(a, b))
  assert "custom_vjp" not in jaxpr and "preferred_element_type=float32" in jaxpr
  grads = jax.grad(loss, (0, 1))(a, b)
  assert grads[0].dtype == jnp.bfloat16 and grads[1].dtype == jnp.bfloat16


def test_threefry_dropout_keeps_the_expectation():
  x = jnp.ones((1000, 100))
  y = kernels_lib.threefry_dropout(x, 0.25, jax.random.key(0))
  kept = np.asarray(y) > 0
  assert abs(kept.mean() - 0.75) < 0.01
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / 0.75, rtol=1e-6)
  with pytest.raises(ValueError, match="whole-batch"):
    kernels_lib.threefry_dropout(x, 0.25, jax.random.key(0), rows=jnp.arange(1000), num_rows=1000)


def _random_words_per_draw(kernels: kernels_lib.Kernels) -> list[int]:
  """How many random words each draw of a tiny ViT's training forward asks for."""
  model = vit_lib.ViT(
    num_classes=5, patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_dim=24, dropout=0.1
  )
  images = jnp.ones((4, 16, 16, 3))
  params = model.init(jax.random.key(0), images[:1])["params"]

  def forward(params):
    return model.clone(kernels=kernels).apply(
      {"params": params}, images, train=True, rngs={"dropout": jax.random.key(1)}
    )

  return [
    int(np.prod(eqn.params["shape"]))
    for eqn in jaxprs.equations(jax.make_jaxpr(forward)(params))
    if eqn.primitive.name == "random_bits"
  ]


@pytest.mark.parametrize("name", ["xla", "cpu"])
@pytest.mark.slow
def test_dropout_masks_draw_two_words_not_one_per_element(name):
  """Per-element PRNG bits were 16% of a GPU ViT-S step (docs/accelerators.md): both sets hash."""
  draws = _random_words_per_draw(kernel_sets.for_platform(name, "cpu"))
  assert draws and max(draws) <= 2, draws
  threefry = dataclasses.replace(kernels_lib.XLA, dropout=kernels_lib.threefry_dropout)
  assert max(_random_words_per_draw(threefry)) > 2  # The check sees per-element bits.

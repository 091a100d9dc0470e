"""`no_compilation_cache`: the compiles inside it (the plan's TPU-topology programs, which a
CPU process cannot load back) write nothing to the persistent cache, even after earlier
compiles of the process switched the cache on, and the cache works again after it."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from experiments.plan.report import no_compilation_cache


@pytest.fixture
def own_cache(tmp_path):
  """A cache of this test's own that keeps every entry (the session's is shared by the
  workers), the session's restored afterwards."""
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes", "jax_enable_compilation_cache")
  before = {name: getattr(jax.config, name) for name in names}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  jax.config.update("jax_enable_compilation_cache", True)
  compilation_cache.reset_cache()
  yield tmp_path
  for name, value in before.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


def _entries(folder):
  return {p.name for p in folder.iterdir() if not p.name.endswith("-atime")}


def test_compiles_inside_write_nothing_and_the_cache_works_after(own_cache):
  x = jnp.arange(8.0)
  jax.jit(lambda v: jnp.sin(v) * 3.0)(x).block_until_ready()   # the cache is now in use
  first = _entries(own_cache)
  assert first, "the compile before the context was not cached"
  with no_compilation_cache():
    jax.jit(lambda v: jnp.cos(v) + 5.0)(x).block_until_ready()
  assert _entries(own_cache) == first
  jax.jit(lambda v: jnp.tanh(v) - 7.0)(x).block_until_ready()
  assert len(_entries(own_cache)) > len(first)

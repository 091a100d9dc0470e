"""Shared test setup.

Runs before any test module imports jax: exposes 8 host (CPU) devices so that
sharding tests work on a single machine, compiles without LLVM's optimisation
passes (the tests' time is compile time), and turns on a persistent compilation
cache for the session, which child processes share. The platform itself is not
forced, so a GPU or TPU is used when present.
"""

import os

# Flags this suite adds to XLA_FLAGS unless the environment already sets them. The
# second skips LLVM's optimisation of the generated code (XLA's own passes still run):
# the tests' arrays are tiny, so their time goes to compiling, and a third of it to
# those passes (a compile-heavy subset, cold cache, side by side: 259 -> 173 s). The
# codegen may round a last bit differently, so a child process whose results are
# compared with this one's keeps these flags (only the device count may change).
_TEST_XLA_FLAGS = {
    "--xla_force_host_platform_device_count": "8",
    "--xla_backend_optimization_level": "0",
}
_xla_flags = os.environ.get("XLA_FLAGS", "")
for _flag, _value in _TEST_XLA_FLAGS.items():
    if _flag not in _xla_flags:
        _xla_flags = f"{_xla_flags} {_flag}={_value}".strip()
os.environ["XLA_FLAGS"] = _xla_flags

# jax's CUDA plugin (the [gpu-compile] extra, which the test command installs) on a
# machine without a GPU driver: its start-up lines and configuration traceback stay off
# stderr, and it registers, so that tests compile for GPUs (experiments/plan/gpu.py).
from experiments.plan.gpu import quiet_cuda_startup  # noqa: E402

quiet_cuda_startup()

import jax
import pytest

# The persistent compilation cache lives for one test session: a fresh directory made by
# the first process to load this file (the xdist controller, whose environment the workers
# and every child process inherit) and removed when that session ends. A cache kept across
# sessions crashed workers: every CI failure with a warm cache (four runs) was a segfault or
# abort of a worker loading, or soon after loading, an XLA:CPU executable of an earlier
# session, while every run that started cold passed. LNGRAM_JAX_CACHE_DIR names a directory
# to keep instead (warm local reruns).
_OWN_CACHE = "LNGRAM_JAX_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    import tempfile

    os.environ["LNGRAM_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="lngram-jax-xla-")
    os.environ["LNGRAM_JAX_CACHE_OWNER"] = str(os.getpid())
_CACHE_DIR = os.environ["LNGRAM_JAX_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus):
    """The process that made the session's cache removes it at the end."""
    if _OWN_CACHE and os.environ.get("LNGRAM_JAX_CACHE_OWNER") == str(os.getpid()):
        import shutil

        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def _set_config(name, value):
    # Option names may differ between jax versions; a missing one is not fatal.
    try:
        jax.config.update(name, value)
    except AttributeError:
        pass


# A size limit turns on jax's LRU eviction, and with it a file lock around every read and
# write of the cache: without one, jax writes an entry in place (not renamed into place),
# so the two xdist workers, or a worker and a child process, compiling the same program
# at once can leave or read a mixed entry, which the CPU backend then loads (a crash, not
# an error). 8 GiB: far above what the suite writes (~150 MB).
_CACHE_SETTINGS = {
    "jax_compilation_cache_dir": _CACHE_DIR,
    "jax_persistent_cache_min_compile_time_secs": 0.5,
    "jax_persistent_cache_min_entry_size_bytes": 0,
    "jax_compilation_cache_max_size": 8 * 2**30,
}
for _name, _value in _CACHE_SETTINGS.items():
    _set_config(_name, _value)
    # Child processes (CLI runs, kill-and-resume runs) copy os.environ: with these they
    # reuse what this session compiled instead of compiling the same step again.
    os.environ[_name.upper()] = str(_value)


def pytest_collection_modifyitems(config, items):
    needs_backend = {"gpu": "gpu", "tpu": "tpu"}
    if not any(item.get_closest_marker(m) for item in items for m in needs_backend):
        return
    backend = jax.default_backend()
    for marker, wanted in needs_backend.items():
        if backend == wanted:
            continue
        skip = pytest.mark.skip(
            reason=f"needs a {wanted.upper()} (jax default backend is {backend!r})"
        )
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def child_env():
    """`child_env(device_count)`: the environment of a child Python process (a CLI run, a
    jax.distributed worker) whose results are compared with this process's. The suite's
    other XLA flags stay (see _TEST_XLA_FLAGS: compiled with other codegen flags, the
    child would round differently); only the host device count changes. CPU only, with
    the repository importable."""

    def make(device_count: int) -> dict[str, str]:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
        flags.append(f"--xla_force_host_platform_device_count={device_count}")
        python_path = os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")])
        return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu",
                    PYTHONPATH=python_path.rstrip(os.pathsep))

    return make


@pytest.fixture
def local_address():
    """A free localhost `host:port`, for a jax.distributed coordinator."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"

"""`abstract_train_state` (experiments/trainer/state.py): the state `init_train_state`
builds, from shapes alone: the same tree, shapes, dtypes and shardings, nothing allocated,
and the same optimiser and frozen mask."""

import jax
from flax import nnx

from experiments.configs import load_config
from experiments.models import DecoderLM, layout, lm_config
from experiments.trainer.placement import make_train_mesh
from experiments.trainer.state import abstract_train_state, init_train_state


def _branch_only(path: str) -> bool:
  return "/memory/" in f"/{path}/"


def test_the_abstract_state_is_the_initialised_one_in_shapes():
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  model_config = lm_config(config)
  mesh = make_train_mesh({"fsdp": 2}, devices=jax.devices("cpu")[:2])
  module = DecoderLM(model_config, rngs=nnx.Rngs(0))
  rules = layout.placement_rules(module)
  real = init_train_state(module, config.optim, [10], mesh, trainable=_branch_only,
                          rules=rules)
  abstract_module = nnx.eval_shape(lambda: DecoderLM(model_config, rngs=nnx.Rngs(0)))
  before = {id(a) for a in jax.live_arrays()}
  shaped = abstract_train_state(abstract_module, config.optim, 10, mesh,
                                trainable=_branch_only, rules=rules)
  assert not {id(a) for a in jax.live_arrays()} - before   # nothing allocated
  for name in ("state", "rest"):
    ours, theirs = getattr(shaped, name), getattr(real, name)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
      assert isinstance(a, jax.ShapeDtypeStruct)
      assert (a.shape, a.dtype) == (b.shape, b.dtype)
      assert a.sharding.is_equivalent_to(b.sharding, len(a.shape))
  assert jax.tree.leaves(shaped.frozen) == jax.tree.leaves(real.frozen)
  assert len(shaped.txs) == 1

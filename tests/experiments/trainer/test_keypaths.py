"""The one spelling of pytree key paths (experiments/trainer/keypaths.py), which the
optimiser groups and the placement of parameters and optimiser state share."""

import jax
import jax.numpy as jnp
import optax

from experiments.trainer import optimizer, placement
from experiments.trainer.keypaths import path_names, path_str


def test_dict_keys_list_indices_and_attributes_by_name():
  params = {"blocks": {1: {"memory": {"tables": [jnp.ones(2), jnp.ones(3)]}}}}
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  assert [path_names(p) for p in paths] == [("blocks", "1", "memory", "tables", "0"),
                                            ("blocks", "1", "memory", "tables", "1")]
  assert path_str(paths[1]) == "blocks/1/memory/tables/1"
  # optax's states are named tuples: their fields by name, as a parameter's keys are.
  state = optax.adam(1e-3).init({"w": jnp.ones(2)})
  names = {path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
  assert ("0", "mu", "w") in names and ("0", "count") in names
  assert optimizer.path_str is path_str and placement.path_names is path_names

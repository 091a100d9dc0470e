"""Every memory-slot arm: masks select, never multiply.

NaN at padding positions reaches no valid output, loss or gradient (NaN·0 is
NaN, so a multiplied mask leaks it); a `valid` of 2s is refused; prefill and
decode check their inputs as the Lngram layer does.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from branch_contract import (
    assert_nan_at_padding_is_ignored,
    assert_valid_of_twos_is_refused,
    liven,
    random_inputs,
)
from flax import nnx

from experiments.models.arms.engram import Engram, EngramConfig
from experiments.models.arms.lngram_v1 import LngramV1, LngramV1Config
from experiments.models.arms.pkm import PKMConfig, PKMMemory
from experiments.models.arms.sparse_ffn import SparseFFN, SparseFFNConfig
from experiments.models.branches import BranchContext

D = 16
ARMS = {
    "engram": lambda: Engram(EngramConfig(d_model=D, heads=2, head_dim=4, table_base=31),
                             rngs=nnx.Rngs(0)),
    "lngram_v1": lambda: LngramV1(LngramV1Config(d_model=D, bits=2, mem_dim=4),
                                  rngs=nnx.Rngs(0)),
    "pkm": lambda: PKMMemory(PKMConfig(d_model=D, heads=2, key_dim=8, num_keys=8, topk=4),
                             rngs=nnx.Rngs(0)),
    "sparse_ffn": lambda: SparseFFN(SparseFFNConfig(d_model=D, experts=5, expert_dim=8,
                                                    shared_dim=3, tile=4), rngs=nnx.Rngs(0)),
}
DECODING = ("engram", "lngram_v1")   # the arms with a decode history


@pytest.mark.parametrize("name", sorted(ARMS))
def test_nan_at_padding_changes_nothing_valid(name):
  x, tokens = random_inputs(D, length=12)
  assert_nan_at_padding_is_ignored(liven(ARMS[name]()), x, tokens)


@pytest.mark.parametrize("name", sorted(ARMS))
def test_valid_of_twos_is_refused(name):
  x, tokens = random_inputs(D, length=6)
  assert_valid_of_twos_is_refused(ARMS[name](), x, tokens)


@pytest.mark.parametrize("name", DECODING)
@pytest.mark.parametrize("lengths, error, match", [
    ([20, 20], ValueError, r"lengths=\[20, 20\] must be in \[0, T=6\]"),
    ([-1, 2], ValueError, r"lengths=\[-1, 2\] must be in \[0, T=6\]"),
    ([2.0, 3.0], TypeError, "must be integers"),
])
def test_prefill_refuses_impossible_lengths(name, lengths, error, match):
  x, tokens = random_inputs(D, length=6)
  with pytest.raises(error, match=match):
    ARMS[name]().prefill(x, BranchContext(tokens_BxT=tokens, lengths_B=np.asarray(lengths)))


@pytest.mark.parametrize("name", DECODING)
def test_decode_refuses_int_or_list_inputs_and_a_state_of_another_batch(name):
  branch = ARMS[name]()
  _, tokens = random_inputs(D, length=1)
  ctx = BranchContext(tokens_BxT=tokens)
  state = branch.init_decode_state(2, ctx)
  with pytest.raises(TypeError, match="x must be a floating array|h must be a floating array"):
    branch.decode_step(jnp.ones((2, 1, D), jnp.int32), state, ctx)
  with pytest.raises(TypeError, match="must be an array .*got list"):
    branch.decode_step(np.zeros((2, 1, D)).tolist(), state, ctx)
  with pytest.raises(ValueError, match="state has batch 3 but the input has B=2"):
    branch.decode_step(jnp.ones((2, 1, D)), branch.init_decode_state(3, ctx), ctx)
  other = {"engram": lambda: Engram(EngramConfig(d_model=D, orders=(2, 3, 4), heads=2,
                                                 head_dim=4, table_base=31), rngs=nnx.Rngs(0)),
           "lngram_v1": lambda: LngramV1(LngramV1Config(d_model=D, bits=2, mem_dim=4,
                                                        orders=(2,)), rngs=nnx.Rngs(0))}[name]
  with pytest.raises(ValueError, match="decode_step: .*state.*needs"):
    branch.decode_step(jnp.ones((2, 1, D)), other().init_decode_state(2, ctx), ctx)


@pytest.mark.parametrize("name", sorted(ARMS))
@pytest.mark.parametrize("shape, field", [((0, 4, D), "B=0"), ((2, 0, D), "T=0")])
def test_empty_batch_or_sequence_names_the_field(name, shape, field):
  tokens = jnp.zeros(shape[:2], jnp.int32)
  with pytest.raises(ValueError, match=f"has shape .*{field} must be >= 1"):
    ARMS[name]().forward(jnp.zeros(shape), BranchContext(tokens_BxT=tokens))


def test_parallel_mlp_text_mask_selects_and_refuses_twos():
  """PVM's iso-parameter baseline beside the FFN: the text mask as PVM's."""
  from experiments.models.branches import ParallelMLP, ParallelMLPConfig
  mlp = ParallelMLP(ParallelMLPConfig(d_model=D, hidden_dim=8), rngs=nnx.Rngs(0))
  mlp.gate[...] = jnp.asarray(0.7)
  x, _ = random_inputs(D, length=6)
  text = jnp.arange(6)[None] >= jnp.array([2, 4])[:, None]
  x_nan = jnp.where(text[..., None], x, jnp.nan)

  def loss(mlp, x_):
    return jnp.sum(mlp(x_, text)), mlp(x_, text)

  (l_nan, y_nan), g_nan = nnx.value_and_grad(loss, has_aux=True)(mlp, x_nan)
  (l_ref, y_ref), g_ref = nnx.value_and_grad(loss, has_aux=True)(
      mlp, jnp.where(text[..., None], x, 0.0))
  np.testing.assert_array_equal(y_nan, y_ref)
  assert float(l_nan) == float(l_ref) and bool(jnp.isfinite(y_nan).all())
  for (path, a), (_, b) in zip(nnx.to_flat_state(g_nan), nnx.to_flat_state(g_ref), strict=True):
    np.testing.assert_array_equal(a[...], b[...], err_msg=str(path))
  with pytest.raises(ValueError, match=r"text_mask must be bool or hold only 0 and 1"):
    mlp(x, 2 * text.astype(jnp.int32))

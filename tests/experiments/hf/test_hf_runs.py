"""A Hugging Face checkpoint as a run: `import-hf`, `restore`, and `train --config.init_from=hf:DIR`.

Reference logits come live from `transformers` (tests/experiments/hf/conftest.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import restore
from experiments.cli import run_main
from experiments.configs import load_config
from experiments.hf.backbone import with_hf_backbone
from experiments.jobs import run_train
from experiments.jobs.lm.task import lm_task

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOKENS_BxT = np.random.default_rng(1).integers(3, 96, (2, 16))


def hf_logits(model):
  with torch.no_grad():
    return model(torch.tensor(TOKENS_BxT)).logits.numpy()


def close(got, want):
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_import_hf_writes_a_run_that_restore_reads(hf_checkpoints, tmp_path, capsys):
  path, hf = hf_checkpoints["llama"]
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={path}", f"--workdir={run}"]) == 0
  assert "step 0" in capsys.readouterr().out
  assert (run / "generation_config.json").is_file() and (run / "hf_config.json").is_file()
  model, config = restore(run)
  assert config.restored_step == 0 and model.config.rope_scaling
  close(model(jnp.asarray(TOKENS_BxT)), hf_logits(hf))
  # A second import into the same run directory is refused, and changes nothing.
  before = sorted(p.name for p in run.rglob("*"))
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={path}", f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "not empty" in err and "\n" not in err
  assert sorted(p.name for p in run.rglob("*")) == before


def test_import_hf_of_a_bad_directory_leaves_nothing(tmp_path, capsys):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={tmp_path / 'hf'}",
                   f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "'gpt2'" in err and "qwen3" in err and "\n" not in err
  assert not run.exists()
  assert run_main(["lngram-exp", "import-hf", f"--workdir={run}"]) == 2
  assert "--hf_dir" in capsys.readouterr().err


def hf_lngram_config(path, steps=2):
  """lm_lngram's smoke run, its backbone from the checkpoint (shape fields 0)."""
  config = load_config("lm_lngram.py:smoke")
  config.model.update(d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0,
                      vocab_size=0, max_len=64)
  config.init_from = f"hf:{path}"
  config.train.update(steps=steps, eval_every=steps, ckpt_every=steps, progress=False,
                      async_checkpoint=False)
  return config


def test_init_from_hf_starts_at_the_hf_logits(hf_checkpoints, tmp_path):
  path, hf = hf_checkpoints["qwen3"]
  model = lm_task(hf_lngram_config(path), tmp_path / "probe").module
  assert model.config.memory_layers == (1,) and model.config.qk_norm
  assert model.config.d_model == 64 and model.config.vocab_size == 256
  # Lngram v2's output projection and conv start at zero: step 0 is the HF model.
  close(model(jnp.asarray(TOKENS_BxT)), hf_logits(hf))


@pytest.mark.parametrize("arm", ["lm_pkm.py:smoke", "lm_engram.py:smoke,zeroinit",
                                 "lm_lngram_v1.py:smoke", "lm_sparse_ffn.py:smoke"])
def test_every_arm_inserted_from_hf_starts_at_the_hf_logits(hf_checkpoints, tmp_path, arm):
  """Each comparison arm in the memory slot of an HF backbone adds nothing at step 0
  (Engram with its `zeroinit` arg: its default init is not zero-output)."""
  path, hf = hf_checkpoints["qwen3"]
  config = load_config(arm)
  config.model.update(d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0,
                      vocab_size=0, max_len=64)
  config.init_from = f"hf:{path}"
  model = lm_task(config, tmp_path / "probe").module
  assert model.config.memory_layers == (1,)
  close(model(jnp.asarray(TOKENS_BxT)), hf_logits(hf))


@pytest.mark.slow   # ~35 s on 2 shared cores: a training run with its compiles
def test_init_from_hf_trains_and_restores(hf_checkpoints, tmp_path):
  path, hf = hf_checkpoints["qwen3"]
  result = run_train(hf_lngram_config(path), tmp_path / "run")
  assert result["step"] == 2 and np.isfinite(result["eval"]["eval/bits_per_byte"])
  trained, config = restore(tmp_path / "run")
  assert trained.config.memory_layers == (1,) and config.init_from == f"hf:{path}"
  assert not np.allclose(np.asarray(trained(jnp.asarray(TOKENS_BxT))), hf_logits(hf))


def test_init_from_hf_refuses_a_contradicting_config(hf_checkpoints):
  path, _ = hf_checkpoints["qwen3"]
  config = hf_lngram_config(path)
  config.model.update(d_model=32, n_layers=2)   # n_layers agrees; d_model does not
  with pytest.raises(ValueError, match=r"model\.d_model=32 \(config\.json: 64\)") as e:
    with_hf_backbone(config)
  assert "n_layers" not in str(e.value)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_export_hf_loads_in_transformers_and_imports_back_identical(hf_checkpoints, tmp_path,
                                                                    capsys, family):
  import jax
  import transformers
  from flax import nnx

  from experiments.hf import load_hf
  from experiments.jobs.hf_runs import export_hf
  path, _ = hf_checkpoints[family]
  run, out = tmp_path / "run", tmp_path / "exported"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={path}", f"--workdir={run}"]) == 0
  done = export_hf(run, out, max_shard_bytes=20_000)   # several shards + an index
  assert len(done["files"]) > 1 and (out / "model.safetensors.index.json").is_file()
  ours, _ = restore(run)
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  close(ours(jnp.asarray(TOKENS_BxT)), hf_logits(hf.eval()))
  back, _ = load_hf(out)
  want = jax.tree.leaves(nnx.state(ours, nnx.Param))
  got = jax.tree.leaves(nnx.state(back, nnx.Param))
  assert len(got) == len(want)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Into a directory that is not empty: refused in one line, nothing changed.
  capsys.readouterr()
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "not empty" in err and "\n" not in err


def test_init_from_hf_refuses_byte_data_for_a_small_vocabulary(hf_checkpoints):
  path, _ = hf_checkpoints["llama"]   # 96 tokens
  with pytest.raises(ValueError, match="vocabulary of 96 tokens cannot read byte data"):
    with_hf_backbone(hf_lngram_config(path))


@pytest.mark.slow   # three short training runs
def test_init_from_hf_interrupted_and_resumed_is_bit_identical(hf_checkpoints, tmp_path):
  """4 steps in one go == 2 steps, SIGTERM (the trainer saves), resume, 2 more: the
  resumed run restores its own checkpoint, not the HF tensors it started from."""
  import os
  import signal

  import jax

  from experiments.trainer.checkpoint import run_checkpointer
  path, _ = hf_checkpoints["qwen3"]
  config = hf_lngram_config(path, steps=4)
  config.train.update(ckpt_every=100, eval_every=100)

  def stop_at_2(step, batch):
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  run_train(config, tmp_path / "a")
  assert run_train(config, tmp_path / "b", callback=stop_at_2)["interrupted"]
  assert run_checkpointer(tmp_path / "b").all_steps() == [2]
  assert run_train(config, tmp_path / "b")["step"] == 4
  a, _ = restore(tmp_path / "a")
  b, _ = restore(tmp_path / "b")
  from flax import nnx
  for x, y in zip(jax.tree.leaves(nnx.state(a, nnx.Param)),
                  jax.tree.leaves(nnx.state(b, nnx.Param)), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

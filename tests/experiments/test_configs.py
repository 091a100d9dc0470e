"""Every experiment config file loads, builds its model config and documents its command."""

import pytest

from experiments.configs import config_files, load_config, purpose
from experiments.configs.base import corpus_spec, lm_config

FILES = [p.name for p in config_files()]
ARGS = {"lm_lngram.py": ["", "smoke", "r64,onebit", "r16,ste,smoke", "none"],
        "lm_baseline.py": ["", "smoke"]}


def test_known_config_files():
  assert {"lm_baseline.py", "lm_lngram.py"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_config_file_loads(name):
  for arg in ARGS.get(name, ["", "smoke"]):
    config = load_config(f"experiments/configs/{name}:{arg}" if arg else
                         f"experiments/configs/{name}")
    if "vlm" in config:  # VLM stages have their own builders (experiments.vlm)
      continue
    model = lm_config(config)
    corpus_spec(config)
    if "smoke" in arg:
      assert model.d_model <= 64 and config.train.steps <= 10 and config.data.max_files
  stem = name.removesuffix(".py")
  # big_vision habit: the docstring holds the exact command.
  from experiments.configs import CONFIG_DIR
  doc = (CONFIG_DIR / name).read_text()
  assert f"lngram-exp train --config=experiments/configs/{stem}.py" in doc
  assert purpose(CONFIG_DIR / name)


def test_lngram_args():
  config = load_config("experiments/configs/lm_lngram.py:r64,onebit")
  model = lm_config(config)
  assert model.lngram.routes == 64 and model.lngram.surrogate == "onebit"
  assert model.lngram_layers == (1, 2) and model.lngram.d_model == model.d_model
  default = lm_config(load_config("experiments/configs/lm_lngram.py"))
  assert default.lngram.routes == 16 and default.lngram.surrogate == "onebit"
  assert lm_config(load_config("experiments/configs/lm_lngram.py:exact")).lngram.surrogate == (
      "exact")
  assert lm_config(load_config("experiments/configs/lm_baseline.py")).lngram is None
  with pytest.raises(ValueError, match="unknown config arg 'r1x'"):
    load_config("experiments/configs/lm_lngram.py:r1x")
  with pytest.raises(ValueError, match="unknown config arg"):
    load_config("experiments/configs/lm_baseline.py:r16")


def test_baseline_and_lngram_share_everything_but_memory():
  a = load_config("experiments/configs/lm_baseline.py")
  b = load_config("experiments/configs/lm_lngram.py")
  for block in ("data", "optim", "train"):
    assert a[block].to_dict() == b[block].to_dict(), block
  ma, mb = a.model.to_dict(), b.model.to_dict()
  ma.pop("lngram_layers"), mb.pop("lngram_layers")
  assert ma == mb


def test_seq_len_checked_against_max_len():
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.data.seq_len = config.model.max_len + 1
  with pytest.raises(ValueError, match="data.seq_len"):
    lm_config(config)

"""Every experiment config file loads, converts to its model config and documents its command."""

import ast
import json

import pytest

from experiments.configs import CONFIG_DIR, LATER_FIELDS, config_files, load_config, purpose
from experiments.models.config import LMConfig, lm_config
from experiments.vlm.tiny.cell_loss import check_cell_geometry
from experiments.vlm.tiny.config import VLMConfig, vlm_config
from lngram_jax.config import SURROGATES

FILES = [p.name for p in config_files()]
ARGS = {"lm_lngram.py": ["", "smoke", "r64,onebit", "r16,ste,smoke", "none",
                         "nosink,r23,m4,kv2,mem64"],
        "lm_pkm.py": ["", "smoke", "gated,smoke", "keys64,top8"],
        "lm_engram.py": ["", "smoke", "zeroinit,nofold,base4099", "smoke,zeroinit"],
        "lm_lngram_v1.py": ["", "smoke", "exact,mem8", "none,smoke"],
        "lm_sparse_ffn.py": ["", "smoke", "matched-to=r64", "matched-to=r64,dense,smoke"],
        "lm_baseline.py": ["", "smoke"],
        "repro_lm.py": ["", "bytes,baseline,smoke", "tokens,engram", "bytes,sparse_ffn",
                        "bytes,lngram_r16,insert_low,smoke", "tokens,lngram_v1_paper,gpu"],
        "vlm_base.py": ["", "smoke", "s3"],
        "vlm_pvm_sft.py": ["", "smoke", "mlp", "hidden,d32,l0.2", "none,smoke"],
        "vlm_pvm_grpo.py": ["", "smoke", "mlp,smoke"],
        "qwen3vl_pvm_sft.py": ["", "4b", "smoke"],
        "qwen3vl_pvm_grpo.py": ["", "4b", "smoke"],
        "qwen3vl_lora_sft.py": ["", "4b", "smoke"],
        "qwen3vl_lora_grpo.py": ["", "4b", "smoke"],
        "vlm_long_base.py": ["", "smoke", "s1"],
        "vlm_long_sft.py": ["", "smoke", "mlp,s1", "none,smoke", "lora,s1"],
        "lm_lngram_random_router.py": ["", "smoke", "r64"],
        "hf_lngram.py": ["", "smoke", "pkm", "engram", "v1", "sparse_ffn", "none",
                         "engram,smoke", "none,smoke"],
        "moe06b_baseline.py": ["", "smoke"],
        "moe06b_lngram_v1.py": ["", "smoke", "exact,smoke"],
        "moe06b_lngram_v2.py": ["", "smoke", "r64", "r192", "r16,ste", "r64,ste,smoke"]}

# hf_lngram.py's backbone shape fields are 0 ("from config.json"): it converts once
# resolved against a checkpoint's config.json, as `train --config.init_from=hf:DIR`
# does (experiments/hf/backbone.py). A Qwen3 config.json of smoke widths (a 256-token
# vocabulary, so that byte data fits) stands in for the checkpoint: with_hf_backbone
# reads config.json only.
TINY_QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=256,
                  hidden_size=64, num_hidden_layers=14, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=128,
                  tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, torch_dtype="float32")


def _load(name, arg=""):
  return load_config(f"experiments/configs/{name}:{arg}" if arg else
                     f"experiments/configs/{name}")


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tiny_qwen3")
  (path / "config.json").write_text(json.dumps(TINY_QWEN3))
  return path


def _resolved(config, hf_dir):
  """`config` as train sees it: an init_from=hf: config resolved against `hf_dir`."""
  from experiments.hf.backbone import with_hf_backbone
  if config.get("init_from", None) == "" and config.model.d_model == 0:
    config.init_from = f"hf:{hf_dir}"
  return with_hf_backbone(config)


def test_known_config_files():
  assert set(FILES) == set(ARGS)


def _check_qwen3vl(config, arg):
  """The paper's layers for 8B / 4B (a checkpoint is required: refused without one);
  the smoke model converts with the tiny processor and round-trips through JSON."""
  from experiments.jobs.qwen3vl.task import check_qwen3vl_config, param_count
  from experiments.vlm.qwen3vl.config import Qwen3VLConfig
  q = config.qwen3vl
  lora = q.lora.rank > 0   # the LoRA rows: no branch, factors instead (qwen3vl_lora_*.py)
  if arg != "smoke":
    assert tuple(q.pvm.layers) == (() if lora else (5, 11, 17) if arg == "4b" else (8, 16, 24))
    assert q.pvm.latent_dim == 512 and config.plan_devices == 8
    if q.stage.name == "sft":
      with pytest.raises(ValueError, match="qwen3vl.hf_dir is empty"):
        check_qwen3vl_config(config)
    return
  _, model = param_count(config)
  assert Qwen3VLConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
  assert model.text.ffn_branch_layers == (() if lora else (1,)) and model.text.d_model <= 64
  assert (model.text.lora is not None) == lora
  assert config.train.steps <= 10


@pytest.mark.parametrize("name", FILES)
def test_config_file_loads_and_converts(name, tiny_hf_dir):
  for arg in ARGS[name]:
    if "qwen3vl" in _load(name, arg):   # PVM on Qwen3-VL: its own conversion
      _check_qwen3vl(_load(name, arg), arg)
      continue
    config = _resolved(_load(name, arg), tiny_hf_dir)
    if "vlm" in config:
      model = vlm_config(config)
      assert VLMConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
      lm = model.lm
      stage = config.vlm.stage
      if stage.name == "pretrain" and stage.cell_loss_weight > 0:   # the task's check
        check_cell_geometry(config.vlm.scenes.glyph_size, config.vlm.encoder.patch_size)
    else:
      lm = model = lm_config(config)
      assert LMConfig.from_dict(json.loads(json.dumps(lm.to_dict()))) == lm
    if "smoke" in arg:
      assert lm.d_model <= 64 and config.train.steps <= 10 and config.data.max_files
  stem = name.removesuffix(".py")
  # big_vision habit: the docstring holds the exact command.
  doc = (CONFIG_DIR / name).read_text()
  assert f"lngram-exp train --config=experiments/configs/{stem}.py" in doc
  assert purpose(CONFIG_DIR / name)


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.py")), ids=lambda p: p.name)
def test_config_modules_are_leaves(path):
  """Config files and shared defaults import only ml_collections and each other."""
  allowed = {"ml_collections", "experiments.configs", "__future__"}
  if path.name == "__init__.py":   # the loaders: the standard library, and base's LATER_FIELDS
    allowed = {"ast", "importlib.util", "pathlib", "__future__", "experiments.configs.base"}
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      names = [node.module]
    else:
      continue
    assert all(n in allowed for n in names), (path.name, names)


def test_lngram_args():
  model = lm_config(_load("lm_lngram.py", "r64,onebit"))
  assert model.memory.routes == 64 and model.memory.surrogate == "onebit"
  assert model.memory_layers == (1, 2) and model.memory.d_model == model.d_model
  default = lm_config(_load("lm_lngram.py"))
  assert default.memory.routes == 16 and default.memory.surrogate == "onebit"
  assert lm_config(_load("lm_lngram.py", "exact")).memory.surrogate == "exact"
  baseline = lm_config(_load("lm_baseline.py"))
  assert baseline.memory is None and baseline.memory_layers == ()
  with pytest.raises(ValueError, match="unknown config arg 'r1x'"):
    _load("lm_lngram.py", "r1x")
  with pytest.raises(ValueError, match="unknown config arg"):
    _load("lm_baseline.py", "r16")


def test_config_file_surrogates_are_the_library_s():
  module = ast.parse((CONFIG_DIR / "lm_lngram.py").read_text())
  names = next(ast.literal_eval(n.value) for n in module.body if isinstance(n, ast.Assign)
               and n.targets[0].id == "SURROGATES")
  assert tuple(names) == SURROGATES


@pytest.mark.parametrize("field, value, match", [
    ("surrogate", "softmax", "model.memory.surrogate='softmax' is not one of"),
    ("readout", "fast", "model.memory.readout='fast' is not one of"),
    ("kind", "nope", "model.memory.kind='nope' is not one of"),
])
def test_conversion_names_the_bad_key(field, value, match):
  config = _load("lm_lngram.py", "smoke")
  config.model.memory[field] = value
  with pytest.raises(ValueError, match=match):
    lm_config(config)


def test_baseline_and_lngram_share_everything_but_memory():
  a, b = _load("lm_baseline.py"), _load("lm_lngram.py")
  for block in ("data", "optim", "train"):
    assert a[block].to_dict() == b[block].to_dict(), block
  ma, mb = a.model.to_dict(), b.model.to_dict()
  assert (ma.pop("memory_layers"), mb.pop("memory_layers")) == ((), (1, 2))
  assert ma == mb


def test_seq_len_checked_against_max_len():
  config = _load("lm_lngram.py", "smoke")
  config.data.seq_len = config.model.max_len + 1
  with pytest.raises(ValueError, match="data.seq_len"):
    lm_config(config)


def test_vlm_groups_and_args():
  v = _load("vlm_pvm_sft.py").vlm
  assert set(v) == {"stage", "encoder", "branch", "scenes", "eval", "grpo"}
  assert (v.stage.name, v.stage.trainable, v.branch.kind) == ("sft", "branch", "pvm")
  sft = vlm_config(_load("vlm_pvm_sft.py"))
  assert sft.branch == "pvm" and sft.branch_layers == (1, 3) and sft.pvm_source == "raw"
  assert sft.decoder.ffn_branch_layers == (1, 3) and sft.decoder.ffn_branch.source == "raw"
  assert sft.n_visual == 9 and sft.visual_pos
  hidden = vlm_config(_load("vlm_pvm_sft.py", "hidden,d32,l0.2"))
  assert hidden.pvm_source == "hidden" and hidden.pvm.latent_dim == 32
  assert hidden.branch_layers == (0, 2)
  mlp = vlm_config(_load("vlm_pvm_sft.py", "mlp"))
  assert mlp.branch == "mlp" and mlp.decoder.ffn_branch.hidden_dim == mlp.iso_mlp_dim
  none = _load("vlm_pvm_sft.py", "none")
  assert none.vlm.branch.kind == "none" and none.vlm.stage.trainable == "lm"
  assert vlm_config(none).decoder.ffn_branch is None
  grpo = _load("vlm_pvm_grpo.py")
  assert (grpo.vlm.stage.name, grpo.vlm.grpo.group_size, grpo.vlm.grpo.lr) == ("grpo", 8, 1e-6)
  base = _load("vlm_base.py", "smoke")
  assert base.vlm.stage.curriculum == "2:1,1:0" and base.vlm.eval.max_new_tokens == 8
  assert _load("vlm_base.py").vlm.stage.curriculum == "1800:2,2000:0"
  with pytest.raises(ValueError, match="unknown config arg 'x'"):
    _load("vlm_base.py", "x")


def test_vlm_conversion_errors_name_the_key(tmp_path):
  config = _load("vlm_pvm_sft.py", "smoke")
  config.vlm.branch.kind = "moe"
  with pytest.raises(ValueError, match="vlm.branch.kind='moe'"):
    vlm_config(config)
  config = _load("vlm_pvm_sft.py", "peak,smoke")
  with pytest.raises(ValueError, match="visual_mass_from"):
    vlm_config(config)
  # peak: the layer with the largest measured visual attention mass.
  (tmp_path / "attention_decay.json").write_text(json.dumps(
      {"layers": {"0": {"mass": [0.1, 0.1]}, "1": {"mass": [0.3, 0.2]}}}))
  config.vlm.branch.visual_mass_from = str(tmp_path)
  assert vlm_config(config).branch_layers == (1,)


@pytest.mark.parametrize("name", FILES)
def test_run_control_fields_are_in_every_config_with_their_later_default(name):
  """The fields the loop reads (once added by the command line) are ordinary config
  fields, so `--config.<field>=` overrides them; LATER_FIELDS holds their defaults."""
  config = _load(name)
  for field, default in LATER_FIELDS.items():
    block, key = field.split(".")
    assert key in config[block], (name, field)
    assert config[block][key] == default, (name, field)


def test_a_run_saved_before_the_later_fields_resumes():
  """A checkpoint whose saved config predates LATER_FIELDS resumes with their defaults;
  another value of such a field is still a change."""
  from experiments.jobs.checks import check_resume_config
  from experiments.trainer.errors import ConfigMismatchError
  wanted = {"kind": "lm", "model": {}, "experiment": _load("lm_lngram.py", "smoke").to_dict()}
  old = json.loads(json.dumps(wanted["experiment"], default=list))
  for field in LATER_FIELDS:
    block, key = field.split(".")
    del old[block][key]
  saved = {"kind": "lm", "model": {}, "experiment": old}
  check_resume_config("run", saved, wanted, False, LATER_FIELDS)
  with pytest.raises(ConfigMismatchError, match="optim.state_dtype"):
    check_resume_config("run", saved, wanted, False, {})   # without the defaults: a change
  wanted["experiment"]["optim"]["state_dtype"] = "bfloat16"
  with pytest.raises(ConfigMismatchError, match=r"optim\.state_dtype: '<absent>' -> 'bfloat16'"):
    check_resume_config("run", saved, wanted, False, LATER_FIELDS)


def test_hf_lngram_is_table_13_keye2b(tiny_hf_dir):
  config = _load("hf_lngram.py")
  with pytest.raises(ValueError, match=r"model.d_model=0 .*init_from=hf:DIR"):
    lm_config(config)   # the backbone comes from a checkpoint, never from defaults
  lm = lm_config(_resolved(config, tiny_hf_dir))
  assert lm.memory_layers == (1, 13)   # the paper's layers 2 and 14
  m = lm.memory
  assert (m.routes, m.bits, m.q_heads, m.kv_heads, m.head_dim, m.mem_dim) == (
      121, 4, 16, 16, 128, 128)
  assert (m.orders, m.sink_mass, m.surrogate, m.conv_kernel, m.conv_dilation) == (
      (2, 3), 0.5, "onebit", 4, 3)
  assert (lm.d_model, lm.n_layers, lm.vocab_size, lm.qk_norm) == (64, 14, 256, True)
  o = config.optim
  assert (o.lr, o.min_lr_ratio * o.lr) == (1e-4, pytest.approx(2e-6))
  assert (o.lr * o.table_lr_mult, o.lr * o.table_lr_mult * o.table_min_lr_ratio) == (
      4e-4, pytest.approx(1e-5))
  assert (o.backbone_lr, o.weight_decay, o.warmup_steps) == (5e-6, 0.1, 1000)
  assert config.plan_devices == 8
  arms = {a: lm_config(_resolved(_load("hf_lngram.py", a), tiny_hf_dir)) for a in
          ("pkm", "engram", "v1", "sparse_ffn", "none")}
  assert arms["engram"].memory.vocab_size == 256   # the checkpoint's token ids
  assert arms["none"].memory_layers == ()
  assert all(arms[a].memory_layers == (1, 13) for a in ("pkm", "engram", "v1", "sparse_ffn"))
  with pytest.raises(ValueError, match="hf_lngram: unknown config arg 'r16'"):
    _load("hf_lngram.py", "r16")


def test_hf_lngram_memory_plan_scales_with_devices(tiny_hf_dir):
  from experiments.jobs.checks import lm_param_bytes, memory_plan, plan_line
  from experiments.models.config import lm_config
  config = _resolved(_load("hf_lngram.py"), tiny_hf_dir)
  one, eight = memory_plan(config, 1), memory_plan(config, 8)
  assert one["params"] == lm_param_bytes(lm_config(config)) and one["optimizer"] == 2 * one["params"]
  assert eight["params"] == -(-one["params"] // 8)
  assert eight["activations"] == one["activations"] // 8   # batch 8 over 8 devices
  line = plan_line(config, 8)
  assert line.startswith("memory per device on 8 devices (fsdp): parameters ")
  assert "optimizer state" in line and "activations" in line
  with pytest.raises(ValueError, match=r"plan_devices=-1 must be an int >= 1"):
    plan_line(config, -1)

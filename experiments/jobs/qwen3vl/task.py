"""PVM on Qwen3-VL as tasks of the trainer: Stage I "sft", Stage II "grpo" (DESIGN.md §11.8).

    qwen3vl_task(config, workdir, mesh)   the task of the stage `qwen3vl.stage.name` names
    check_qwen3vl_config(config)          the checks `train` makes before the workdir
    plan_line(config, devices)            parameters / AdamW state per device, from shapes

The model: Stage I starts from `qwen3vl.hf_dir` (experiments/hf/qwen3vl/load.py's
loader; PVM added at `qwen3vl.pvm.layers` at its init, λ = 0, so step 0 is the
checkpoint's model) or, without a checkpoint, from the tiny random `smoke`
model (experiments/vlm/qwen3vl/pvm.py) whose tokenizer is written into the run
directory; Stage II from the Stage I run (`qwen3vl.init_from`, restored whole).
Frozen parameters (`qwen3vl.stage.trainable`: "branch" in Stage I, "lm+branch"
in Stage II) get `optax.set_to_zero` and stay bit-for-bit unchanged. The
processor (tokenizer, chat template, image preprocessing) is the checkpoint's
or the run's `processor/` copy; data are LLaVA-style JSON lines
(`qwen3vl.data.train`, default the emoji counting scenes rendered into
`data/`), every image resized to `qwen3vl.data.image_size`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import ml_collections
from flax import nnx

from experiments.hf.qwen3vl.processor import Qwen3VLProcessor
from experiments.jobs.qwen3vl.data import ConversationSampler
from experiments.jobs.saved import resume_check, saved_config
from experiments.jobs.vlm.loss import TRAINABLE, trainable_mask
from experiments.models.lora import lora_config, lora_param_count
from experiments.trainer import Task, durable, writers
from experiments.vlm.qwen3vl.config import Qwen3VLConfig
from experiments.vlm.qwen3vl.conversations import ConversationData
from experiments.vlm.qwen3vl.emoji_jsonl import emoji_jsonl
from experiments.vlm.qwen3vl.pvm import smoke_config, with_pvm, with_remat

STAGES = ("sft", "grpo")
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "chat_template.json", "preprocessor_config.json", "special_tokens_map.json",
                   "generation_config.json")


def model_config(q, processor=None) -> Qwen3VLConfig:
  """The Qwen3VLConfig of a `qwen3vl` block: its checkpoint's (hf_dir) or the smoke
  model's, with PVM at `q.pvm.layers` unless the checkpoint already names PVM layers."""
  if q.hf_dir:
    from experiments.hf.config import read_config_json
    from experiments.hf.qwen3vl.load import qwen3vl_config
    config = qwen3vl_config(read_config_json(q.hf_dir), max_len=int(q.max_len) or None)
  else:
    config = smoke_config(processor, max_len=int(q.max_len) or 512)
  config = with_remat(config, q)
  lora = lora_config(q.get("lora"))   # LoRA-SFT: factors on the decoder (rank 0: none)
  if lora is not None:
    config = config.replace(text=config.text.replace(lora=lora))
  if config.text.ffn_branch_layers:   # the authors' pvm_layers: keep them
    want = tuple(sorted(q.pvm.layers))
    if want and want != tuple(config.text.ffn_branch_layers):
      raise ValueError(f"qwen3vl.pvm.layers={want}: the checkpoint already holds PVM at "
                       f"{tuple(config.text.ffn_branch_layers)}; set the same layers.")
    return config
  if not q.pvm.layers:
    return config
  return with_pvm(config, q.pvm.layers, int(q.pvm.latent_dim))


def with_local_checkpoint(config):
  """`config` with `qwen3vl.hf_dir` a local directory: a Hugging Face hub id
  (`Qwen/Qwen3-VL-8B-Instruct[@revision]`) is fetched into (or read from) the hub's cache
  (experiments/hf/hub.py) and replaced by its snapshot; anything else is left as given."""
  q = config.qwen3vl
  if not q.hf_dir or Path(q.hf_dir).expanduser().is_dir():
    return config
  from experiments.hf.hub import parse_hub_id, resolve_checkpoint
  if parse_hub_id(q.hf_dir) is None:
    return config   # check_qwen3vl_config names it: not a directory
  config = config.copy_and_resolve_references()
  config.qwen3vl.hf_dir = str(resolve_checkpoint(q.hf_dir))
  return config


def check_qwen3vl_config(config) -> None:
  """One-line refusals of a `qwen3vl` block, before anything is read or built."""
  q = config.qwen3vl
  st = q.stage
  if st.name not in STAGES:
    raise ValueError(f"qwen3vl.stage.name={st.name!r} is not one of {STAGES}.")
  if st.trainable not in TRAINABLE:
    raise ValueError(f"qwen3vl.stage.trainable={st.trainable!r} is not one of "
                     f"{tuple(TRAINABLE)}.")
  if st.trainable.startswith("lora") and not q.init_from and lora_config(q.get("lora")) is None:
    raise ValueError(f"qwen3vl.stage.trainable={st.trainable!r} needs LoRA factors: set "
                     "qwen3vl.lora.rank > 0.")
  if st.name == "grpo" and not q.init_from:
    raise ValueError("qwen3vl.stage.name='grpo' needs qwen3vl.init_from (the Stage I run "
                     "directory).")
  if q.size != "smoke" and not (q.hf_dir or q.init_from):
    raise ValueError(f"qwen3vl.hf_dir is empty: give the Qwen3-VL-{q.size.upper()} checkpoint "
                     "directory or hub id (or use the 'smoke' arg for a tiny random model).")
  for name in ("hf_dir", "init_from"):
    if q[name] and not Path(q[name]).is_dir():
      raise ValueError(f"qwen3vl.{name}={q[name]}: not a directory.")
  if q.data.train and not Path(q.data.train).is_file():
    raise ValueError(f"qwen3vl.data.train={q.data.train}: no such file.")
  size = tuple(q.data.image_size)
  if len(size) != 2 or min(size) < 1:
    raise ValueError(f"qwen3vl.data.image_size={size} must be (height, width) in pixels.")
  g = q.grpo
  for name in ("group_size", "prompts_per_step", "max_new_tokens"):
    if int(g[name]) < 1:
      raise ValueError(f"qwen3vl.grpo.{name}={g[name]} must be >= 1.")


def check_is_qwen3vl(hf_dir, given=None) -> None:
  """Refuses a checkpoint whose config.json is not Qwen3-VL's, naming its model_type
  (before the run copies a processor the checkpoint does not have); `given`: the
  directory or hub id as the user wrote it (`hf_dir` is then its snapshot)."""
  given = given or hf_dir
  from experiments.hf.config import read_config_json
  from experiments.hf.qwen3vl.load import MODEL_TYPE
  from experiments.hf.qwen3vl.moe import MODEL_TYPE as MOE_MODEL_TYPE
  model_type = read_config_json(hf_dir).get("model_type")
  if model_type not in (MODEL_TYPE, MOE_MODEL_TYPE):
    text = (" (a text model: train it with experiments/configs/hf_lngram.py and "
            f"--config.init_from=hf:{given})" if model_type not in (None, "") else "")
    raise ValueError(f"qwen3vl.hf_dir={given}: its config.json has model_type "
                     f"{model_type!r}, not {MODEL_TYPE!r} or {MOE_MODEL_TYPE!r}: not a "
                     f"Qwen3-VL checkpoint{text}.")


def _processor(q, workdir: Path) -> Qwen3VLProcessor:
  """The checkpoint's processor, copied into the run (`processor/`) so later stages,
  `sample` and an export find it; the smoke model's tiny one is written there."""
  own = workdir / "processor"
  if not own.is_dir():
    if q.init_from:
      shutil.copytree(Path(q.init_from) / "processor", own)
    elif q.hf_dir:
      own.mkdir(parents=True)
      for name in PROCESSOR_FILES:
        if (Path(q.hf_dir) / name).is_file():
          shutil.copyfile(Path(q.hf_dir) / name, own / name)
    else:
      from experiments.hf.qwen3vl.synthetic_processor import write_synthetic_processor_dir
      write_synthetic_processor_dir(own)
  return Qwen3VLProcessor.from_dir(own)


def build_model(config, processor):
  """(model, its config): the Stage I run's (init_from), the checkpoint's + PVM, or smoke."""
  q = config.qwen3vl
  if q.init_from:
    from experiments.jobs.registry import saved_job_name
    from experiments.jobs.restore import restore_module
    model, saved, _ = restore_module(q.init_from)
    if saved_job_name(saved) != "qwen3vl":
      raise ValueError(f"qwen3vl.init_from={q.init_from}: a {saved_job_name(saved)!r} run, "
                       "not a Qwen3-VL stage.")
    return model, model.config
  mc = model_config(q, processor)
  if q.hf_dir:
    from experiments.hf.qwen3vl.load import load_qwen3vl
    model, mc = load_qwen3vl(q.hf_dir, config=mc)
    return model, mc
  from experiments.vlm.qwen3vl.model import Qwen3VL
  return Qwen3VL(mc, rngs=nnx.Rngs(config.train.seed)), mc


def _data(q, workdir: Path, processor) -> ConversationData:
  path = q.data.train or emoji_jsonl(workdir / "data", "train", int(q.data.emoji_n),
                                     task="count")
  return ConversationData(path, processor, fixed_size=tuple(q.data.image_size),
                          require_answers=q.stage.name == "grpo")


def qwen3vl_task(config, workdir, mesh=None) -> Task:
  """The task of one Qwen3-VL stage (experiments/configs/qwen3vl_pvm_*.py)."""
  # XLA partitions the forward from the parameters' and batch's shardings; the mesh is
  # passed for the attention kernels, which run per batch shard. The qwen3vl block was
  # checked by the job's check (experiments/jobs/qwen3vl/__init__.py).
  q, st = config.qwen3vl, config.qwen3vl.stage
  workdir = Path(workdir)
  durable.write_text(workdir / "config.json", config.to_json_best_effort(indent=1))
  processor = _processor(q, workdir)
  source = Path(q.init_from or q.hf_dir) / ("hf_config.json" if q.init_from else "config.json")
  if source.is_file() and not (workdir / "hf_config.json").exists():
    shutil.copyfile(source, workdir / "hf_config.json")   # export-hf keeps its fields
  model, mc = build_model(config, processor)
  data = _data(q, workdir, processor)
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  if st.name == "sft":
    from experiments.jobs.qwen3vl.sft import sft_loss
    batches = ConversationSampler(data, mc, batch_size=config.data.batch_size,
                                  seq_len=config.data.seq_len, seed=config.train.seed)
    loss = sft_loss(batches.grid_thw, images_per_row=batches.images_per_row, mesh=mesh)
    prepare = None
    tokens_per_step = config.data.batch_size * config.data.seq_len
  else:
    from experiments.jobs.qwen3vl.grpo import qwen3vl_grpo_hooks
    g = q.grpo
    batches = ConversationSampler(data, mc, batch_size=g.prompts_per_step, seq_len=0,
                                  seed=config.train.seed, mode="prompts",
                                  group_size=g.group_size)
    ref = build_model(config, processor)[0] if g.kl_coef else None   # the policy at the start
    eos = processor.tokenizer.token_to_id("<|im_end|>")
    prepare, loss = qwen3vl_grpo_hooks(data, g, grid_thw=batches.grid_thw,
                                       seed=config.train.seed, eos=eos, ref_model=ref,
                                       images_per_row=batches.images_per_row, mesh=mesh)
    # Constant learning rate, no weight decay (the paper's Stage II).
    optim.update(lr=g.lr, weight_decay=0.0, warmup_steps=0, warmup_frac=0.0, min_lr_ratio=1.0)
    tokens_per_step = g.prompts_per_step * g.group_size * g.max_new_tokens
  saved = saved_config("qwen3vl", config, mc)
  pvm = mc.text.ffn_branch_layers
  return Task(
      module=model, saved_config=saved, check_resume=resume_check(config, saved),
      batches=batches, loss=loss, optim=optim, phases=(config.train.steps,),
      trainable=trainable_mask(st.trainable), prepare=prepare,
      finish=lambda module, summary: _finish(config, workdir, summary),
      tokens_per_step=tokens_per_step,
      description=f"qwen3vl {st.name}, PVM at {pvm}, trainable {st.trainable}, data {data.path}")


def _finish(config, workdir: Path, summary) -> dict:
  """metrics.json: the stage's loss (Stage I) or reward (Stage II) history."""
  rows = [r for r in writers.read_metrics(workdir) if "train/loss" in r]
  key = "train/reward" if config.qwen3vl.stage.name == "grpo" else "train/loss"
  metrics = {"stage": config.qwen3vl.stage.name, "steps": [r["step"] for r in rows],
             key.split("/")[1]: [r.get(key) for r in rows],
             "train_seconds": summary["train_seconds"]}
  (workdir / "metrics.json").write_text(json.dumps(metrics, indent=1))
  return metrics


def param_count(config):
  """(parameters, Qwen3VLConfig) of the model a config describes, from shapes alone
  (the checkpoint's config.json, no arrays)."""
  params, mc = abstract_params(config)
  return sum(int(x.size) for x in jax.tree.leaves(params)), mc


def abstract_params(config):
  """(abstract pure-dict parameters, Qwen3VLConfig) of the model a config describes."""
  from experiments.vlm.qwen3vl.model import Qwen3VL
  q = config.qwen3vl
  processor = None if q.hf_dir else _smoke_processor()
  mc = model_config(q, processor)
  abstract = nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(0)))
  return nnx.to_pure_dict(nnx.state(abstract, nnx.Param)), mc


def _smoke_processor():
  import tempfile

  from experiments.hf.qwen3vl.synthetic_processor import write_synthetic_processor_dir
  with tempfile.TemporaryDirectory() as tmp:
    return Qwen3VLProcessor.from_dir(write_synthetic_processor_dir(Path(tmp) / "p"))


def plan_line(config, devices: int) -> str:
  """Parameters and AdamW state per device with both sharded over `devices` (float32
  moments), and what trains: the line `train` prints for `plan_devices`."""
  from experiments.jobs.checks import format_bytes
  params, mc = abstract_params(config)
  n = sum(int(x.size) for x in jax.tree.leaves(params))
  itemsize = 2 if str(mc.text.param_dtype) in ("bfloat16", "float16") else 4
  pvm = mc.text.ffn_branch
  branch = 0
  if pvm is not None:
    from pvm_jax.module import param_count as pvm_count
    branch = pvm_count(pvm)["total"] * len(mc.text.ffn_branch_layers)
  lora = lora_param_count(params)
  trains = {"branch": branch, "lora": lora, "lora+branch": lora + branch}.get(
      config.qwen3vl.stage.trainable, n)
  per_device = (n * itemsize + 2 * trains * 4) / devices
  return (f"plan for {devices} devices: {n / 1e9:.3f}B parameters ({branch / 1e6:.2f}M in "
          f"{len(mc.text.ffn_branch_layers)} PVM branches, {lora / 1e6:.2f}M in LoRA "
          f"factors), {trains / 1e6:.2f}M trained; "
          f"parameters + AdamW state {format_bytes(per_device)} per device (activations "
          "not included)")

"""LoRA factors <-> a PEFT adapter directory (adapter_config.json + adapter_model.safetensors).

    adapter_tensors(table, flat)          our factors as PEFT tensors + target module names
    write_adapter(out, table, flat, lora) the adapter directory (into an existing `out`)
    read_adapter(adapter_dir, table)      (LoRAConfig, {our factor path: array})

PEFT stores per HF linear `<module>` (e.g. model.layers.0.self_attn.q_proj)
`base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r],
ΔW = (lora_alpha / r) · B A on the [out, in] weight. Our factors (qwix's layout,
experiments/models/lora.py) are A [contracted dims..., r], B [r, other dims...] on
a weight [in..., out...] that the name table transposes into HF's [out, in]: so
lora_A = Aᵀ (A's leading dims flattened) and lora_B = Bᵀ (B's trailing dims
flattened). The fused w_kv row names k_proj and v_proj: both get our one A, and
B's k and v halves. Reading back, an adapter whose k_proj and v_proj hold
different A's becomes factors of rank 2r on w_kv (A = [A_k | A_v], B block-
diagonal) with alpha 2α, and every other weight's factors are zero-padded to 2r:
the same scale α/r and exactly the adapter's ΔW. Every refusal is one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.lora import LoRAConfig

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
# Options of a LoRA adapter that change its maths; anything but these values is refused.
PLAIN = {"use_rslora": False, "use_dora": False, "fan_in_fan_out": False, "bias": "none",
         "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}


def _module(source: str) -> str:
  return source[:-len(".weight")]


def adapter_tensors(table: dict, flat: dict) -> tuple[dict, list[str]]:
  """PEFT tensors {name: [r, in] / [out, r]} and the target module names of the factors
  in `flat` ({our path: array}, e.g. 'blocks/0/attn/w_q_lora_a'), via the name table."""
  tensors, targets = {}, set()
  for path, row in table.items():
    a, b = flat.get(path + "_lora_a"), flat.get(path + "_lora_b")
    if a is None:
      continue
    r = a.shape[-1]
    a_in = np.ascontiguousarray(np.reshape(a, (-1, r)).T)
    halves = [b] if len(row.theirs) == 1 else [b[:, j] for j in range(len(row.theirs))]
    for source, half in zip(row.theirs, halves, strict=True):
      name = PREFIX + _module(source)
      tensors[name + ".lora_A.weight"] = a_in
      tensors[name + ".lora_B.weight"] = np.ascontiguousarray(np.reshape(half, (r, -1)).T)
      targets.add(_module(source).rsplit(".", 1)[-1])
  return tensors, sorted(targets)


def write_adapter(out: Path, table: dict, flat: dict, lora: LoRAConfig, *,
                  base: str = "") -> list[str]:
  """adapter_config.json + adapter_model.safetensors of the factors into `out`."""
  from safetensors.numpy import save_file
  tensors, targets = adapter_tensors(table, flat)
  if not tensors:
    raise HFCheckpointError("export-hf --adapter: the run has no LoRA factors.")
  config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
            "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
            "target_modules": targets, "base_model_name_or_path": base,
            "init_lora_weights": True, "inference_mode": True, **PLAIN}
  (out / CONFIG_FILE).write_text(json.dumps(config, indent=1))
  save_file(tensors, str(out / WEIGHTS_FILE))
  return [CONFIG_FILE, WEIGHTS_FILE]


def _read_config(adapter_dir: Path) -> dict:
  path = adapter_dir / CONFIG_FILE
  if not path.is_file() or not (adapter_dir / WEIGHTS_FILE).is_file():
    raise HFCheckpointError(f"--adapter={adapter_dir}: not a PEFT adapter directory (needs "
                            f"{CONFIG_FILE} and {WEIGHTS_FILE}).")
  config = json.loads(path.read_text())
  if config.get("peft_type") != "LORA":
    raise HFCheckpointError(f"--adapter={adapter_dir}: peft_type={config.get('peft_type')!r}; "
                            "only LORA adapters are read.")
  for key, plain in PLAIN.items():
    if config.get(key, plain) not in (plain, None, [] if plain is None else plain):
      raise HFCheckpointError(f"--adapter={adapter_dir}: {key}={config[key]!r} is not "
                              f"supported (only {plain!r}).")
  return config


def read_adapter(adapter_dir, table: dict) -> tuple[LoRAConfig, dict]:
  """The adapter's LoRAConfig (targets: exactly its weights) and our factors
  {path + '_lora_a' / '_lora_b': array}, from the name table `table` of the base."""
  from safetensors.numpy import load_file
  adapter_dir = Path(adapter_dir)
  config = _read_config(adapter_dir)
  r, alpha = int(config["r"]), float(config["lora_alpha"])
  tensors = {re.sub(r"\.default(?=\.weight$)", "", k): v
             for k, v in load_file(str(adapter_dir / WEIGHTS_FILE)).items()}
  ours = {}   # our path -> {source index: (lora_A [r, in], lora_B [out, r])}
  by_source = {_module(s): (path, j) for path, row in table.items()
               for j, s in enumerate(row.theirs) if s.endswith(".weight")}
  for name in sorted(tensors):
    if not name.endswith(".lora_A.weight"):
      if not name.endswith(".lora_B.weight"):
        raise HFCheckpointError(f"--adapter={adapter_dir}: unexpected tensor {name}.")
      continue
    module = name[len(PREFIX):-len(".lora_A.weight")]
    if module not in by_source:
      raise HFCheckpointError(f"--adapter={adapter_dir}: unknown target module {module} (not a "
                              "linear weight of the base model).")
    a, b = tensors[name], tensors.get(name.replace(".lora_A.", ".lora_B."))
    if b is None or a.shape[0] != r or b.shape[1] != r:
      raise HFCheckpointError(f"--adapter={adapter_dir}: {module} has rank "
                              f"{a.shape[0]} / {None if b is None else b.shape[1]}, "
                              f"adapter_config.json says r={r} (rank mismatch).")
    path, j = by_source[module]
    ours.setdefault(path, {})[j] = (a, b)
  if not ours:
    raise HFCheckpointError(f"--adapter={adapter_dir}: no LoRA tensors.")
  fused = [p for p, parts in ours.items() if len(parts) == 2
           and not np.array_equal(parts[0][0], parts[1][0])]
  rank = 2 * r if fused else r
  factors = {path: _ours(table[path], parts, r, rank) for path, parts in ours.items()}
  targets = "|".join(re.escape(p) for p in sorted(ours))
  lora = LoRAConfig(rank=rank, alpha=alpha * rank / r, targets=targets)
  return lora, factors


def _ours(row, parts: dict, r: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
  """(A [in, rank], B [rank, out...]) in HF order of `row`'s sources: flattened like the
  weight's [in, out] (the caller reshapes to the model's factor shapes)."""
  n = len(row.theirs)
  outs = [row.shape[0]] * n   # every source of a row has the row's HF shape [out, in]
  a0 = parts[next(iter(parts))][0]
  same_a = all(np.array_equal(p[0], a0) for p in parts.values())
  A = np.zeros((a0.shape[1], rank), a0.dtype)
  B = np.zeros((rank, n, outs[0]), a0.dtype)
  for j, (a, b) in parts.items():
    off = 0 if same_a else j * r
    A[:, off:off + r] = a.T
    B[off:off + r, j] = b.T
  return A, B.reshape(rank, -1) if n == 1 else B

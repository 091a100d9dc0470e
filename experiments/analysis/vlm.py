"""Analyses of a trained VLM: visual attention decay, PVM attention, accuracy by length, LogitLens.

Library functions return plain dicts (JSON-ready); `write_json_png` stores
each as <name>.json + <name>.png in a run directory. All read greedy answers
generated with the caches, then one parallel forward over [image | prompt |
answer] with `probe=True` (the decoder block's attention probabilities, PVM's
and the hidden states, from the block's parallel mode).

Generated position t = 0, 1, ... is the query position that emits answer
token t (sequence position Nv + prompt_len + t - 1).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.analysis import output
from experiments.models.generate import completion_mask, generate
from experiments.vlm.emoji.rewards import accuracy_reward, reward
from experiments.vlm.tiny.data import EOS, LENGTH_GROUPS, decode, item_correct, length_group


def fit_inverse(t, y) -> dict:
  """Least-squares fit y ≈ a / (b + t), b > 0 on a log grid, a in closed form; with R²."""
  t = np.asarray(t, np.float64)
  y = np.asarray(y, np.float64)
  best = None
  for b in np.logspace(-3, 5, 400):
    f = 1.0 / (b + t)
    a = float(f @ y / (f @ f))
    sse = float(np.sum((y - a * f) ** 2))
    if best is None or sse < best[2]:
      best = (a, float(b), sse)
  a, b, sse = best
  sst = float(np.sum((y - y.mean()) ** 2))
  return {"a": a, "b": b, "r2": 1.0 - sse / sst if sst > 0 else float("nan")}


def greedy_answers(model, data, idx, max_new_tokens: int):
  pb = data.prompt_batch(idx)
  tokens = generate(model, pb["tokens"], prompt_lengths=pb["lengths"], images=pb["images"],
                    max_new_tokens=max_new_tokens, rng=jax.random.key(0), greedy=True)
  return pb, np.asarray(tokens)


def _forward_aux(model, pb, tokens_BxN):
  """Parallel forward over [image | prompt | answer] with probabilities and hidden states."""
  B, T = pb["tokens"].shape
  N = tokens_BxN.shape[1]
  seq = np.zeros((B, T + N), np.int32)
  for b in range(B):
    L = pb["lengths"][b]
    seq[b, :L] = pb["tokens"][b, :L]
    seq[b, L:L + N] = tokens_BxN[b]
  valid = np.arange(T + N)[None, :] < (pb["lengths"] + N)[:, None]
  return _jit_forward_aux(model, jnp.asarray(pb["images"]), jnp.asarray(seq), jnp.asarray(valid))


@nnx.jit
def _jit_forward_aux(model, images, seq, valid):
  """logits and the probes grouped per layer: attn_probs [B, Hq, S, S] per layer,
  pvm_probs {layer: [B, S, Hq, Nv]}, hidden [B, S, D] and layer_logits per layer."""
  logits, aux = model(images, seq, valid=valid, probe=True)
  L = model.config.lm.n_layers
  hidden = [aux[f"block/{layer}/hidden"] for layer in range(L)]
  grouped = {
      "attn_probs": [aux[f"attn/{layer}/probs"] for layer in range(L)],
      "pvm_probs": {layer: aux[f"ffn_branch/{layer}/probs"] for layer in range(L)
                    if f"ffn_branch/{layer}/probs" in aux},
      "hidden": hidden,
      # LogitLens logits of every layer, inside the same program.
      "layer_logits": [model.lm.logits(h) for h in hidden],
  }
  return logits, grouped


def _query_positions(model, pb, N):
  return model.config.n_visual + pb["lengths"][:, None] + np.arange(N)[None, :] - 1


def attention_decay(model, data, *, n: int = 16, max_new_tokens: int = 96,
                    batch_size: int = 8) -> dict:
  """Backbone visual attention mass per layer vs t (+ a/(b+t) fits), and PVM's attention.

  mass_l(t) = Σ_{k < Nv} p(query t -> key k), averaged over heads and over
  the samples whose answer is still running at t. PVM's softmax runs over
  the visual tokens only, so its mass is 1 by construction; what can depend
  on t there is how peaked it is: we report the mean max-probability and
  entropy of its heads vs t.
  """
  Nv = model.config.n_visual
  L = model.config.lm.n_layers
  N = max_new_tokens
  mass_sum = np.zeros((L, N))
  pvm_max, pvm_ent = {}, {}
  count = np.zeros(N)
  for start in range(0, n, batch_size):
    idx = np.arange(start, min(n, start + batch_size))
    pb, tokens = greedy_answers(model, data, idx, N)
    logits, aux = _forward_aux(model, pb, tokens)
    live = np.asarray(completion_mask(jnp.asarray(tokens), EOS), np.float64)   # [B, N]
    q = _query_positions(model, pb, N)                                          # [B, N]
    rows = np.arange(len(idx))[:, None]
    for layer, p_BxHxSxS in enumerate(aux["attn_probs"]):
      p = np.asarray(p_BxHxSxS)
      m_BxN = p[rows, :, q, :Nv].sum(-1).mean(-1)                                # [B, N]
      mass_sum[layer] += (m_BxN * live).sum(0)
    for layer, p_BxSxHxNv in aux["pvm_probs"].items():
      p = np.asarray(p_BxSxHxNv)[rows, q]                                        # [B, N, H, Nv]
      ent = -(p * np.log(np.maximum(p, 1e-30))).sum(-1).mean(-1)
      pvm_max.setdefault(layer, np.zeros(N))
      pvm_ent.setdefault(layer, np.zeros(N))
      pvm_max[layer] += (p.max(-1).mean(-1) * live).sum(0)
      pvm_ent[layer] += (ent * live).sum(0)
    count += live.sum(0)
  keep = count > 0
  t = np.arange(1, N + 1)[keep]
  out = {"t": t.tolist(), "samples_at_t": count[keep].tolist(), "n_visual": Nv, "layers": {}}
  for layer in range(L):
    curve = mass_sum[layer][keep] / count[keep]
    out["layers"][str(layer)] = {"mass": curve.tolist(), "fit": fit_inverse(t, curve)}
  out["pvm"] = {str(layer): {"mass": [1.0] * int(keep.sum()),
                             "max_prob": (pvm_max[layer][keep] / count[keep]).tolist(),
                             "entropy": (pvm_ent[layer][keep] / count[keep]).tolist()}
                for layer in pvm_max}
  return out


def accuracy_by_length(model, data, *, n: int = 64, max_new_tokens: int = 160,
                       batch_size: int = 16) -> dict:
  """Greedy answers scored per length group (by k) and per object position.

  item accuracy: fraction of objects whose exact "position: name." appears;
  for the count task also the answer accuracy and reward (experiments.vlm.emoji.rewards).
  `per_scene` keeps every scene's k, length group, item accuracy and answer accuracy
  (None for the caption task) and a digest of the scene (`scene_digest`), in validation
  order: arms evaluated on the same scenes pair scene by scene.
  """
  k_max = data.scene_config.k_max
  per_group = {g: {"n": 0, "item_acc": 0.0, "answer_acc": 0.0, "reward": 0.0}
               for g in LENGTH_GROUPS}
  per_pos = np.zeros(k_max)
  per_pos_n = np.zeros(k_max)
  samples = []
  per_scene = {"digest": [], "k": [], "group": [], "item_acc": [], "answer_acc": []}
  for start in range(0, n, batch_size):
    idx = np.arange(start, min(n, start + batch_size))
    _, tokens = greedy_answers(model, data, idx, max_new_tokens)
    for j, row in zip(idx, tokens, strict=True):
      scene, text = data.scenes[j], decode(row)
      items = item_correct(text, scene)
      group = length_group(scene.k, k_max)
      g = per_group[group]
      g["n"] += 1
      g["item_acc"] += float(np.mean(items))
      answer_acc = None
      if data.task == "count":
        answer = data.examples[j]["answer"]
        answer_acc = float(accuracy_reward(text, answer))
        g["answer_acc"] += answer_acc
        g["reward"] += reward(text, answer)
      for key, value in (("digest", scene_digest(scene)), ("k", scene.k), ("group", group),
                         ("item_acc", float(np.mean(items))), ("answer_acc", answer_acc)):
        per_scene[key].append(value)
      per_pos[:len(items)] += items
      per_pos_n[:len(items)] += 1
      if len(samples) < 4:
        samples.append({"k": scene.k, "text": text, "target": data.examples[j]["target"]})
  for g in per_group.values():
    for key in ("item_acc", "answer_acc", "reward"):
      g[key] = g[key] / g["n"] if g["n"] else None
  total = sum(g["n"] for g in per_group.values())
  overall = {key: float(np.nansum([g[key] * g["n"] for g in per_group.values()
                                   if g["n"]]) / total)
             for key in ("item_acc", "answer_acc", "reward")}
  return {"task": data.task, "n": total, "overall": overall, "groups": per_group,
          "position_acc": (per_pos / np.maximum(per_pos_n, 1)).tolist(),
          "position_n": per_pos_n.tolist(), "samples": samples, "per_scene": per_scene}


def scene_digest(scene) -> str:
  """12 hex digits naming a scene by its content (grid, cells, classes, category)."""
  import hashlib
  key = f"{scene.rows}x{scene.cols}:{scene.cells}:{scene.classes}:{scene.category}"
  return hashlib.sha256(key.encode()).hexdigest()[:12]


def logit_lens(model, data, *, n: int = 16, max_new_tokens: int = 96,
               batch_size: int = 8) -> dict:
  """KL(final ‖ layer l) of the next-token distributions over the answer tokens, per layer."""
  L = model.config.lm.n_layers
  kl_sum, tot = np.zeros(L), 0.0
  for start in range(0, n, batch_size):
    idx = np.arange(start, min(n, start + batch_size))
    pb, tokens = greedy_answers(model, data, idx, max_new_tokens)
    logits, aux = _forward_aux(model, pb, tokens)
    live = np.asarray(completion_mask(jnp.asarray(tokens), EOS), np.float64)
    q = _query_positions(model, pb, tokens.shape[1])
    rows = np.arange(len(idx))[:, None]
    logp_final = jax.nn.log_softmax(logits[rows, q], axis=-1)
    for layer, layer_logits in enumerate(aux["layer_logits"]):
      logp_l = jax.nn.log_softmax(layer_logits[rows, q], axis=-1)
      kl = np.asarray(jnp.sum(jnp.exp(logp_final) * (logp_final - logp_l), axis=-1))
      kl_sum[layer] += (kl * live).sum()
    tot += live.sum()
  return {"layers": list(range(L)), "kl": (kl_sum / max(tot, 1.0)).tolist()}


def write_json_png(run_dir, name: str, result: dict) -> Path:
  """<run_dir>/<name>.json and a PNG plot of the result, each written atomically."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  run_dir = Path(run_dir)
  fig, ax = plt.subplots(figsize=(6, 4))
  if "layers" in result and isinstance(result["layers"], dict):
    t = np.asarray(result["t"])
    for layer, r in result["layers"].items():
      f = r["fit"]
      ax.plot(t, r["mass"], label=f"layer {layer} (R²={f['r2']:.2f})")
      ax.plot(t, f["a"] / (f["b"] + t), "k:", lw=0.8)
    for layer, r in result.get("pvm", {}).items():
      ax.plot(t, r["max_prob"], "--", label=f"PVM {layer} max prob")
    ax.set_xlabel("generated position t")
    ax.set_ylabel("visual attention mass")
  elif "groups" in result:
    groups = [g for g in LENGTH_GROUPS if result["groups"][g]["n"]]
    ax.bar(groups, [result["groups"][g]["item_acc"] for g in groups])
    ax.set_ylabel("item accuracy")
  elif "cell_attn" in result:
    layers = np.arange(len(result["cell_attn"]))
    ax.plot(layers, result["visual_attn"], "o-", label="all visual tokens")
    ax.plot(layers, result["cell_attn"], "o-", label="the named cell")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention when emitting a name")
    ax.set_title(f"name accuracy {result['name_acc']:.2f} (chance {result['chance_name_acc']:.3f})")
  elif "kl" in result:
    ax.plot(result["layers"], result["kl"], "o-")
    ax.set_xlabel("layer")
    ax.set_ylabel("KL(final || layer)")
  ax.legend(fontsize=6) if ax.get_legend_handles_labels()[0] else None
  fig.tight_layout()
  output.atomic_write(run_dir / f"{name}.png", lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
  plt.close(fig)
  return output.write_json(run_dir / f"{name}.json", result, allow_nan=True)

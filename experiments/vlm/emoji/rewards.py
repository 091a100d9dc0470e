"""Verifiable rewards for the counting questions (the paper's GRPO reward).

    reward = 0.1 · format + 0.9 · accuracy

format    1 if the completion holds exactly one well-formed "<answer>N</answer>"
          (N a non-negative integer, spaces allowed inside the tags) and
          nothing but whitespace after it; else 0.
accuracy  1 if that single answer equals the target; else 0. A completion
          with two answer tags scores 0 here too, so listing several answers
          cannot buy accuracy.
"""

from __future__ import annotations

import re

import numpy as np

FORMAT_WEIGHT, ACCURACY_WEIGHT = 0.1, 0.9
_TAG = re.compile(r"<answer>\s*(\d+)\s*</answer>")
_OPEN = re.compile(r"<answer>")


def parse_answer(text: str) -> int | None:
  """N of the only well-formed answer tag; None if there is none or more than one."""
  if len(_OPEN.findall(text)) != 1:
    return None
  found = _TAG.findall(text)
  return int(found[0]) if len(found) == 1 else None


def format_reward(text: str) -> float:
  if parse_answer(text) is None:
    return 0.0
  match = _TAG.search(text)
  return 1.0 if not text[match.end():].strip() else 0.0


def accuracy_reward(text: str, target: int) -> float:
  if isinstance(target, bool) or not isinstance(target, (int, np.integer)):
    raise ValueError(f"the target answer {target!r} is not an integer.")   # 2.7 is not 2
  answer = parse_answer(text)
  return 1.0 if answer is not None and answer == int(target) else 0.0


def reward(text: str, target: int) -> float:
  return FORMAT_WEIGHT * format_reward(text) + ACCURACY_WEIGHT * accuracy_reward(text, target)


def rewards(texts, targets) -> np.ndarray:
  """float32 [N] rewards of N completions against N integer targets."""
  texts, targets = list(texts), list(targets)
  if len(texts) != len(targets):
    raise ValueError(f"{len(texts)} completions but {len(targets)} targets.")
  return np.array([reward(t, y) for t, y in zip(texts, targets, strict=True)], np.float32)

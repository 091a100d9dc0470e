"""Answer parsing and the 0.1·format + 0.9·accuracy reward on hand-made completions."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.vlm.emoji.rewards import (
  accuracy_reward,
  format_reward,
  parse_answer,
  reward,
  rewards,
)

CASES = [
    # text, target, parsed, format, accuracy
    ("<answer>3</answer>", 3, 3, 1.0, 1.0),
    ("top-left: dog. center: cat. <answer>2</answer>", 2, 2, 1.0, 1.0),
    ("reasoning... <answer> 4 </answer>\n", 4, 4, 1.0, 1.0),
    ("<answer>3</answer>", 2, 3, 1.0, 0.0),                      # well-formed, wrong
    ("<answer>2</answer> and more text", 2, 2, 0.0, 1.0),        # right, not at the end
    ("<answer>2</answer><answer>3</answer>", 2, None, 0.0, 0.0),  # two answers: nothing
    ("<answer>2</answer> <answer>", 2, None, 0.0, 0.0),          # stray second opening tag
    ("<answer>two</answer>", 2, None, 0.0, 0.0),
    ("<answer>-1</answer>", -1, None, 0.0, 0.0),
    ("<answer>2", 2, None, 0.0, 0.0),
    ("the answer is 2", 2, None, 0.0, 0.0),
    ("", 0, None, 0.0, 0.0),
    ("<answer>007</answer>", 7, 7, 1.0, 1.0),
]


@pytest.mark.parametrize(("text", "target", "parsed", "fmt", "acc"), CASES)
def test_hand_made_cases(text, target, parsed, fmt, acc):
  assert parse_answer(text) == parsed
  assert format_reward(text) == fmt
  assert accuracy_reward(text, target) == acc
  assert reward(text, target) == pytest.approx(0.1 * fmt + 0.9 * acc)


def test_batched_rewards():
  texts = [c[0] for c in CASES]
  targets = [c[1] for c in CASES]
  expected = np.array([0.1 * c[3] + 0.9 * c[4] for c in CASES], np.float32)
  np.testing.assert_allclose(rewards(texts, targets), expected)
  assert rewards(["<answer>1</answer>"], [1]).tolist() == pytest.approx([1.0])
  with pytest.raises(ValueError, match="2 completions but 1 targets"):
    rewards(["a", "b"], [1])

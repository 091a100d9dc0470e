"""lm-evaluation-harness on a run: the adapter's three request types against the model's
own logits and sampler, and `lm_eval_command` on local task files (offline)."""

import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from experiments.cli.commands.lm_eval import (  # noqa: E402
    lm_eval_command,
    restore_lm,
    write_results,
)
from experiments.jobs.lm.sample import encode, sample_text  # noqa: E402

MC_DOCS = [
    {"question": "the cat sat on the", "choices": ["mat", "xqz", "dog"], "label": 0},
    {"question": "def f(x): return", "choices": [" x", " 12345", "!!"], "label": 0},
    {"question": "hello", "choices": [" world", " there"], "label": 1},
]
TEXT_DOCS = [{"text": "a short document."},
             {"text": "a longer one, with more than one window of 128 bytes. " * 4}]
GEN_DOCS = [{"prompt": "Q: 2+2?\nA:", "answer": " 4"}, {"prompt": "def ", "answer": "f"}]

TASKS = {
    "tiny_mc": ("mc.jsonl", MC_DOCS, """
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
"""),
    "tiny_rolling": ("text.jsonl", TEXT_DOCS, """
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""),
    "tiny_gen": ("gen.jsonl", GEN_DOCS, """
output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
"""),
}


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
  """Nothing downloaded, nothing cached outside tmp_path (`datasets` reads its settings
  when first imported, so its config module is patched too)."""
  cache = tmp_path / "hf"
  for name, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                      "HF_HOME": str(cache), "HF_DATASETS_CACHE": str(cache / "datasets")
                      }.items():
    monkeypatch.setenv(name, value)
  import datasets.config
  import huggingface_hub.constants
  monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
  monkeypatch.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", cache / "downloads")
  monkeypatch.setattr(datasets.config, "EXTRACTED_DATASETS_PATH", cache / "extracted")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def task_dir(tmp_path):
  """The three task YAMLs over local jsonl files."""
  root = tmp_path / "tasks"
  root.mkdir()
  for name, (data, docs, body) in TASKS.items():
    (root / data).write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / data}\ntest_split: test\n{body}")
  return root


@pytest.fixture(scope="module")
def adapter(smoke_run):
  lm, step = restore_lm(smoke_run[0], batch_size=2)
  assert step == 2
  return lm


def _requests(kind, args_list):
  return [Instance(request_type=kind, doc={}, arguments=args, idx=i)
          for i, args in enumerate(args_list)]


_forward = nnx.jit(lambda model, tokens: model(tokens))


def _logp(model, inputs, targets):
  """log p(target_t | inputs[:t+1]) of every position, and whether each is the argmax:
  the plain forward of one row (zeros after `inputs` fill it to max_len, one compiled
  shape; causal, so they change no earlier position's logits)."""
  n = len(inputs)
  row = np.zeros((1, model.config.max_len), np.int32)
  row[0, :n] = inputs
  logits = np.asarray(_forward(model, jnp.asarray(row)))[0, :n]
  logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
  return logp[np.arange(n), targets], logits.argmax(-1) == np.asarray(targets)


def _direct(model, context: list[int], continuation: list[int], max_len: int):
  whole = (context + continuation)[-(max_len + 1):]
  logp, greedy = _logp(model, whole[:-1], whole[1:])
  n = len(continuation)
  return float(logp[-n:].sum()), bool(greedy[-n:].all())


def test_loglikelihood_is_the_continuation_log_probability(adapter):
  """Sum over the continuation's tokens of the model's own log-softmax, batched and
  padded (2 rows a batch, 5 requests), with an empty context (the prefix "\\n"), a
  trailing space moved to the continuation and a context past max_len truncated."""
  model, L = adapter.model, adapter.max_length
  long_context = "0123456789" * 20   # 200 bytes > max_len=128
  cases = [("the cat sat on the", " mat"), ("", "hello"), ("abc ", "def"),
           (long_context, " end"), ("x", "yz" * 30)]
  got = adapter.loglikelihood(_requests("loglikelihood", cases))
  want = [
      _direct(model, list(encode("the cat sat on the")), list(encode(" mat")), L),
      _direct(model, [10], list(encode("hello")), L),
      _direct(model, list(encode("abc")), list(encode(" def")), L),
      _direct(model, list(encode(long_context)), list(encode(" end")), L),
      _direct(model, list(encode("x")), list(encode("yz" * 30)), L),
  ]
  for (g_lp, g_greedy), (w_lp, w_greedy) in zip(got, want, strict=True):
    assert g_lp == pytest.approx(w_lp, rel=1e-5, abs=1e-4)
    assert g_greedy == w_greedy
  assert all(lp < 0 for lp, _ in got)
  # The model's own greedy continuation is greedy.
  greedy_next = sample_text(model, ["the cat"], max_new_tokens=3, greedy=True)[0]
  assert adapter.loglikelihood(_requests("loglikelihood", [("the cat", greedy_next)]))[0][1]


def test_loglikelihood_rolling_sums_over_the_whole_text(adapter):
  """One window: "\\n" + text predicts every byte; a 300-byte text: disjoint windows of
  max_len predicted bytes, each with a full max_len of context (lm-eval's docs)."""
  model, L = adapter.model, adapter.max_length
  short, long = "a short document.", "".join(chr(97 + i % 26) for i in range(300))
  got = adapter.loglikelihood_rolling(_requests("loglikelihood_rolling",
                                                [(short,), (long,), ("",)]))
  ids = list(encode(short))
  assert got[0] == pytest.approx(float(_logp(model, [10] + ids[:-1], ids)[0].sum()),
                                 rel=1e-5, abs=1e-4)
  t, n = list(encode(long)), len(long)
  want = float(_logp(model, [10] + t[:L - 1], t[:L])[0].sum())   # bytes 0..127
  want += float(_logp(model, t[L - 1:2 * L - 1], t[L:2 * L])[0].sum())   # 128..255
  last = _logp(model, t[n - L - 1:n - 1], t[n - L:n])[0]   # 256..299, full context
  want += float(last[-(n - 2 * L):].sum())
  assert got[1] == pytest.approx(want, rel=1e-5, abs=1e-3)
  assert got[2] == 0.0


def test_generate_until_is_the_greedy_sampler_cut_at_the_stop(adapter):
  """Equal to `sample_text(greedy=True)` up to the stop string, for 3 prompts of unequal
  lengths in batches of 2; without a stop, max_gen_toks bytes."""
  model = adapter.model
  prompts = ["def ", "the cat sat", "x"]
  full = [sample_text(model, [p], max_new_tokens=20, greedy=True)[0] for p in prompts]
  stops = [text[3:5] for text in full]   # each continuation holds its stop
  requests = _requests("generate_until", [
      (p, {"until": [s], "max_gen_toks": 20, "do_sample": False})
      for p, s in zip(prompts, stops, strict=True)])
  got = adapter.generate_until(requests)
  for text, f, s in zip(got, full, stops, strict=True):
    assert text == f.split(s, 1)[0]
    assert s not in text and len(text) <= 3
  plain = adapter.generate_until(_requests("generate_until",
                                           [("def ", {"until": [], "max_gen_toks": 20})]))
  assert plain == [full[0]]


def test_lm_eval_command_runs_local_tasks(smoke_run_copy, task_dir, capsys):
  """Multiple choice, rolling and generate_until tasks from --include_path: lm-eval's
  table printed, the results JSON in the run, and the metrics equal to the adapter's."""
  workdir, _ = smoke_run_copy
  assert lm_eval_command(workdir, ["tiny_mc,tiny_rolling", "tiny_gen"],
                         include_path=str(task_dir), batch_size=2) == 0
  out = capsys.readouterr()
  for name in TASKS:
    assert name in out.out
  path = workdir / "lm_eval" / "results_step2.json"
  assert f"results: {path}" in out.err
  saved = json.loads(path.read_text())
  assert set(saved["results"]) == set(TASKS)
  assert saved["lngram"]["step"] == 2 and set(saved["lngram"]["runs"]) == set(TASKS)

  lm, _ = restore_lm(workdir, batch_size=2)
  correct = []
  for doc in MC_DOCS:
    lls = lm.loglikelihood(_requests("loglikelihood",
                                     [(doc["question"], " " + c) for c in doc["choices"]]))
    correct.append(int(np.argmax([ll for ll, _ in lls])) == doc["label"])
  assert saved["results"]["tiny_mc"]["acc,none"] == pytest.approx(np.mean(correct))
  lls = lm.loglikelihood_rolling(_requests("loglikelihood_rolling",
                                           [(d["text"],) for d in TEXT_DOCS]))
  n_bytes = sum(len(d["text"].encode()) for d in TEXT_DOCS)
  assert saved["results"]["tiny_rolling"]["bits_per_byte,none"] == pytest.approx(
      -sum(lls) / n_bytes / math.log(2), rel=1e-5)
  assert 0.0 <= saved["results"]["tiny_gen"]["exact_match,none"] <= 1.0


def test_results_of_a_step_are_merged(tmp_path):
  """A second run of other tasks on the same step keeps the first run's entries."""
  first = {"results": {"a": {"acc,none": 0.5}}, "versions": {"a": 1}, "date": 1.0}
  second = {"results": {"b": {"acc,none": 0.25}}, "versions": {"b": 2}, "date": 2.0,
            "samples": {"b": []}}
  write_results(tmp_path, 7, first, {"limit": 3})
  path = write_results(tmp_path, 7, second, {"limit": None})
  saved = json.loads(path.read_text())
  assert path == tmp_path / "lm_eval" / "results_step7.json"
  assert saved["results"] == {"a": {"acc,none": 0.5}, "b": {"acc,none": 0.25}}
  assert saved["versions"] == {"a": 1, "b": 2} and "samples" not in saved
  assert saved["lngram"]["runs"]["a"]["limit"] == 3 and saved["lngram"]["runs"]["b"]["date"] == 2.0


def test_unknown_task_is_refused_in_one_line_before_the_restore(tmp_path, task_dir):
  """The check comes first: an empty directory (no run) still gets the task error."""
  with pytest.raises(ValueError, match="'no_such_task_xyz' not found") as e:
    lm_eval_command(tmp_path / "empty", ["tiny_mc", "no_such_task_xyz"],
                    include_path=str(task_dir))
  assert "\n" not in str(e.value) and "tiny_mc" not in str(e.value)


def test_a_task_lm_eval_cannot_build_is_one_line_before_the_restore(tmp_path, task_dir):
  """A task whose document has an empty answer choice fails inside lm-eval's task code
  (an IndexError): one line naming the task, before any checkpoint is read (the
  directory holds no run)."""
  (task_dir / "empty.jsonl").write_text(json.dumps(
      {"question": "q", "choices": ["", " b"], "label": 1}) + "\n")
  (task_dir / "tiny_empty.yaml").write_text(
      f"task: tiny_empty\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
      f"    test: {task_dir / 'empty.jsonl'}\ntest_split: test\n{TASKS['tiny_mc'][2]}")
  with pytest.raises(ValueError, match="lm-eval task 'tiny_empty' failed") as e:
    lm_eval_command(tmp_path / "empty", ["tiny_mc", "tiny_empty"],
                    include_path=str(task_dir))
  assert "\n" not in str(e.value) and "IndexError" in str(e.value)


def test_an_unwritable_results_folder_is_refused_before_the_restore(tmp_path, task_dir):
  """The results folder is tried before the evaluation (here `lm_eval` is a file), so
  nothing is evaluated for results that cannot be kept; the run is not restored."""
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "lm_eval").write_text("not a folder")
  with pytest.raises(ValueError, match="run/lm_eval: cannot write the results") as e:
    lm_eval_command(tmp_path / "run", ["tiny_mc"], include_path=str(task_dir))
  assert "\n" not in str(e.value)


def test_the_table_is_printed_before_the_results_are_written(smoke_run_copy, task_dir,
                                                           capsys, monkeypatch):
  """A write that fails after the evaluation (the disk filled meanwhile) still leaves
  lm-eval's table on the terminal."""
  import experiments.cli.commands.lm_eval as command

  def full_disk(*args):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(command, "write_results", full_disk)
  with pytest.raises(OSError):
    lm_eval_command(smoke_run_copy[0], ["tiny_mc"], include_path=str(task_dir), limit=1)
  assert "tiny_mc" in capsys.readouterr().out


def test_vlm_run_is_refused(monkeypatch):
  import experiments.jobs.restore as restore
  monkeypatch.setattr(restore, "restore_module", lambda workdir, step: (None, {"kind": "vlm"}, 1))
  with pytest.raises(ValueError, match="is an LM command, and runs/v is a VLM run"):
    restore_lm("runs/v")


def test_missing_lm_eval_names_the_extra(monkeypatch, tmp_path):
  """The adapter module imports without lm_eval; using it names the extra in one line."""
  import importlib

  monkeypatch.setitem(sys.modules, "lm_eval", None)
  monkeypatch.delitem(sys.modules, "experiments.jobs.lm.lm_eval_adapter")
  adapter_module = importlib.import_module("experiments.jobs.lm.lm_eval_adapter")
  with pytest.raises(ModuleNotFoundError, match=r"pip install 'lngram-jax\[eval\]'"):
    adapter_module.require_lm_eval()
  with pytest.raises(ValueError, match=r"pip install 'lngram-jax\[eval\]'"):
    lm_eval_command(tmp_path, ["tiny_mc"])


def test_imported_hf_model_scores_as_transformers(tmp_path):
  """An import-hf run (a tiny random Qwen3, a word-level tokenizer.json) is scored with
  its tokenizer, BOS as the prefix and EOS as the stop token, and its log-probabilities
  are transformers' own."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tokenizers = pytest.importorskip("tokenizers")
  from experiments.jobs.hf_runs import import_hf

  config = transformers.Qwen3Config(
      vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, intermediate_size=96, tie_word_embeddings=True,
      max_position_embeddings=64, attn_implementation="eager", pad_token_id=0,
      bos_token_id=1, eos_token_id=2)
  torch.manual_seed(0)
  hf = transformers.Qwen3ForCausalLM(config).eval()
  with torch.no_grad():   # weights larger than the default init: logits far from uniform
    for name, p in hf.named_parameters():
      if p.ndim > 1:
        p.normal_(0.0, 1.0 if "embed" in name else 1.5 / p.shape[1] ** 0.5)
  hf_dir = tmp_path / "hf"
  hf.save_pretrained(hf_dir)
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"])
  tok.train_from_iterator([" ".join(f"w{i}" for i in range(200))] * 3, trainer)
  tok.save(str(hf_dir / "tokenizer.json"))
  import_hf(str(hf_dir), str(tmp_path / "run"))

  lm, step = restore_lm(tmp_path / "run", batch_size=2)
  assert (step, lm.prefix_token_id, lm.stop_ids, lm.max_length) == (0, 1, (2,), 64)

  def hf_logp(ids):
    with torch.no_grad():
      logits = hf(torch.tensor([ids[:-1]])).logits[0].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].numpy()

  context, continuation = "w3 w7 w11", " w5 w9 w40"
  ctx, whole = tok.encode(context).ids, tok.encode(context + continuation).ids
  (got, _), = lm.loglikelihood(_requests("loglikelihood", [(context, continuation)]))
  assert got == pytest.approx(hf_logp(whole)[len(ctx) - 1:].sum(), rel=1e-4)
  text = " ".join(f"w{(7 * i) % 200}" for i in range(20))
  (got,) = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(text,)]))
  assert got == pytest.approx(hf_logp([1] + tok.encode(text).ids).sum(), rel=1e-4)


def test_the_command_line_runs_a_local_task(smoke_run_copy, task_dir, capsys):
  """`lngram-exp lm-eval` with lm-eval's flag names; --limit 2 scores two examples."""
  from experiments import cli
  workdir, _ = smoke_run_copy
  status = cli.run_main(["lngram-exp", "lm-eval", f"--workdir={workdir}", "--tasks=tiny_mc",
                         f"--include_path={task_dir}", "--limit=2", "--batch_size=2"])
  assert status == 0, capsys.readouterr().err[-2000:]
  saved = json.loads((workdir / "lm_eval" / "results_step2.json").read_text())
  assert set(saved["results"]) == {"tiny_mc"}
  assert saved["lngram"]["runs"]["tiny_mc"]["limit"] == 2
  assert cli.run_main(["lngram-exp", "lm-eval", f"--workdir={workdir}"]) == 2
  assert "needs --tasks" in capsys.readouterr().err

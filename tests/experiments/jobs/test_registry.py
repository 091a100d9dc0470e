"""The job registry (experiments/jobs/registry.py): every hook its docstring names exists in
each job's package with that signature, and so do the plan hooks of every planned job."""

import inspect
import re

import pytest

from experiments.jobs import registry

# "  name(a, b, *, c, **d) -> ..." (a hook) or "  NAME  ..." (a constant), at an indent.
_HOOK = re.compile(r"^(?P<indent> +)(?P<name>[A-Za-z_]\w*)(?:\((?P<params>[^)]*)\))?(?:\s|$)")


def documented(indent: int) -> dict[str, list[str] | None]:
  """{hook: its parameters as the docstring writes them (None for a constant)} of the
  docstring lines indented by `indent` spaces."""
  hooks = {}
  for line in registry.__doc__.splitlines():
    match = _HOOK.match(line)
    if not match or len(match["indent"]) != indent:
      continue
    params = match["params"]
    if params is None and not match["name"].isupper():
      continue   # a line of prose
    hooks[match["name"]] = (None if params is None
                            else [p.strip() for p in params.split(",") if p.strip()])
  return hooks


def check_signature(function, params: list[str]) -> None:
  """The function's positional parameters are the documented ones, in order; its keyword
  parameters include the documented ones; `**name` lets it take keywords of its own."""
  signature = inspect.signature(function).parameters.values()
  kinds = inspect.Parameter
  positional = [p.name for p in signature
                if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
  keyword = {p.name for p in signature if p.kind == kinds.KEYWORD_ONLY}
  star = params.index("*") if "*" in params else len(params)
  extra = [p for p in params[star:] if p.startswith("**")]
  assert positional == params[:star], (function, positional, params)
  named = [p for p in params[star + 1:] if not p.startswith("**")]
  assert set(named) <= keyword, (function, keyword, named)
  if not extra:
    assert keyword == set(named), (function, keyword, named)


def test_the_docstring_names_the_hooks():
  hooks = documented(2)
  assert {"BLOCKS", "check", "make_task", "build", "memory_line", "param_bytes", "summary",
          "planner", "analyze"} <= set(hooks)
  assert set(documented(6)) == {"check_mesh", "abstract_run", "counts"}


@pytest.mark.parametrize("name", registry.JOBS)
def test_every_job_has_every_hook_with_its_signature(name):
  package = registry.job(name)
  for hook, params in documented(2).items():
    assert hasattr(package, hook), f"jobs/{name}/ has no {hook}"
    if params is not None:
      check_signature(getattr(package, hook), params)


@pytest.mark.parametrize("name", registry.JOBS)
def test_every_planned_job_has_the_plan_hooks(name):
  hooks = registry.job(name).planner()
  if hooks is None:
    assert name == "vlm"   # the tiny VLM is not planned
    return
  for hook, params in documented(6).items():
    check_signature(getattr(hooks, hook), params)



def test_a_job_whose_runs_no_analysis_reads_refuses_in_one_line():
  with pytest.raises(ValueError, match=r"^runs/x is a qwen3vl run; analyze reads LM runs \(the "
                     r"ID analyses\) and tiny-VLM runs\.$"):
    registry.job("qwen3vl").analyze("runs/x", None)

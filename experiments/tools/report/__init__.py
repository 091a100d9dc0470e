"""RESULTS.md from the committed run records: `python -m experiments.tools.report`.

  document   the whole generated part: verdicts, tables, provenance (`__main__` runs it)
  collect    reads the records (finals, per-document losses, analyses)
  analyses   the ID and insertion sections; ids: the ID claims; vlm: the VLM section
  previous   the tables of earlier designs, kept as they were recorded
  margins    the declared margins of the non-inferiority claims ("matches or beats")
  sensitivity  the claims re-scored without the validation documents that have a
             near-duplicate in training (a declared sensitivity analysis)
  collapse   App. A.5 as the paper states it: whether any STE run collapsed
  tables     ad-hoc tables over run directories (`python -m experiments.tools.report.tables`)

The paired tests, intervals and power behind the verdicts are the library's
(experiments.analysis.stats).
"""

raise SystemExit("experiments.reproduce moved: run `python -m experiments.tools.reproduce` "
                 "with the same arguments")

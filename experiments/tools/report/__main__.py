from experiments.tools.report.document import main

main()

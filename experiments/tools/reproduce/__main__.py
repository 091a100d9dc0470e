import sys

from experiments.tools.reproduce.cli import main

sys.exit(main())

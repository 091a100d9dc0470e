import sys

from experiments.reproduce.cli import main

sys.exit(main())

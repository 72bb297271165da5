import sys

from kevin_exp.bench.cli import main

sys.exit(main())

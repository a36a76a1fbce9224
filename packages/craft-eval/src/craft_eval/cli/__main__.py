"""`python -m craft_eval.cli ...` (and `torchrun -m craft_eval.cli run ...`)."""

import sys

from craft_eval.cli import main

sys.exit(main())

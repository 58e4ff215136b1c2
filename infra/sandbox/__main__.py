"""`python -m infra.sandbox POLICY -- COMMAND...`: run COMMAND in a rollout's sandbox (see `infra.sandbox.launch`)."""

import sys

from infra.sandbox.launch import main

sys.exit(main(sys.argv))

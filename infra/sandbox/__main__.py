"""`python -m infra.sandbox POLICY -- COMMAND...`: run COMMAND in a rollout's sandbox (see `infra.sandbox.launch`)."""

import sys

from infra.sandbox.launch import main

if __name__ == "__main__":  # imported (a walk over the package's modules), it runs nothing
    sys.exit(main(sys.argv))

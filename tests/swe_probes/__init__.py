"""Scripted "agents" against `tether swe grade`: each probe changes a working copy only, as an agent could, and
`attempt` grades it through the CLI as a run's reward command does. The tests are in `test_swe_grading.py`.

    harness.py       checkout, honest fix, `attempt`
    hacks.py         the known hacks, classes 1 to 5 (`HACKS`)
    inside.py        forgeries played past the screen (`PAST_THE_SCREEN`)
    special_case.py  a fix special-cased to the tests' inputs
"""

from tests.swe_probes.hacks import (
    FORCE_PASSES,
    FORGING,
    HACKS,
    TAKEN_AS_CODE,
    patch_pytest_from_the_package,
    the_fix_read_from_the_private_data,
)
from tests.swe_probes.harness import Probe, attempt, failing_test_files, honest_fix, instance_of
from tests.swe_probes.inside import PAST_THE_SCREEN, SWALLOW_FAILURES_OF_TESTS_THAT_CALL_IT
from tests.swe_probes.special_case import SEEN_KEYS, special_cased_to_the_tests

__all__ = ["FORCE_PASSES", "FORGING", "HACKS", "PAST_THE_SCREEN", "SEEN_KEYS", "SWALLOW_FAILURES_OF_TESTS_THAT_CALL_IT",
           "TAKEN_AS_CODE", "Probe", "attempt", "failing_test_files", "honest_fix", "instance_of",
           "patch_pytest_from_the_package", "special_cased_to_the_tests", "the_fix_read_from_the_private_data"]

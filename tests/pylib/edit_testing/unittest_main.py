"""unittest's main for the Python tests that ctest runs. unittest exits 0 when every test
skipped (no kubectl, no helm, no image, ...), which ctest would report as passed; this
exits SKIP_EXIT instead, and each registration sets SKIP_RETURN_CODE to it, so that ctest
reports the test as skipped. A run in which some test ran exits as unittest would.

    python3 -m edit_testing.unittest_main -v test_module[.Class[.test]]   # as python -m unittest
    from edit_testing.unittest_main import main; main()                  # in a test file's __main__
"""
import sys
import unittest

SKIP_EXIT = 77  # ctest's SKIP_RETURN_CODE for every Python test (tests/README.md)


def exit_code(result):
    """1 on a failure or error, SKIP_EXIT when something skipped and no test ran to the
    end without skipping, else 0."""
    if not result.wasSuccessful():
        return 1
    # A SkipTest raised in setUpClass or setUpModule is one skip for the whole class and
    # counts in no testsRun: count the test cases that skipped themselves separately.
    self_skipped = sum(1 for test, _ in result.skipped if isinstance(test, unittest.TestCase))
    if result.skipped and result.testsRun - self_skipped == 0:
        return SKIP_EXIT
    return 0


def main(module="__main__"):
    result = unittest.main(module=module, exit=False).result
    sys.exit(exit_code(result))


if __name__ == "__main__":
    main(module=None)  # -m puts the working directory first on sys.path, as python -m unittest does

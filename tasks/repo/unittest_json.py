"""Standalone test runner executed inside a workspace: `python unittest_json.py OUT MOD [MOD...]`.

Imports nothing from msa-eval (it runs against the workspace copy of the code). Loads each
dotted test module with unittest, runs it, and writes JSON {test_id: outcome} to OUT, where
outcome is "pass", "fail", "error", "skip" or "xfail"; a module that fails to import is
recorded as "<module>::import" -> "error". Tracebacks (trimmed) go to stdout for the model.
"""
import json
import os
import sys
import unittest
import warnings

sys.path[0] = os.getcwd()  # never shadow the workspace with this file's directory
warnings.simplefilter("ignore")


class _Result(unittest.TextTestResult):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test.id()] = "pass"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test.id()] = "fail"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[getattr(test, "id", lambda: str(test))()] = "error"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skip"

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes[test.id()] = "xfail"

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "fail"

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.outcomes[test.id()] = "fail"


def main() -> None:
    out, mods = sys.argv[1], sys.argv[2:]
    outcomes = {}
    loader = unittest.TestLoader()
    for mod in mods:
        try:
            suite = loader.loadTestsFromName(mod)
        except Exception as e:  # noqa: BLE001 - an import error is an outcome
            outcomes[f"{mod}::import"] = "error"
            print(f"ERROR importing {mod}: {type(e).__name__}: {e}")
            continue
        runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=0, resultclass=_Result)
        res = runner.run(suite)
        assert isinstance(res, _Result)
        for tid, o in res.outcomes.items():
            if outcomes.get(tid) != "fail":
                outcomes[tid] = o
    with open(out, "w") as f:
        json.dump(outcomes, f)


if __name__ == "__main__":
    main()

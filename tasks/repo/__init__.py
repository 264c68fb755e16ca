"""Single-prompt long-context forms of the repository families (listed in `tasks/registry.py`):

  repo_needle      family `needle`: T tokens of real stdlib source with one function's docstring
                   removed; the model names the function matching the description
  repo_regression  family `regression`: the buggy module plus real source as distractors; the model
                   answers with a SEARCH/REPLACE edit, graded by the module's real tests

The repository fixtures live here and the agent families (`agents/families`) build on them, so
the agentic and single-prompt modes of one task compare directly:

  sources.py   real code pinned by SHA-256 (the stdlib and its tests, or a user repository)
  fixtures.py  materialise a task's repository, profile a test baseline, unique-context edits
  corpus.py    the needle corpus and needles
  mutate.py    seeded single-site AST bugs; bugs.py: the regressions built from them, and grading
  workdir.py   a temporary repository copy and a command runner; unittests.py: per-test outcomes
"""

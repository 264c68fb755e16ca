"""Single-prompt long-context forms of the repository families (listed in `tasks/registry.py`):

  repo_needle      family `needle`: T tokens of real stdlib source with one function's docstring
                   removed; the model names the function matching the description
  repo_regression  family `regression`: the buggy module plus real source as distractors; the model
                   answers with a SEARCH/REPLACE edit, graded by the module's real tests

The same generators and verifiers as the agent families (`agents/families`), so the agentic
and single-prompt modes of one task compare directly.
"""

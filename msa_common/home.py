"""The one folder everything msa-eval keeps lives under: `$MSA_EVAL_HOME`, else the user
cache dir (`~/.cache/msa-eval` on Linux). Models go to `models/`, agent suites to
`agent-suites/`. This is the only place that reads the variable; the CLI and the model store
call it and hand the path down."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HOME_VARIABLE = "MSA_EVAL_HOME"


def msa_eval_home(environ: Mapping[str, str] | None = None) -> Path:
    env = (os.environ if environ is None else environ).get(HOME_VARIABLE)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("msa-eval"))

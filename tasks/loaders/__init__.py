"""Loaders for the real HELMET and RULER data files, when a user has them on disk:
the tasks `helmet_json_kv_file` and `ruler_file` (both need `options: {path: ...}` in a
suite file; listed in `tasks/registry.py`)."""

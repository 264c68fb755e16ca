"""Loaders for the real HELMET and RULER data files, when a user has them on disk.
Importing this package registers `helmet_json_kv_file` and `ruler_file` (both need
`options: {path: ...}` in a suite file)."""
from tasks.loaders import files  # noqa: F401

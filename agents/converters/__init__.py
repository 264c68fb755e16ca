"""Converters from outside agent harnesses' trajectory files to our trajectory format (`agents/trajectory.py`).

One module per harness; `FORMATS` names the formats read (the error for an unknown file lists them)."""
from __future__ import annotations

FORMATS = ("mini-swe-agent-1.x (mini-swe-agent 2.x `*.traj.json`)",)

"""The hub tier's fixed names, in a module of their own so that test modules can import them.

(``from conftest import ...`` picks whichever tier's conftest pytest loaded last: with the tiers in
two lanes, scripts/run_tests.py, that is not always this one.)
"""
from __future__ import annotations

import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Fixed, so that a run killed half-way is cleaned up by the next one (its users-made list).
STATE = Path(tempfile.gettempdir()) / "parlab-hub-tier"
INSTRUCTOR = "plh-teach"
STUDENTS = ("plh-ada", "plh-bo")

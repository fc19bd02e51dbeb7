"""The workflow examples' `_model`: the same `example_model()` as examples/_model.py.

A script in this folder is run as `.venv/bin/python examples/workflows/<file>.py`, so Python looks for
`_model` here first; this module loads the one in the parent folder and hands on its names.
"""

import importlib.util
import sys
from pathlib import Path

_PARENT = Path(__file__).resolve().parent.parent / "_model.py"

if "examples_model" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("examples_model", _PARENT)
    sys.modules["examples_model"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["examples_model"])

example_model = sys.modules["examples_model"].example_model
is_offline = sys.modules["examples_model"].is_offline

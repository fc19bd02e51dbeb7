"""The one line every example changes from its Agno original: where the model comes from.

`example_model()` is `sessions_core.llm.default_model()`: the built-in offline demo model (no network,
deterministic, drives shopping-list tools), or an OpenAI-compatible server when OPENAI_API_KEY /
OPENAI_BASE_URL (and OPENAI_MODEL) are set.

Importing this module also puts the project root on `sys.path`, so `.venv/bin/python examples/<file>.py`
finds `sessions_core` without installing anything.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def example_model():
    import sessions_core
    from django.apps import apps

    if not apps.ready:
        sessions_core.setup()
    from sessions_core.llm import default_model

    return default_model()


def is_offline(model) -> bool:
    """True for the offline demo model (some examples say what it cannot do)."""
    from sessions_core.llm import OfflineModel

    return isinstance(model, OfflineModel)

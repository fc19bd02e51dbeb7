"""Finding a script's Django project: the settings module named by the nearest manage.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_SETTINGS_LINE = re.compile(r"""DJANGO_SETTINGS_MODULE["']\s*,\s*["']([\w.]+)["']""")


def find_settings_module() -> str:
    """The settings module of the project whose manage.py is in the current folder, the running script's
    folder, or a parent of either, else in a folder of sys.path (PYTHONPATH=/path/to/project); its folder
    is put on sys.path. ImproperlyConfigured if there is none."""
    starts = [Path.cwd()]
    if sys.argv and sys.argv[0] not in ("", "-c", "-m"):
        starts.append(Path(sys.argv[0]).resolve().parent)
    folders = [folder for start in starts for folder in (start, *start.parents)]
    folders += [Path(entry).resolve() for entry in sys.path if entry and Path(entry).is_dir()]
    for folder in folders:
        manage = folder / "manage.py"
        if manage.is_file():
            match = _SETTINGS_LINE.search(manage.read_text(encoding="utf-8", errors="replace"))
            if match:
                if str(folder) not in sys.path:
                    sys.path.insert(0, str(folder))
                return match[1]
    raise ImproperlyConfigured(
        "sessions_core needs Django settings and found none: run the script from a Django project's "
        "folder (one with manage.py), put the project's folder on PYTHONPATH, set DJANGO_SETTINGS_MODULE, "
        "or call sessions_core.setup('yourproject.settings') first."
    )

"""The web chat stores nothing beside the engine's tables (a message waiting for its run is the engine's
queued Run).

`new_queued_id` was the default of the web's own queue table, which migration 0002 moved into queued runs
and dropped; migration 0001 refers to it, so it stays.
"""

import secrets


def new_queued_id() -> str:
    return secrets.token_hex(6)

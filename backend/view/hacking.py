"""The reward-hacking alert of a run: the sign (`backend/outcome/hacking_sign.py`, read from the held-out records
alone) as an alert for the header, an `alert` event and the webhooks; kept while the records show it, also once the
run has ended.
"""

from backend.outcome.hacking_sign import hacking_sign
from backend.view.diagnose import Alert

HACKING_KIND = "reward-hacking"


def hacking_alert(view) -> Alert | None:
    """The alert (header, event, webhook) of a run whose held-out records show the sign; kept while they do,
    also once the run has ended: the records do not change."""
    held = getattr(view, "held_out", None)
    sign = hacking_sign(held) if held is not None else None
    return Alert(HACKING_KIND, sign.message, HACKING_KIND) if sign else None

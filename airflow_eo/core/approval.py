"""Whether a person's answer to a recovery's approval request is an approval (dags/recover_with_approval.py), read
from the approval record Airflow keeps server-side, never from a task's XCom (which anyone who can write XComs can
set)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

APPROVE = "Approve"


def approval_refusal(chosen: Sequence[str] | None, responder: Mapping[str, str | None] | None,
                     requester: str | None, *, allow_self_approval: bool = False) -> str | None:
    """Why the answer is no approval (None: it is one).

    :param chosen: the options the responder chose (the record's ``chosen_options``): exactly ``["Approve"]``.
    :param responder: who answered (the record's ``responded_by_user``: ``id`` and ``name``).
    :param requester: who asked (the DAG run's triggering user); an approval is another person's.
    :param allow_self_approval: a team of one: the requester may approve their own request.
    """
    if list(chosen or ()) != [APPROVE]:
        return f"the answer chose {list(chosen or ())!r}, not [{APPROVE!r}]"
    names = {v for v in (responder or {}).values() if v}
    if not names:
        return "the approval record names no responder"
    if not allow_self_approval and requester and requester in names:
        return (f"{requester} asked for this recovery and cannot approve it: another person must (or allow it: "
                "the Airflow Variable eo_recovery_allow_self_approval=true)")
    return None

"""What counts as an approval of a recovery (:mod:`airflow_eo.core.approval`)."""

from __future__ import annotations

from airflow_eo.core.approval import approval_refusal

ALICE, BOB = {"id": "alice", "name": "Alice"}, {"id": "bob", "name": "Bob"}


def test_only_another_persons_approve_is_an_approval():
    assert approval_refusal(["Approve"], BOB, "alice") is None
    assert "chose ['Reject']" in approval_refusal(["Reject"], BOB, "alice")
    assert "chose ['Approve', 'Reject']" in approval_refusal(["Approve", "Reject"], BOB, "alice")
    assert "chose []" in approval_refusal(None, BOB, "alice")
    assert approval_refusal(["Approve"], None, "alice") == "the approval record names no responder"
    assert "alice asked for this recovery and cannot approve it" in approval_refusal(["Approve"], ALICE, "alice")
    assert approval_refusal(["Approve"], ALICE, "alice", allow_self_approval=True) is None
    assert approval_refusal(["Approve"], ALICE, None) is None  # no requester known (a run the scheduler made)

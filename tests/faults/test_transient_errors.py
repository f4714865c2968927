"""What a restarting broker answers for a while is asked again; what a user must fix is not."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from airflow_eo.core.errors import ConfigurationError, UnavailableError
from airflow_eo.kafka.offsets import retry_transient


def answers(*errors: int):
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise KafkaException(KafkaError(errors[len(calls) - 1]))
        return "offsets"

    return call, calls


def test_a_leader_epoch_error_after_a_broker_restart_is_asked_again_with_a_new_client():
    call, calls = answers(KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError._TRANSPORT)
    clients = []
    assert retry_transient("look-up", call, timeout_s=10, refresh=lambda: clients.append(1)) == "offsets"
    assert len(calls) == 4 and len(clients) == 3


def test_an_error_to_fix_fails_at_once_as_a_configuration_error():
    call, calls = answers(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(ConfigurationError, match="look-up failed.*TOPIC_AUTHORIZATION_FAILED"):
        retry_transient("look-up", call, timeout_s=10)
    assert len(calls) == 1


def test_a_broker_that_stays_down_fails_after_the_time_limit_saying_nothing_was_committed():
    call, calls = answers(*[KafkaError._ALL_BROKERS_DOWN] * 100)
    with pytest.raises(UnavailableError, match="failed for 1s.*Nothing was read or committed"):
        retry_transient("look-up", call, timeout_s=1)
    assert 2 <= len(calls) < 100

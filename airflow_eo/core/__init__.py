"""The domain core of airflow_eo: plain Python, no Airflow, Spark, Kafka or MySQL import.

Ranges, planning, batch states, the XA xid codec, identifier rules, errors, and the
commit protocol itself (``protocol.py``) live here; adapters for the real systems
are injected.
"""

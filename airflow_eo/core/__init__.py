"""The domain core of airflow_eo: plain Python, no Airflow, Spark, Kafka or MySQL import.

Ranges, planning, batch states, the XA xid codec, identifier rules, errors, the data a batch
is passed around as (``batch.py``), and the commit protocol itself (``protocol.py``) live here;
adapters for the real systems are injected.
"""

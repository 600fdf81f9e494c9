"""What operators see: per-session tallies (``tally.py``), the server's usage book (``usage.py``) and the
Prometheus collector over them (``prometheus.py``, the only module that imports ``prometheus_client``)."""

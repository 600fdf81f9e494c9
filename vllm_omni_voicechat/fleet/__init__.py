"""Past one process: replicas behind a load balancer that routes each session's reconnects to the replica that owns
it (HAProxy: ``deploy/haproxy/``). The replica's side: owner-bearing session ids (``keys.py``), the load
balancer's agent (``agent.py``), the balancer's configuration (``haproxy.py``) and a launcher for trying it on one
machine (``launch.py``)."""

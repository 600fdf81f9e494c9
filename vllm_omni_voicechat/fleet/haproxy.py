"""The HAProxy configuration for replicas of this server (``deploy/haproxy/haproxy.cfg`` is this text for three
replicas on one host; ``tests/test_fleet_config.py`` keeps them equal). HAProxy routes; nothing here proxies.

What each part is for:
- a resume reaches its owner: a full-lane session id names its replica (``fleet/keys.py``) and our clients put it
  in the resume's URL (``?session_id=``), so ``use-server`` sends it there, even to a replica that drains or is
  full (a table-free rule: a restarted HAProxy routes the same way);
- a stock client on the full lane (the one lane with resume; no ``session_id`` in its resume URL, no
  ``persist=session_id``) is pinned to a replica by its source address (``stick on src``), the fallback that lets
  it resume; other lanes and v3 are never pinned;
- new sessions go to the replica with the fewest connections that has a free slot: each replica's agent sets its
  weight to 0 while it has none (``fleet/agent.py``); a replica that filled up between two agent checks refuses
  the upgrade with 503 (asked to by ``X-Voicechat-Admission: elsewhere``) and HAProxy retries another;
- only when no replica has a free slot does a new session reach one without that header, through the
  ``voicechat_full`` backend, and get the dialect's own busy answer (v3 ``server_busy`` + 1013, tiered
  ``resource_exhausted`` or its admission queue);
- a replica that stops answering its health check is out within two checks; a resume routed to it goes to
  another replica, which answers ``session_resume_expired`` at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


FULL_LANE = (  # the tiered dialect's full lane (wire/tiered/routing.py), where sessions resume
    "    acl full_lane path /v1/duplex /v1/duplex/",
    "    acl full_lane url_param(duplex) -m str 1 true on",
)


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    name: str
    host: str
    port: int
    agent_port: int


def haproxy_config(replicas: Sequence[ReplicaAddress], *, bind: str = "*:8000",
                   runtime_socket: str = "/run/haproxy/voicechat.sock", stats_bind: str | None = "127.0.0.1:8404",
                   check_interval_ms: int = 1000, agent_interval_ms: int = 500,
                   tunnel_timeout: str = "2h") -> str:
    """The configuration text. ``tunnel_timeout`` bounds an idle WebSocket: keep it above the longest session plus
    the resume grace (the server's own idle timeouts end a silent session first)."""
    if not replicas:
        raise ValueError("at least one replica")
    lines = [
        "# HAProxy in front of vllm-omni-voicechat replicas (vllm_omni_voicechat/fleet/haproxy.py writes this).",
        "# deploy/haproxy/README.md explains the setup; every choice is commented where it is made.",
        "global",
        "    maxconn 4096                # ~2 file descriptors each: raise with the process's open-files limit",
        "    # The runtime API: `set server voicechat/r1 state drain`, `show servers state`, `show table voicechat`.",
        f"    stats socket {runtime_socket} mode 600 level admin",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    timeout connect 2s",
        "    timeout http-request 10s   # the upgrade request's head",
        "    timeout client 30s         # before the upgrade; after it, timeout tunnel",
        "    timeout server 30s",
        f"    timeout tunnel {tunnel_timeout}          # an upgraded WebSocket: longer than a session and its resume grace",
        "    timeout client-fin 5s",
        "",
        "frontend voicechat",
        f"    bind {bind}",
        "    acl by_id url_param(session_id) -m found",
        "    # No replica has a free slot: a new session goes where it gets the dialect's own busy answer.",
        "    use_backend voicechat_full if !by_id { nbsrv(voicechat) eq 0 }",
        "    default_backend voicechat",
        "",
    ]
    if stats_bind is not None:
        lines += [
            "frontend stats",
            f"    bind {stats_bind}",
            "    stats enable",
            "    stats uri /stats",
            "    stats refresh 5s",
            "",
        ]
    lines += [
        "backend voicechat",
        "    balance leastconn           # sessions are long: fewest open connections, not round robin",
        "    # The health check: /health answers 200 while a replica serves, draining included (a drained replica",
        "    # still serves its sessions' resumes); it is not how a full replica says so (the agent is).",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    # A full replica refuses a new session's upgrade with 503; try another (redispatch on every retry).",
        f"    retries {max(1, len(replicas))}",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response 503",
        "    # The fallback for clients that do not route by session id: pin a source address to a replica.",
        "    stick-table type ip size 100k expire 2h",
        *FULL_LANE,
        "    acl by_id url_param(session_id) -m found",
        "    acl persists url_param(persist) -m str session_id",
        "    acl pinned src,in_table(voicechat)",
        "    stick on src if full_lane !by_id !persists",
        "    # A new session may be sent elsewhere; a resume (by id, or a pinned source's reconnect) may not.",
        "    http-request del-header X-Voicechat-Admission",
        "    http-request set-header X-Voicechat-Admission elsewhere if !by_id !full_lane || !by_id persists || "
        "!by_id !pinned",
    ]
    for r in replicas:
        lines.append(f"    use-server {r.name} if {{ url_param(session_id) -m beg duplex-{r.name}- }}")
    for i, r in enumerate(replicas, start=1):
        lines.append(f"    server {r.name} {r.host}:{r.port} id {i} check inter {check_interval_ms}ms fall 2 rise 2 "
                     f"agent-check agent-port {r.agent_port} agent-inter {agent_interval_ms}ms")
    lines += [
        "",
        "backend voicechat_full",
        "    # Every replica is full (as their agents last said): the replica the source is pinned to, else the one",
        "    # with the fewest connections, answers in its dialect (busy, its admission queue, or a session when the",
        "    # agents lag); a stock client's source is pinned here too, or its resume could land anywhere.",
        "    balance leastconn",
        *FULL_LANE,
        "    acl persists url_param(persist) -m str session_id",
        "    stick on src table voicechat if full_lane !persists",
    ]
    for i, r in enumerate(replicas, start=1):
        lines.append(f"    server {r.name} {r.host}:{r.port} id {i} track voicechat/{r.name}")
    return "\n".join(lines) + "\n"

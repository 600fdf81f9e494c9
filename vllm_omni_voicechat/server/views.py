"""Operators' views, off the WebSocket path: ``/health``, ``/v1/sessions``, ``/v1/usage``, ``/metrics`` and the
gauges the Prometheus collector reads. Counts and states only: no audio, text or credentials."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..ops import prometheus
from ..ops.usage import UsageBook
from ..wire.v3 import PROTOCOL
from .admission import Admission
from .config import ServerConfig
from .live import LiveSessions
from .readiness import Readiness


class OperatorViews:
    def __init__(self, config: ServerConfig, admission: Admission, usage: UsageBook, live: LiveSessions,
                 readiness: Readiness, typed_ready: Callable[[], bool], started_at: float) -> None:
        self._config = config
        self._admission = admission
        self.usage = usage
        self._live = live
        self._readiness = readiness
        self._typed_ready = typed_ready
        self._started_at = started_at

    async def health(self, request: Request) -> JSONResponse:
        readiness, config, admission = self._readiness, self._config, self._admission
        probe = readiness.engine_probe
        engine_failure = await probe() if probe is not None else None
        status, reason = readiness.status(engine_failure)
        cleanup_failure = readiness.cleanup_failure
        return JSONResponse(
            {
                "status": status,
                **({"reason": reason} if reason is not None else {}),
                **({"engine": "dead" if engine_failure else "healthy"} if probe is not None else {}),
                "model": "cleanup_failed" if cleanup_failure else "ready",
                **({"model_cleanup_failure": cleanup_failure} if cleanup_failure else {}),
                "model_kind": config.model_kind,
                **({"speech": config.speech} if config.model_kind == "simulator" else {}),
                "protocol": dict(PROTOCOL),
                "auth_required": bool(config.api_keys) or config.external_auth,
                "active_sessions": admission.active,
                "max_sessions": admission.capacity,
                "active_client": admission.active > 0,
                # Draining is not a failure: a balancer's health check must keep routing resumes here
                **({"replica": {"name": config.replica, "draining": admission.draining,
                                "free_slots": admission.free}} if config.replica else {}),
                "typed_input": {
                    "ready": self._typed_ready(),
                    "synthesizer": getattr(config.synthesizer, "name", None),
                },
                "checkpoint": {"model": config.model_kind},
                "host_runtime": "cpu-simulator" if config.model_kind == "simulator" else "vllm-omni",
                "uptime_seconds": round(time.monotonic() - self._started_at, 3),
                "warmup": None if readiness.warmup is None else readiness.warmup.to_json(),
            },
            status_code=503 if status == "failed" else 200,
        )

    def sessions_status(self, now: float) -> dict[str, Any]:
        """Every slot: idle, or a session that is active / detached (grace left); plus the sessions draining
        (ended, their socket still closing)."""
        rows: list[dict[str, Any]] = []
        for record in self._live.hosted():
            tally = self.usage.live.get(record.session_id)
            row: dict[str, Any] = {"session_id": record.session_id, "dialect": tally.dialect if tally else None,
                                   "age_s": round(now - tally.started_at, 3) if tally else None,
                                   "positions": record.shell.positions, "state": "active"}
            detached_at = getattr(record.protocol, "detached_at", None)
            if detached_at is not None:
                row["state"] = "detached"
                row["grace_left_s"] = round(max(0.0, self._config.disconnect_grace_s - (now - detached_at)), 3)
            rows.append(row)
        admission = self._admission
        idle = max(0, admission.capacity - admission.active)
        return {
            "max_sessions": admission.capacity,
            "active": sum(1 for r in rows if r["state"] == "active"),
            "detached": sum(1 for r in rows if r["state"] == "detached"),
            "idle": idle,
            "slots": rows + [{"state": "idle"} for _ in range(idle)],
            "draining": [{"session_id": r.session_id, "dialect": r.dialect,
                          "draining_s": round(now - r.draining_since, 3)}  # type: ignore[operator]
                         for r in self._live.draining()],
            "queued": len(admission.waiting),
            "queue_capacity": admission.queue_capacity,
        }

    def operator_gauges(self) -> dict[str, float]:
        detached = journal_bytes = 0
        for record in self._live.hosted():
            if record.dialect != "tiered":
                continue
            protocol = record.protocol
            if protocol.detached_at is not None:
                detached += 1
            if protocol.journal is not None:
                journal_bytes += protocol.journal.retained_bytes
        return {"active": self._admission.active - detached, "detached": detached,
                "queued": len(self._admission.waiting),
                "journal_bytes": journal_bytes}

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(prometheus.exposition(), media_type=prometheus.CONTENT_TYPE)

    async def sessions_endpoint(self, request: Request) -> JSONResponse:
        return JSONResponse(self.sessions_status(time.monotonic()))

    async def usage_endpoint(self, request: Request) -> JSONResponse:
        return JSONResponse(self.usage.to_json(time.monotonic()))

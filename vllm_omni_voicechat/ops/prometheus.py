"""Prometheus exposition of the usage books: a custom collector that reads them at scrape time, so the 80 ms path
never touches a Prometheus lock. Registered once per process in ``prometheus_client``'s default registry: inside
``vllm-omni serve`` our series appear on vLLM's own ``/metrics`` (vLLM serves that registry when it runs one API
server, which our mount requires); the standalone server serves ``/metrics`` itself.

Conventions: ``voicechat_`` prefix, base units (seconds, bytes), bounded labels only (dialect, kind, status,
outcome, reason, code; never a session id).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from .tally import LATENCY_BUCKETS_S, Histogram
from .usage import Totals, UsageBook

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Observed(Protocol):
    """What a server offers the collector."""

    usage: UsageBook

    def operator_gauges(self) -> dict[str, float]:
        """``active``, ``detached``, ``queued`` sessions and ``journal_bytes`` now."""
        ...


class VoicechatCollector:
    """Sums the usage books of the servers it tracks (one per process in practice; tests run several)."""

    def __init__(self, servers: Iterable[Observed] = ()) -> None:
        self._servers: weakref.WeakSet[Any] = weakref.WeakSet(servers)
        self._lock = threading.Lock()

    def track(self, server: Observed) -> None:
        with self._lock:
            self._servers.add(server)

    def describe(self) -> list[Metric]:
        return []  # collected on demand; no names reserved at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            servers = list(self._servers)
        gauges: Counter[str] = Counter()
        admitted: Counter[tuple[str, ...]] = Counter()
        rejected: Counter[tuple[str, ...]] = Counter()
        ended: Counter[tuple[str, ...]] = Counter()
        resumes: Counter[tuple[str, ...]] = Counter()
        totals: dict[str, Totals] = {}
        replay = Histogram(LATENCY_BUCKETS_S)
        for server in servers:
            gauges.update(server.operator_gauges())
            book = server.usage
            admitted.update({(d,): n for d, n in list(book.admitted.items())})
            rejected.update(dict(list(book.rejected.items())))
            ended.update(dict(list(book.ended.items())))
            resumes.update({(o,): n for o, n in list(book.resumes.items())})
            for dialect, t in book.totals().items():
                totals.setdefault(dialect, Totals()).add(t)
            replay.merge(book.resume_replay)

        sessions = GaugeMetricFamily("voicechat_sessions", "Sessions now, by state (active, detached awaiting "
                                     "resume, queued for a slot).", labels=["state"])
        for state in ("active", "detached", "queued"):
            sessions.add_metric([state], gauges.get(state, 0))
        yield sessions
        yield GaugeMetricFamily("voicechat_journal_bytes", "Resume-journal bytes retained by live tiered sessions.",
                                value=gauges.get("journal_bytes", 0))
        yield _counter("voicechat_sessions_admitted", "Sessions admitted.", ["dialect"], admitted)
        yield _counter("voicechat_sessions_rejected", "Connections refused a session (busy, resource_exhausted, "
                       "queue_full, queue_timeout).", ["dialect", "reason"], rejected)
        yield _counter("voicechat_sessions_ended", "Sessions ended, by how they ended (a close reason or "
                       "disconnect).", ["dialect", "reason"], ended)
        yield _counter("voicechat_session_resumes", "Tiered session.resume requests, by outcome.", ["outcome"],
                       resumes)

        dialects = sorted(totals.items())

        def per_dialect(read: Callable[[Totals], Mapping[str, float]]) -> dict[tuple[str, ...], float]:
            return {(d, k): n for d, t in dialects for k, n in read(t).items()}

        positions = per_dialect(lambda t: t.positions)
        over = {(d,): t.over_budget for d, t in dialects}
        late = {(d,): t.late for d, t in dialects}
        audio_in = {(d,): round(t.audio_in_s, 6) for d, t in dialects}
        audio_out = {(d,): t.audio_out_s for d, t in dialects}
        responses = per_dialect(lambda t: t.responses)
        calls = per_dialect(lambda t: t.function_calls)
        typed = per_dialect(lambda t: t.typed_jobs)
        errors = per_dialect(lambda t: t.errors)
        yield _counter("voicechat_model_positions", "Model positions run, by kind.", ["dialect", "kind"], positions)
        yield _counter("voicechat_model_positions_over_budget", "Positions whose server step exceeded 80 ms.",
                       ["dialect"], over)
        yield _counter("voicechat_model_positions_late", "Positions that started 40 ms or more after they were due.",
                       ["dialect"], late)
        yield _counter("voicechat_input_audio_seconds", "Client audio the model heard.", ["dialect"], audio_in)
        yield _counter("voicechat_output_audio_seconds", "Assistant audio sent.", ["dialect"], audio_out)
        yield _counter("voicechat_responses", "Responses ended, by status.", ["dialect", "status"], responses)
        yield _counter("voicechat_function_calls", "Function calls by outcome (published, applied, failed, "
                       "loop_limit).", ["dialect", "outcome"], calls)
        yield _counter("voicechat_typed_jobs", "Typed-input jobs by disposition (completed, cancelled, replaced, "
                       "error, rejected).", ["dialect", "disposition"], typed)
        yield _counter("voicechat_errors", "Error events sent to clients, by code.", ["dialect", "code"], errors)
        for name, doc, attr in (
            ("voicechat_model_step_seconds", "One model position on the server (submit -> result).", "step"),
            ("voicechat_commit_to_response_created_seconds", "User turn sealed -> response.created.",
             "commit_to_created"),
            ("voicechat_commit_to_first_audio_seconds", "User turn sealed -> the response's first audio.",
             "commit_to_first_audio"),
        ):
            family = HistogramMetricFamily(name, doc, labels=["dialect"])
            for d, t in sorted(totals.items()):
                h = getattr(t, attr)
                family.add_metric([d], h.cumulative(), sum_value=h.sum)
            yield family
        family = HistogramMetricFamily("voicechat_resume_replay_seconds", "session.resume received -> its replay "
                                       "queued on the new socket.")
        family.add_metric([], replay.cumulative(), sum_value=replay.sum)
        yield family


def _counter(name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


_process_collector: VoicechatCollector | None = None
_install_lock = threading.Lock()


def install(server: Observed, registry: CollectorRegistry = REGISTRY) -> VoicechatCollector:
    """Track ``server`` in this process's collector, registering it in ``registry`` the first time."""
    global _process_collector
    with _install_lock:
        if _process_collector is None:
            _process_collector = VoicechatCollector()
            registry.register(_process_collector)
        _process_collector.track(server)
        return _process_collector


def exposition(registry: CollectorRegistry = REGISTRY) -> bytes:
    return generate_latest(registry)

"""``vllm-omni bench serve --omni --backend voicechat``: our duplex session benchmark inside vLLM-Omni's bench.

**Registration timing.** ``vllm-omni ... --omni`` imports ``vllm_omni.entrypoints.cli`` (whose ``__init__``
imports ``vllm_omni.benchmarks.patch.patch``: it adds vLLM-Omni's own backends to vLLM's
``ASYNC_REQUEST_FUNCS`` and replaces ``vllm.benchmarks.serve.benchmark``), then builds every subcommand parser,
``serve`` first. The serve parser runs vLLM's ``load_general_plugins`` (``AsyncEngineArgs.add_cli_args``), which
calls our ``vllm.general_plugins`` entry point (``omni/register.py:register``), which calls
``register_bench_backend``. Only then does the ``bench serve`` parser build ``--backend`` from
``list(ASYNC_REQUEST_FUNCS)``, so ``voicechat`` is a valid choice. ``tests/test_bench_omni_cli.py`` runs the real
CLI to prove it. Outside that CLI (engine workers, plain ``vllm``) the patch module is not loaded and this is a
no-op, so vLLM-Omni's benchmark stack is never imported by a serving process.

**What one bench "request" is.** One voicechat session. ``--dataset-name custom`` takes vLLM's custom JSONL
format: each row's ``prompt`` is a session script, one user turn per line (simulator-speech text, or
``wav:PATH``; see ``bench/workload.py``). A wrapper around ``vllm.benchmarks.serve.get_samples`` reads it for our
backend without pandas (vLLM's ``bench`` extra) and without a tokenizer (pass ``--skip-tokenizer-init``); no
``--dataset-path`` runs built-in simulator scripts. ``--max-concurrency`` bounds concurrent sessions; ``--base-url`` + ``--endpoint`` name the
route and thereby the dialect (``/v1/voicechat`` strict v3; ``/v1/realtime?model=M`` or ``/v1/duplex`` tiered).
Options ride in ``--extra-body '{"voicechat": {...}}'`` (``OPTION_DEFAULTS``), the bench's channel for
backend-specific settings.

**What lands where.** Each session's output fills the standard fields the usual table prints (TTFT = commit to
first text delta, audio TTFP = commit to first audio, ITL = audio inter-delta gap, audio RTF, E2EL = session wall
time), ``duplex_request_metrics`` (one row per turn) and ``duplex_session_metrics`` (one per session), the fields
vLLM-Omni's own duplex backend uses. The run-level aggregate over all turns (``bench.metrics.summarize``) goes to
``result["voicechat"]`` and is printed after the usual table by a wrapper around ``vllm.benchmarks.serve.benchmark``
(the same module-attribute extension point vLLM-Omni's patch uses), installed after vLLM-Omni's own.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

BACKEND = "voicechat"
OPTIONS_KEY = "voicechat"
OPTION_DEFAULTS: dict[str, Any] = {
    "realtime": True,  # pace frames at 80 ms (False: send as fast as possible; the server queues late audio)
    "stream_silence": True,  # real time only: the microphone stays open (silent frames) until response.done
    "turn_timeout_s": 60.0,  # commit -> response.done
    "connect_timeout_s": 30.0,
    "instructions": "",
    "dialect": None,  # None: from the route; "v3" | "tiered" to assert it
}
_PATCH_MODULE = "vllm_omni.benchmarks.patch.patch"
_WRAPPED = "_voicechat_bench_wrapped"


def options(extra_body: dict | None) -> dict[str, Any]:
    given = dict((extra_body or {}).get(OPTIONS_KEY) or {})
    unknown = sorted(set(given) - set(OPTION_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown --extra-body {OPTIONS_KEY} options {unknown}; known: {sorted(OPTION_DEFAULTS)}")
    return {**OPTION_DEFAULTS, **given}


@lru_cache(maxsize=256)
def _frames(script: str) -> tuple[tuple[str, tuple[bytes, ...]], ...]:
    from ..bench.workload import script_frames

    return tuple((turn.label, tuple(frames)) for turn, frames in script_frames(script))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


async def async_request_voicechat(request_func_input: Any, session: Any = None, pbar: Any = None) -> Any:
    """vLLM bench request function: one voicechat session; never raises (failures are ``success=False``)."""
    from vllm_omni.benchmarks.patch.patch import MixRequestFuncOutput

    from ..bench.driver import dialect_for, run_session, ws_url

    del session  # a WebSocket, not the bench's aiohttp session
    output = MixRequestFuncOutput()
    output.prompt_len = request_func_input.prompt_len
    output.start_time = time.perf_counter()
    session_id = str(request_func_input.request_id or f"session-{id(output):x}")
    try:
        opts = options(request_func_input.extra_body)
        url = ws_url(request_func_input.api_url)
        dialect = dialect_for(url)
        if opts["dialect"] not in (None, dialect):
            raise ValueError(f"--endpoint selects the {dialect} dialect, but {OPTIONS_KEY}.dialect is {opts['dialect']}")
        script = _frames(str(request_func_input.prompt))

        def on_turn(_record: Any) -> None:
            if pbar is not None:  # sessions are the bar's unit; the postfix counts finished turns
                pbar._voicechat_turns = getattr(pbar, "_voicechat_turns", 0) + 1
                pbar.set_postfix_str(f"turns={pbar._voicechat_turns}", refresh=False)

        result = await run_session(
            url,
            [list(frames) for _, frames in script],
            dialect=dialect,
            instructions=str(opts["instructions"]),
            realtime=bool(opts["realtime"]),
            stream_silence=bool(opts["stream_silence"]),
            turn_timeout_s=float(opts["turn_timeout_s"]),
            connect_timeout_s=float(opts["connect_timeout_s"]),
            on_turn=on_turn,
        )
        finished = time.perf_counter()
        turns = result.turns
        rows = []
        for rec in turns:
            row = rec.to_json(with_gaps=True)
            row.update(session_id=session_id, dialect=dialect,
                       prompt=script[rec.index][0] if rec.index < len(script) else None)
            rows.append(row)
        ttft = [r.ttft_ms for r in turns if r.ttft_ms is not None]
        ttfa = [r.ttfa_ms for r in turns if r.ttfa_ms is not None]
        rtf = [r.audio_rtf for r in turns if r.audio_rtf is not None]
        measured = [r for r in turns if r.over_budget_positions is not None]
        output.duplex_request_metrics = rows
        output.duplex_session_metrics = {
            "session_id": session_id,
            "dialect": dialect,
            "url": url,
            "turns": len(turns),
            "completed_turns": sum(1 for r in turns if r.ok),
            # the keys vLLM-Omni's calculate_metrics checks for "measured" (None: not measured in this session)
            "ttft_ms": _mean(ttft),
            "ttfp_ms": _mean(ttfa),
            "rtf": _mean(rtf),
            "positions": sum(r.positions or 0 for r in measured) if measured else None,
            "over_budget_positions": ([p for r in measured for p in r.over_budget_positions or ()]
                                      if measured else None),
            "errors": result.all_errors,
            "session_errors": list(result.errors),  # the part of errors that belongs to no turn
            "close_code": result.close_code,
            "trace_checked": result.checked,
        }
        output.ttft = (_mean(ttft) or 0.0) / 1000.0
        output.audio_ttfp = (_mean(ttfa) or 0.0) / 1000.0
        output.audio_rtf = _mean(rtf) or 0.0
        output.audio_duration = sum(r.audio_ms for r in turns) / 1000.0
        output.audio_frames = sum(r.audio_deltas for r in turns)
        output.itl = [g / 1000.0 for r in turns for g in r.gaps_ms]
        output.output_tokens = sum(r.audio_deltas for r in turns)
        output.generated_text = " ".join(r.text for r in turns if r.text)
        output.latency = finished - output.start_time
        output.input_audio_duration = sum(r.input_frames for r in turns) * 0.08
        output.success = result.ok and len(turns) == len(script)
        if not output.success:
            output.error = "; ".join(result.all_errors) or f"{len(turns)} of {len(script)} turns ran"
    except Exception as exc:  # noqa: BLE001 - one failed session is a failed request, never a crashed run
        output.success = False
        output.error = traceback.format_exc()
        output.duplex_session_metrics = {"session_id": session_id, "turns": 0, "completed_turns": 0,
                                         "ttft_ms": None, "ttfp_ms": None, "rtf": None,
                                         "errors": [repr(exc)], "session_errors": [repr(exc)]}
        logger.error("voicechat bench session %s failed: %s", session_id, output.error)
    if pbar is not None:
        pbar.update(1)
    return output


def aggregate(result: dict[str, Any]) -> dict[str, Any]:
    """``result["voicechat"]``: the run-level summary over every turn in ``result["duplex_request_metrics"]``."""
    from dataclasses import fields

    from ..bench.metrics import TurnRecord, summarize

    names = {f.name for f in fields(TurnRecord)}
    turns = [TurnRecord(**{k: v for k, v in row.items() if k in names})
             for row in result.get("duplex_request_metrics") or []]
    sessions = result.get("duplex_session_metrics") or []
    dialects = sorted({s.get("dialect") for s in sessions if s.get("dialect")})
    summary = summarize(
        turns,
        sessions=int(result.get("completed", 0)) + int(result.get("failed", 0) or 0),
        failed_sessions=int(result.get("failed", 0) or 0),
        session_errors=[e for s in sessions for e in s.get("session_errors") or ()],
        duration_s=result.get("duration"),
    )
    summary["dialects"] = dialects
    summary["over_budget_reported"] = summary["over_budget_positions"] is not None
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """The voicechat section, in the layout of vLLM-Omni's bench tables."""
    print("{s:{c}^{n}}".format(s=" Voicechat Duplex Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Dialect:", ",".join(summary["dialects"]) or "-"))
    print("{:<40} {:<10}".format("Sessions (failed):", f"{summary['sessions']} ({summary['failed_sessions']})"))
    print("{:<40} {:<10}".format("Turns (completed):", f"{summary['turns']} ({summary['completed_turns']})"))
    print("{:<40} {:<10}".format("Errors:", summary["errors"]))
    ob = summary["over_budget_positions"]
    print("{:<40} {:<10}".format("Over-budget positions (server):",
                                 "not reported by this dialect" if ob is None else f"{ob} of {summary['positions']}"))
    rows = [
        ("commit_to_committed_ms", "Commit -> committed"),
        ("commit_to_response_created_ms", "Commit -> response.created"),
        ("ttft_ms", "Commit -> first text (TTFT)"),
        ("ttfa_ms", "Commit -> first audio (TTFA)"),
        ("audio_span_ms", "First audio -> last audio"),
        ("inter_delta_gap_ms", "Inter-delta gap"),
    ]
    for key, label in rows:
        d = summary[key]
        if not d["count"]:
            continue
        print("{s:{c}^{n}}".format(s=f"{label} (ms)", n=50, c="-"))
        for stat in ("mean", "p50", "p99", "max"):
            print("{:<40} {:<10.2f}".format(f"{stat.capitalize() if stat == 'mean' else stat.upper()} (ms):", d[stat]))
    d = summary["audio_rtf"]
    if d["count"]:
        print("{s:{c}^{n}}".format(s="Audio RTF", n=50, c="-"))
        for stat in ("mean", "p50", "p99"):
            print("{:<40} {:<10.3f}".format(f"{stat.capitalize() if stat == 'mean' else stat.upper()}:", d[stat]))
    print("=" * 50)


def samples(args: Any) -> list[Any]:
    """The bench's input requests for our backend: one ``SampleRequest`` per session, its prompt the script.

    ``--dataset-name custom`` reads the same JSONL rows as vLLM's custom dataset but without pandas (vLLM's
    ``bench`` extra, absent from a plain vLLM-Omni install); no ``--dataset-path`` runs ``DEFAULT_SCRIPTS``.
    ``prompt_len`` is the session's input length in 80 ms frames (the table's "input tokens").
    """
    from vllm.benchmarks.datasets import SampleRequest

    from ..bench.workload import load_scripts, pick_scripts

    scripts = pick_scripts(load_scripts(args.dataset_path), args.num_prompts, seed=args.seed,
                           shuffle=not getattr(args, "disable_shuffle", False))
    prefix = getattr(args, "request_id_prefix", "") or ""
    return [SampleRequest(prompt=script, prompt_len=sum(len(frames) for _, frames in _frames(script)),
                          expected_output_len=0, request_id=f"{prefix}{i}")
            for i, script in enumerate(scripts)]


def _wrap_get_samples() -> None:
    from vllm.benchmarks import serve

    inner = serve.get_samples
    if getattr(inner, _WRAPPED, False):
        return

    def get_samples(args: Any, tokenizer: Any, **kwargs: Any) -> Any:
        if getattr(args, "backend", None) == BACKEND:
            if args.dataset_name != "custom":
                raise ValueError(f"--backend {BACKEND} reads --dataset-name custom (JSONL session scripts)")
            return samples(args)
        return inner(args, tokenizer, **kwargs)

    setattr(get_samples, _WRAPPED, True)
    get_samples.__wrapped__ = inner  # type: ignore[attr-defined]
    serve.get_samples = get_samples


def _wrap_benchmark() -> None:
    from vllm.benchmarks import serve

    inner = serve.benchmark
    if getattr(inner, _WRAPPED, False):
        return

    async def benchmark(*args: Any, **kwargs: Any) -> Any:
        result = await inner(*args, **kwargs)
        if kwargs.get("endpoint_type") == BACKEND and isinstance(result, dict):
            result[OPTIONS_KEY] = aggregate(result)
            print_summary(result[OPTIONS_KEY])
        return result

    setattr(benchmark, _WRAPPED, True)
    benchmark.__wrapped__ = inner  # type: ignore[attr-defined]
    serve.benchmark = benchmark


def register_bench_backend() -> bool:
    """Add ``voicechat`` to vLLM's bench backends when vLLM-Omni's bench CLI is loaded; idempotent, never raises.

    True when the backend is (now or already) registered.
    """
    patch = sys.modules.get(_PATCH_MODULE)
    if patch is None:
        return False  # not the vllm-omni CLI: stay out of vLLM-Omni's benchmark stack
    try:
        funcs = patch.ASYNC_REQUEST_FUNCS
        if funcs.get(BACKEND) not in (None, async_request_voicechat):
            logger.warning("bench backend %r is taken; voicechat is not registered", BACKEND)
            return False
        funcs[BACKEND] = async_request_voicechat
        _wrap_get_samples()
        _wrap_benchmark()
    except Exception:
        logger.warning("could not register the %s bench backend", BACKEND, exc_info=True)
        return False
    return True


__all__ = ["BACKEND", "OPTION_DEFAULTS", "aggregate", "async_request_voicechat", "options", "print_summary",
           "register_bench_backend"]

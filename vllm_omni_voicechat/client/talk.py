"""``vllm-omni-voicechat talk``: play WAV files, simulator speech or typed text to a v3 server, one user turn
each, and print what was heard and said with the turn's latencies.

    vllm-omni-voicechat talk --url ws://127.0.0.1:8765 --wav question.wav --text "And tomorrow?" --save-wav out/

Each input is one turn, in command-line order: ``--wav FILE`` (any PCM16/24/32 or float32 WAV, mixed down to
mono and resampled to 16 kHz with soxr) and ``--say TEXT`` (rendered as simulator speech) stream 80 ms appends
between ``turn_start`` and ``commit``; ``--text TEXT`` is an ``input_text.request``. Timings are event-loop
times on this client: from the commit (typed: the request) as written to the socket to ``committed``,
``response.created`` and the first audio delta (TTFA); the response's audio length and how long its audio took
to stream (first to last delta). ``--json`` prints one JSON document instead of the text report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..audio.speech import render_speech
from ..audio.wav import load_wav_16k, write_wav
from .v3 import OUTPUT_SAMPLE_RATE, Event, V3Client, V3ClientError

DEFAULT_URL = "ws://127.0.0.1:8765/v1/voicechat"
V3_PATH = "/v1/voicechat"  # always the strict v3 contract (a bare /v1/realtime depends on the server's flag)


# ---------------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class TalkInput:
    """One user turn: ``kind`` is ``wav`` (a file), ``say`` (simulator speech) or ``text`` (typed)."""

    kind: str
    value: str

    @property
    def source(self) -> str:
        return "typed" if self.kind == "text" else "microphone"


def input_pcm(item: TalkInput) -> bytes:
    if item.kind == "wav":
        return load_wav_16k(item.value)
    return render_speech(item.value)


def v3_url(url: str) -> str:
    """``ws://host:port`` (or http/https) -> the strict v3 route; an explicit path is kept."""
    parts = urlsplit(url if "://" in url else f"ws://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else V3_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


# ---------------------------------------------------------------------------------------------------- timings


@dataclass
class TurnReport:
    """One turn: what was sent, heard and answered, with client-side latencies in milliseconds."""

    index: int
    kind: str
    input: str
    source: str
    turn_id: str | None = None
    transcript: str = ""
    response_id: str | None = None
    text: str = ""
    status: str | None = None
    reason: str | None = None
    audio_s: float = 0.0  # length of the response audio
    commit_to_committed_ms: float | None = None  # microphone turns only
    commit_to_created_ms: float | None = None  # typed: request -> response.created
    ttfa_ms: float | None = None  # commit (typed: request) -> first audio delta
    audio_stream_ms: float | None = None  # first -> last audio delta
    commit_to_done_ms: float | None = None
    wav: str | None = None  # where --save-wav wrote the response audio
    error: str | None = None


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000.0, 3)


def turn_timings(
    events: list[Event], arrivals: list[float], origin: float, turn_id: str, response_id: str | None
) -> dict[str, float | None]:
    """Latencies of one turn from the client's event log (``arrivals[i]`` is when ``events[i]`` arrived).

    ``origin`` is when the commit (typed: the request) was written. Pure: no clock, no I/O.
    """
    committed = created = first_audio = last_audio = done = None
    for event, at in zip(events, arrivals):
        type_ = event["type"]
        if type_ == "input_audio_buffer.committed" and event.get("turn_id") == turn_id and committed is None:
            committed = at
        elif response_id is None or event.get("response_id") != response_id:
            continue
        elif type_ == "response.created" and created is None:
            created = at
        elif type_ == "response.output_audio.delta":
            first_audio = at if first_audio is None else first_audio
            last_audio = at
        elif type_ == "response.done":
            done = at
    return {
        "commit_to_committed_ms": _ms(origin, committed),
        "commit_to_created_ms": _ms(origin, created),
        "ttfa_ms": _ms(origin, first_audio),
        "audio_stream_ms": _ms(first_audio, last_audio),
        "commit_to_done_ms": _ms(origin, done),
    }


class TimedV3Client(V3Client):
    """A :class:`V3Client` that stamps each server event's arrival (event-loop time) in ``arrivals``,
    index-aligned with ``events``: the stamp is taken as the receive loop takes the message, before any awaiting
    caller wakes, so scheduling delay in the caller does not inflate the latencies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: list[float] = []

    def _handle(self, e: Event) -> None:
        self.arrivals.append(asyncio.get_running_loop().time())
        super()._handle(e)


# ---------------------------------------------------------------------------------------------------- session


@dataclass
class TalkResult:
    url: str
    session_id: str | None = None
    turns: list[TurnReport] = field(default_factory=list)
    session_status: str | None = None
    close_code: int | None = None
    client: TimedV3Client | None = field(default=None, repr=False, compare=False)  # its full event log

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("turns", "client")}
        out["turns"] = [asdict(turn) for turn in self.turns]
        return out


def _sent_at(client: V3Client, type_: str, key: str, value: Any) -> float:
    return next(s.at for s in reversed(client.sent) if s.type == type_ and s.event.get(key) == value)


async def _play(client: TimedV3Client, index: int, item: TalkInput, *, paced: bool, timeout: float) -> TurnReport:
    report = TurnReport(index, item.kind, item.value, item.source)
    if item.kind == "text":
        job_id = f"talk-{index}"
        job = await client.request_typed(job_id, item.value)
        if not job.accepted:
            report.error = f"typed input rejected: {job.reason}"
            return report
        origin = _sent_at(client, "input_text.request", "job_id", job_id)
        await client.wait_for(
            lambda e: e["type"] == "input_text.injection_finished" and e["job_id"] == job_id, timeout
        )
        if job.turn_id is None:
            report.error = f"typed job ended {job.disposition} before its turn started"
            return report
        report.turn_id = job.turn_id
    else:
        pcm = input_pcm(item)
        await client.start_turn(index)
        await client.send_audio(pcm, paced=paced)
        report.turn_id = await client.commit(index)
        origin = _sent_at(client, "input_audio_buffer.commit", "client_turn_id", index)
    response = await client.response_for(report.turn_id, timeout)
    await client.response_done(response.response_id, timeout)
    turn = client.turns[report.turn_id]
    report.transcript, report.response_id = turn.transcript, response.response_id
    report.text, report.status, report.reason = response.text, response.status, response.reason
    report.audio_s = round(len(response.audio) / 2 / OUTPUT_SAMPLE_RATE, 4)
    timings = turn_timings(client.events, client.arrivals, origin, report.turn_id, response.response_id)
    for key, value in timings.items():
        setattr(report, key, value)
    if item.kind == "text":
        report.commit_to_committed_ms = None  # a typed turn has no commit barrier
    return report


async def talk(
    url: str,
    inputs: list[TalkInput],
    *,
    paced: bool = True,
    instructions: str = "",
    save_dir: str | Path | None = None,
    timeout: float = 60.0,
) -> TalkResult:
    """Hold one v3 session: every input is one turn, played to the end of its response."""
    result = TalkResult(v3_url(url))
    client = result.client = await TimedV3Client.connect(result.url)
    result.session_id = client.session_id
    try:
        await client.configure(instructions=instructions)
        for index, item in enumerate(inputs, start=1):
            report = await _play(client, index, item, paced=paced, timeout=timeout)
            result.turns.append(report)
            if save_dir is not None and report.response_id is not None:
                path = Path(save_dir) / f"response_{index:02d}.wav"
                write_wav(path, bytes(client.responses[report.response_id].audio))
                report.wav = str(path)
        closed = await client.stop()
    except BaseException:
        await client.close()
        raise
    result.session_status = (closed or {}).get("status")
    result.close_code = client.close_code
    return result


# ---------------------------------------------------------------------------------------------------- CLI


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f} ms"


def format_report(result: TalkResult) -> str:
    lines = [f"session {result.session_id} at {result.url}"]
    for t in result.turns:
        label = Path(t.input).name if t.kind == "wav" else repr(t.input)
        lines.append(f"[{t.index}] {t.kind} {label}")
        if t.error:
            lines.append(f"    error: {t.error}")
            continue
        lines.append(f"    user ({t.source}): {t.transcript or '<empty>'}")
        lines.append(f"    assistant: {t.text or '<no text>'}  [{t.status}{': ' + t.reason if t.reason else ''}]")
        origin = "request" if t.kind == "text" else "commit"
        parts = []
        if t.kind != "text":
            parts.append(f"commit->committed {_fmt(t.commit_to_committed_ms)}")
        parts += [
            f"{origin}->response.created {_fmt(t.commit_to_created_ms)}",
            f"TTFA {_fmt(t.ttfa_ms)}",
            f"response {t.audio_s:.2f} s audio in {_fmt(t.audio_stream_ms)}",
        ]
        lines.append("    " + " | ".join(parts))
        if t.wav:
            lines.append(f"    audio -> {t.wav}")
    lines.append(f"session {result.session_status}, close code {result.close_code}")
    return "\n".join(lines)


class _AppendInput(argparse.Action):
    """--wav / --say / --text all append to one ordered list: turns run in command-line order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        for value in values if isinstance(values, list) else [values]:
            items.append(TalkInput(self.const, value))
        setattr(namespace, self.dest, items)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help="server URL (ws://host:port uses /v1/voicechat)")
    parser.add_argument("--wav", nargs="+", metavar="FILE", dest="inputs", action=_AppendInput, const="wav",
                        help="WAV file(s) to speak, one turn each (resampled to 16 kHz mono)")
    parser.add_argument("--say", metavar="TEXT", dest="inputs", action=_AppendInput, const="say",
                        help="speak TEXT as simulator speech (a microphone turn the simulator transcribes)")
    parser.add_argument("--text", metavar="TEXT", dest="inputs", action=_AppendInput, const="text",
                        help="a typed turn (input_text.request)")
    parser.add_argument("--save-wav", metavar="DIR", help="write each response's audio to DIR/response_NN.wav")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    parser.add_argument("--paced", action=argparse.BooleanOptionalAction, default=True,
                        help="stream microphone audio in real time (default) or as fast as possible")
    parser.add_argument("--instructions", default="", help="the session's system prompt")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each response")


def run(args: argparse.Namespace) -> int:
    """Run ``talk`` from parsed arguments; 0 ok, 1 protocol or server error, 2 no connection or bad input."""
    inputs: list[TalkInput] = args.inputs or []
    if not inputs:
        print("talk: give at least one --wav, --say or --text", file=sys.stderr)
        return 2
    try:
        for item in inputs:
            if item.kind == "wav":
                load_wav_16k(item.value)  # fail before connecting
    except (OSError, ValueError) as error:
        print(f"talk: {error}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(
            talk(args.url, inputs, paced=args.paced, instructions=args.instructions, save_dir=args.save_wav,
                 timeout=args.timeout)
        )
    except (V3ClientError, TimeoutError) as error:
        print(f"talk: protocol error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"talk: cannot reach {v3_url(args.url)}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=2) if args.json else format_report(result))
    return 1 if any(t.error for t in result.turns) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-omni-voicechat talk", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

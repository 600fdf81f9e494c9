"""``vllm-omni-voicechat``: serve the voicechat protocol on the embedded simulator model (``serve``, or
``serve sim``), or a real checkpoint through ``vllm-omni serve MODEL --omni`` with our deploy YAML (``serve MODEL
[vllm-omni serve options]``, in an environment with vLLM-Omni installed); ``talk`` plays WAV files or typed text
to a running server and prints the transcript and timings; ``make-tiny-checkpoint`` writes a tiny random checkpoint
in the real layout (docs/tiny-checkpoint.md); ``verify-checkpoint`` reports, from the safetensors headers alone, the
tensors each stage will consume and any missing or unexpected (docs/running-on-gpu.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from .runner.stage0 import DEFAULT_MAX_SESSION_MODEL_FRAMES
from .session.settlement import DEFAULT_FENCE
from .wire.limits import TIERED_MAX_MESSAGE_BYTES, V3_MAX_MESSAGE_BYTES
from .wire.v3.schema import CONFIGURE_TIMEOUT_S as V3_CONFIGURE_TIMEOUT_S
from .wire.v3.schema import IDLE_TIMEOUT_S as V3_IDLE_TIMEOUT_S

if TYPE_CHECKING:
    from .server import ServerConfig


def _seconds_or_off(text: str) -> float | None:
    seconds = float(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError("a timeout is 0 (off) or more seconds")
    return seconds or None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-omni-voicechat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the WebSocket server (v3 on /v1/realtime and /v1/voicechat)")
    serve.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                       help="a checkpoint to serve through vllm-omni (default: the CPU simulator)")
    serve.add_argument("--model", default="sim", help="model home (sim: the CPU simulator)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--max-sessions", type=int, default=4)
    serve.add_argument("--max-session-model-frames", type=int, default=DEFAULT_MAX_SESSION_MODEL_FRAMES)
    serve.add_argument("--settlement-blank-frames", type=int, default=DEFAULT_FENCE)
    serve.add_argument("--speech", default="simulator", choices=["simulator", "real"],
                       help="what the simulator hears and speaks: its tone speech, or real speech (PocketSphinx in, "
                            "eSpeak NG out; pip install -e '.[voice]' and bash scripts/install_espeak.sh)")
    serve.add_argument("--prefill-delay-ms", type=float, default=50.0, help="simulated model prefill time")
    serve.add_argument("--instructions", default="", help="default system prompt (restored by instructions:null)")
    serve.add_argument(
        "--realtime-default",
        default="v3",
        choices=["v3", "tiered", "tiered-openai"],
        help="dialect of a bare /v1/realtime (no duplex/model query, no OpenAI-Beta header)",
    )
    serve.add_argument(
        "--v3-turns",
        default="client",
        choices=["client", "legacy"],
        help="v3 turn ownership: client barriers (production) or the diagnostic RNNT-owned legacy mode",
    )
    serve.add_argument("--disconnect-grace-s", type=float, default=30.0, help="how long a dropped tiered session waits for session.resume")
    serve.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="require this key on /v1 (repeatable; also $VOICECHAT_API_KEY): Bearer header or the "
                            "browser subprotocol form")
    serve.add_argument("--ws-compression", action="store_true",
                       help="negotiate permessage-deflate with clients that offer it (off: audio barely compresses)")
    serve.add_argument("--admission-queue", type=int, default=0, metavar="N",
                       help="tiered connections that may wait for a slot when all are taken (0: answer busy at once)")
    serve.add_argument("--admission-timeout-s", type=float, default=30.0, metavar="T",
                       help="how long a queued connection may wait before the busy answer")
    serve.add_argument("--v3-max-message-bytes", type=int, default=V3_MAX_MESSAGE_BYTES, metavar="N",
                       help="the largest v3 client message; a larger one closes the socket with 1009 (default 1 MiB)")
    serve.add_argument("--tiered-max-message-bytes", type=int, default=TIERED_MAX_MESSAGE_BYTES, metavar="N",
                       help="the largest tiered client message; a larger one closes the socket with 1009 (default "
                            "16 MiB; over 15 MiB the dialect answers event_too_large)")
    for flag, default, what in (
        ("--v3-configure-timeout-s", V3_CONFIGURE_TIMEOUT_S,
         "end a v3 session with no session.update T seconds after session.created"),
        ("--v3-idle-timeout-s", V3_IDLE_TIMEOUT_S,
         "end a v3 session whose client sends nothing for T seconds while the model listens"),
    ):
        serve.add_argument(flag, type=_seconds_or_off, default=default, metavar="T",
                           help=f"{what} (0: never; default {default:g})")
    serve.add_argument("--request-head-timeout-s", type=float, default=None, metavar="T",
                       help="close a connection whose first request head has not arrived T seconds after its accept "
                            "(default 10)")
    serve.add_argument("--replica", default=None, metavar="NAME",
                       help="this process's name among replicas behind a balancer (lowercase letters and digits): "
                            "full-lane session ids name it, and SIGTERM drains (deploy/haproxy/README.md)")
    serve.add_argument("--agent-port", type=int, default=None, metavar="PORT",
                       help="answer HAProxy's agent check here: whether this replica takes new sessions")
    serve.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="try the fleet on one machine: N simulator replicas behind HAProxy on --port")
    serve.add_argument("--warmup-positions", type=int, default=0, help="silent positions run before admitting clients")
    serve.add_argument("--log-level", default="info")
    from .client import talk

    talk.add_arguments(sub.add_parser("talk", help="play WAV files, simulator speech or typed text to a v3 server; "
                                      "print the transcript and timings", description=talk.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter))
    tiny = sub.add_parser("make-tiny-checkpoint", help="write a tiny random Nemotron VoiceChat checkpoint "
                          "(real file layout, all three stages) for CPU runs of vLLM-Omni")
    tiny.add_argument("directory", metavar="DIR")
    tiny.add_argument("--seed", type=int, default=0)
    verify = sub.add_parser("verify-checkpoint", help="report the tensors each stage will consume from a downloaded "
                            "checkpoint, and any missing or unexpected (headers only: no weights, no GPU)")
    verify.add_argument("directory", metavar="DIR")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _simulator_config(args: argparse.Namespace) -> ServerConfig:
    """``serve``'s simulator configuration from its flags."""
    from .server import ServerConfig

    return ServerConfig.simulator(
        prefill_delay_s=args.prefill_delay_ms / 1000,
        real_speech=args.speech == "real",
        max_sessions=args.max_sessions,
        max_session_model_frames=args.max_session_model_frames,
        settlement_blank_frames=args.settlement_blank_frames,
        default_instructions=args.instructions,
        realtime_default=args.realtime_default,
        v3_turns=args.v3_turns,
        disconnect_grace_s=args.disconnect_grace_s,
        warmup_positions=args.warmup_positions,
        admission_queue=args.admission_queue,
        admission_timeout_s=args.admission_timeout_s,
        api_keys=api_keys(args.api_key),
        v3_max_message_bytes=args.v3_max_message_bytes,
        tiered_max_message_bytes=args.tiered_max_message_bytes,
        v3_configure_timeout_s=args.v3_configure_timeout_s,
        v3_idle_timeout_s=args.v3_idle_timeout_s,
        replica=args.replica,
        agent_port=args.agent_port,
        agent_host=args.host,
    )


def _replica_args(argv: list[str]) -> list[str]:
    """``serve --replicas N``'s options for each replica: all but the fleet's own (port, host, replicas)."""
    out: list[str] = []
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--replicas", "--port", "--host", "--replica", "--agent-port"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def api_keys(flags: list[str] | None) -> tuple[str, ...]:
    """``--api-key`` (repeatable) takes precedence over ``$VOICECHAT_API_KEY``, as vLLM's over ``$VLLM_API_KEY``."""
    from .server.auth import ENV_VAR

    keys = [k for k in (flags or [os.environ.get(ENV_VAR, "")]) if k]
    return tuple(keys)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "serve" and not argv[1].startswith("-") and argv[1] != "sim":
        # A real checkpoint: everything after it belongs to `vllm-omni serve`.
        from .omni.serve import main as serve_omni

        return serve_omni(argv[1], argv[2:])
    args = build_parser().parse_args(argv)
    if args.command == "talk":
        from .client import talk

        return talk.run(args)
    if args.command == "make-tiny-checkpoint":
        from .omni.tiny import LLM_FOLDER, make_tiny_checkpoint  # torch: imported only here

        root = make_tiny_checkpoint(args.directory, seed=args.seed)
        print(f"{root}  (pretrained_llm and the stage-0 tokenizer: {root / LLM_FOLDER})")
        return 0
    if args.command == "verify-checkpoint":
        from .omni.checkpoint_report import main as verify_checkpoint

        return verify_checkpoint(args.directory, as_json=args.json)
    if args.model != "sim":
        from .omni.serve import main as serve_omni

        return serve_omni(args.model, [])
    if args.command == "serve" and args.replicas:
        from .fleet.launch import run as run_fleet

        return run_fleet(args.replicas, args.port, args.host, _replica_args(argv))
    if args.command == "serve":
        from .fleet.keys import check_replica_name
        from .server import create_app
        from .server.uvicorn import REQUEST_HEAD_TIMEOUT_S, VoicechatUvicornServer, uvicorn_config
        from .sim.real_speech import SpeechUnavailable

        if args.replica is not None:
            try:
                check_replica_name(args.replica)
            except ValueError as exc:
                build_parser().error(str(exc))
        try:
            config = _simulator_config(args)
        except SpeechUnavailable as exc:
            print(f"vllm-omni-voicechat: {exc}", file=sys.stderr)
            return 2
        app = create_app(config, manage_heap=True)
        server = VoicechatUvicornServer(
            uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level,
                           ws_per_message_deflate=args.ws_compression,
                           ws_max_size=max(args.v3_max_message_bytes, args.tiered_max_message_bytes),
                           request_head_timeout_s=args.request_head_timeout_s or REQUEST_HEAD_TIMEOUT_S),
            app.state.voicechat
        )
        try:
            server.run()
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after its graceful shutdown
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

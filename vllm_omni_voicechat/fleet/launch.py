"""Simulator replicas behind HAProxy on one machine, for trying the fleet (``vllm-omni-voicechat serve --replicas
N``) and for its tests: N ``serve`` processes (replica ``r1``.. on ``port+1``.., agents on ``port+101``..) and
HAProxy on ``port`` with the configuration of ``fleet/haproxy.py``. One replica per GPU is the same with
``vllm-omni serve`` processes (deploy/haproxy/README.md)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .haproxy import ReplicaAddress, haproxy_config

START_TIMEOUT_S = 60.0


def replica_addresses(n: int, port: int, host: str = "127.0.0.1") -> list[ReplicaAddress]:
    return [ReplicaAddress(f"r{i}", host, port + i, port + 100 + i) for i in range(1, n + 1)]


def port_offsets(n: int) -> list[int]:
    """The ports a fleet of ``n`` binds, as offsets from its ``port``: HAProxy's, the replicas', their agents'."""
    replicas = replica_addresses(n, 0)
    return [0, *(r.port for r in replicas), *(r.agent_port for r in replicas)]


def _healthy(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


class Fleet:
    """The processes; ``start`` waits until every replica answers ``/health`` and HAProxy listens."""

    def __init__(self, n: int, port: int, *, host: str = "127.0.0.1", serve_args: Sequence[str] = (),
                 workdir: str | None = None, haproxy: str = "haproxy", agent_interval_ms: int = 500,
                 check_interval_ms: int = 1000) -> None:
        self.replicas = replica_addresses(n, port, host)
        self.port = port
        self.host = host
        self.serve_args = list(serve_args)
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="voicechat-fleet-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.runtime_socket = str(self.workdir / "haproxy.sock")
        self.config_path = self.workdir / "haproxy.cfg"
        self.haproxy = haproxy
        self.config_text = haproxy_config(self.replicas, bind=f"{host}:{port}", runtime_socket=self.runtime_socket,
                                          stats_bind=None, agent_interval_ms=agent_interval_ms,
                                          check_interval_ms=check_interval_ms)
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def start_replica(self, replica: ReplicaAddress) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "vllm_omni_voicechat.cli", "serve", "--host", replica.host,
               "--port", str(replica.port), "--replica", replica.name, "--agent-port", str(replica.agent_port),
               "--log-level", "warning", *self.serve_args]
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        self.processes[replica.name] = process
        return process

    def wait_healthy(self, replica: ReplicaAddress, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while _healthy(f"http://{replica.host}:{replica.port}/health") is None:
            process = self.processes.get(replica.name)
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"replica {replica.name} exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {replica.name} did not start in {timeout_s:g} s")
            time.sleep(0.1)  # ok: waiting for another process to listen

    def start(self) -> Fleet:
        if shutil.which(self.haproxy) is None:
            raise RuntimeError("haproxy is not installed (scripts/install_haproxy.sh)")
        for replica in self.replicas:
            self.start_replica(replica)
        for replica in self.replicas:
            self.wait_healthy(replica)
        self.config_path.write_text(self.config_text)
        subprocess.run([self.haproxy, "-c", "-q", "-f", str(self.config_path)], check=True)
        self.processes["haproxy"] = subprocess.Popen([self.haproxy, "-db", "-f", str(self.config_path)],
                                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while _healthy(f"http://{self.host}:{self.port}/health") is None:
            if self.processes["haproxy"].poll() is not None:
                raise RuntimeError("haproxy exited")
            if time.monotonic() > deadline:
                raise TimeoutError("haproxy did not start")
            time.sleep(0.1)  # ok: waiting for another process to listen
        return self

    def runtime(self, command: str) -> str:
        """One command on HAProxy's runtime API (its stats socket)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.runtime_socket)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # a replica's SIGTERM drains; SIGINT stops
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(n: int, port: int, host: str, serve_args: Sequence[str]) -> int:
    """``serve --replicas N``: run until interrupted."""
    with Fleet(n, port, host=host, serve_args=serve_args) as fleet:
        print(f"{n} replicas behind HAProxy on {fleet.url} (config: {fleet.config_path})", flush=True)

        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, interrupt)
            while all(p.poll() is None for p in fleet.processes.values()):
                time.sleep(0.5)  # ok: a supervisor's idle wait
    return 0


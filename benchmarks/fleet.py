"""Replicas behind HAProxy (deploy/haproxy/): whether every resume reaches its owner, whether a new session is ever
refused while a replica had a free slot, and what the proxy adds to each event, against direct connections in the
same run. Real processes: N ``serve --replica`` simulator replicas and Debian's HAProxy (``fleet/launch.py``);
the clients run here, in a process of their own.

Phases:
1. latency: one tiered session through the proxy and one straight to a replica, alternately, ``--pings``
   heartbeat round trips each (``session.heartbeat`` -> ``session.heartbeat_ack``); the added latency is the proxy's
   p50 / p99 minus the direct one's.
2. resumes: N x M sessions through the proxy (our clients' URLs: ``persist=session_id``, ``session_id`` on a
   resume); ``--drops`` times a random one's transport is cut and the session resumed; counted: resumes attempted,
   answered ``session.resumed`` (only the owner holds the session), and the server event sequence after each
   (replayed events follow the client's last one with no gap and no duplicate).
3. admission race: the fleet empty, N x M v3 clients connect at once (exactly the capacity: any refusal is one while
   a slot was free somewhere), then N x M + ``--extra`` at once (exactly ``--extra`` must be refused), each round
   ``--rounds`` times; refusals are counted by kind (the dialect's busy answer, HAProxy's HTTP 503).

    .venv/bin/python benchmarks/fleet.py                     # 3 replicas x 4 sessions, 240 drops
    .venv/bin/python benchmarks/fleet.py --replicas 2 --sessions 2 --drops 40 --pings 100 --out /tmp/fleet.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from _common import RESULTS, now_utc, summarize_us, write_report
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from vllm_omni_voicechat.fleet.launch import Fleet

UPDATE = json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}})
OURS = "/v1/duplex?persist=session_id"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Session:
    def __init__(self, base: str, path: str = OURS) -> None:
        self.base, self.path = base, path
        self.seq = 0
        self.ws: ClientConnection | None = None
        self.created: dict = {}
        self.gaps = 0
        self.duplicates = 0

    async def open(self) -> Session:
        self.ws = await connect(self.base + self.path, ping_interval=None, max_size=None)
        await self.ws.send(UPDATE)
        self.created = await self.until("session.created")
        await self.until("session.updated")
        return self

    @property
    def id(self) -> str:
        return self.created["session"]["id"]

    async def recv(self) -> dict:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        seq = event.get("server_event_seq")
        if seq is not None:
            if seq <= self.seq:
                self.duplicates += 1
            elif seq > self.seq + 1:
                self.gaps += 1
            self.seq = max(self.seq, seq)
        return event

    async def until(self, type_: str) -> dict:
        while (event := await self.recv())["type"] != type_:
            if event["type"] == "error":
                raise RuntimeError(event)
        return event

    async def ping(self) -> float:
        started = time.perf_counter()
        await self.ws.send('{"type":"session.heartbeat"}')
        await self.until("session.heartbeat_ack")
        return time.perf_counter() - started

    async def drop_and_resume(self) -> str:
        self.ws.transport.abort()  # the transport fails: no close handshake
        self.ws = await connect(f"{self.base}{self.path}&session_id={self.id}", ping_interval=None, max_size=None)
        await self.ws.send(json.dumps({"type": "session.resume", "session_id": self.id,
                                       "resume_token": self.created["resume_token"],
                                       "last_received_server_event_seq": self.seq}))
        answer = await self.recv()
        if answer["type"] == "session.resumed":
            self.created["resume_token"] = answer["resume_token"]
            await self.ping()  # the session answers on its new socket
        return answer["type"] if answer["type"] != "error" else answer["error"]["code"]

    async def close(self) -> None:
        await self.ws.send('{"type":"session.close"}')
        try:
            while True:
                await self.recv()
        except Exception:
            pass


async def latency(f: Fleet, pings: int) -> dict:
    proxied = await Session(f.url).open()
    owner = proxied.id.split("-")[1]
    replica = next(r for r in f.replicas if r.name == owner)
    direct = await Session(f"ws://{replica.host}:{replica.port}").open()  # same replica, same load
    samples: dict[str, list[float]] = {"proxy": [], "direct": []}
    for _ in range(20):  # warm-up
        await proxied.ping()
        await direct.ping()
    for i in range(pings):
        for name, s in (("proxy", proxied), ("direct", direct)) if i % 2 else (("direct", direct), ("proxy", proxied)):
            samples[name].append(await s.ping())
    await proxied.close()
    await direct.close()
    out = {name: summarize_us(np.asarray(v) * 1e6) for name, v in samples.items()}
    out["added_p50_us"] = round(out["proxy"]["p50_us"] - out["direct"]["p50_us"], 1)
    out["added_p99_us"] = round(out["proxy"]["p99_us"] - out["direct"]["p99_us"], 1)
    return out


async def resumes(f: Fleet, sessions: int, drops: int, seed: int) -> dict:
    rng = random.Random(seed)
    live = [await Session(f.url).open() for _ in range(sessions)]
    spread: dict[str, int] = {}
    for s in live:
        spread[s.id.split("-")[1]] = spread.get(s.id.split("-")[1], 0) + 1
    answers: dict[str, int] = {}
    seconds = []
    for _ in range(drops):
        s = rng.choice(live)
        started = time.perf_counter()
        answer = await s.drop_and_resume()
        seconds.append(time.perf_counter() - started)
        answers[answer] = answers.get(answer, 0) + 1
    report = {"sessions": sessions, "spread": dict(sorted(spread.items())), "attempted": drops,
              "resumed_on_owner": answers.get("session.resumed", 0), "answers": answers,
              "sequence_gaps": sum(s.gaps for s in live), "sequence_duplicates": sum(s.duplicates for s in live),
              "resume_round_trip": summarize_us(np.asarray(seconds) * 1e6)}
    for s in live:
        await s.close()
    return report



async def race(f: Fleet, capacity: int, extra: int, rounds: int) -> dict:
    out = []
    for clients in [capacity] * rounds + [capacity + extra] * rounds:
        await until_room(f, capacity)
        holders: list = []

        async def client() -> str:
            try:
                ws = await connect(f.url + "/v1/voicechat", ping_interval=None, open_timeout=20)
            except InvalidStatus as exc:
                return f"http_{exc.response.status_code}"
            first = json.loads(await asyncio.wait_for(ws.recv(), 20))
            if first["type"] == "session.created":
                holders.append(ws)
                return "admitted"
            await ws.close()
            return first.get("error", {}).get("code", first["type"])

        results = await asyncio.gather(*(client() for _ in range(clients)))
        counts = {k: results.count(k) for k in sorted(set(results))}
        refused = clients - counts.get("admitted", 0)
        out.append({"clients": clients, "results": counts,
                    "refused_while_a_slot_was_free": max(0, refused - max(0, clients - capacity))})
        for ws in holders:
            await ws.close()
    return {"capacity": capacity, "extra": extra, "rounds": out,
            "refused_while_a_slot_was_free": sum(r["refused_while_a_slot_was_free"] for r in out)}


async def until_room(f: Fleet, capacity: int) -> None:
    """Every slot free and every agent's weight back (HAProxy's view), before a round."""
    deadline = time.monotonic() + 30
    while True:
        free = 0
        for r in f.replicas:
            with urllib.request.urlopen(f"http://{r.host}:{r.port}/health") as response:  # noqa: S310
                free += json.loads(response.read())["replica"]["free_slots"]
        weights = [int(f.runtime(f"get weight voicechat/{r.name}").split()[0]) for r in f.replicas]
        if free == capacity and all(weights):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fleet did not empty: free {free}, weights {weights}")
        await asyncio.sleep(0.1)  # ok: HAProxy's next agent check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=4, help="slots per replica (serve --max-sessions)")
    parser.add_argument("--drops", type=int, default=240)
    parser.add_argument("--pings", type=int, default=400)
    parser.add_argument("--extra", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "fleet.json")
    args = parser.parse_args()
    capacity = args.replicas * args.sessions
    with Fleet(args.replicas, free_port(), serve_args=["--max-sessions", str(args.sessions)]) as f:
        async def run() -> dict:
            return {"latency": await latency(f, args.pings),
                    "resumes": await resumes(f, capacity, args.drops, args.seed),
                    "admission": await race(f, capacity, args.extra, args.rounds)}

        report = asyncio.run(run())
    report = {"benchmark": "fleet", "timestamp": now_utc(), "parameters": vars(args) | {"out": str(args.out)},
              **report}
    lat, res, adm = report["latency"], report["resumes"], report["admission"]
    print(f"replicas {args.replicas} x {args.sessions} sessions behind HAProxy")
    print(f"heartbeat round trip p50/p99 us: direct {lat['direct']['p50_us']:.0f}/{lat['direct']['p99_us']:.0f}, "
          f"proxy {lat['proxy']['p50_us']:.0f}/{lat['proxy']['p99_us']:.0f}; added "
          f"{lat['added_p50_us']:.0f}/{lat['added_p99_us']:.0f}")
    print(f"resumes on the owner: {res['resumed_on_owner']}/{res['attempted']} (answers {res['answers']}); "
          f"sequence gaps {res['sequence_gaps']}, duplicates {res['sequence_duplicates']}; spread {res['spread']}")
    for r in adm["rounds"]:
        print(f"admission race: {r['clients']} clients at once -> {r['results']}; refused while a slot was free: "
              f"{r['refused_while_a_slot_was_free']}")
    print(f"wrote {write_report(report, args.out)}")
    ok = res["resumed_on_owner"] == res["attempted"] and adm["refused_while_a_slot_was_free"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

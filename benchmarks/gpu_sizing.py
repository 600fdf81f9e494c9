"""How many Nemotron VoiceChat sessions one GPU carries: per-session memory from the model's configuration and a cost
model of one 80 ms tick with and without the engine tick (batched positions), for an H100 and an H200.

No GPU here: every input is a stated assumption (``MODEL``, ``GPUS``, ``COSTS``), the figures are what follows from
them, and the first GPU run replaces the per-row costs with measured ones (``--costs FILE``, a JSON object with the
keys of ``COSTS``; docs/running-on-gpu.md, check 7). Memory: the thinker's attention KV (bf16) and Mamba state
(fp32 SSM + bf16 conv, one slot per sequence), the talker's KV (fp32; full-attention layers hold the whole request,
sliding-window layers its window; the request grows up to 3 tokens a position) and the codec's incremental cache,
each at a session's guard (``max_session_model_frames``). Time: a decode reads every weight once per forward
whatever the batch (``fixed``: weights / bandwidth + launch overhead), and some work is per request whatever the
batch (``row``: vLLM-Omni runs the thinker's perception, the talker's MoG sampling and the codec per request).

    python benchmarks/gpu_sizing.py [--sessions 8] [--slot-forwards 2] [--costs measured.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import now_utc, write_report  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30

MODEL = {
    # Stage 0: NemotronH (Nemotron-Nano-9B-v2) + FastConformer + heads, bf16 (docs: ../shared/spec/model.md)
    "thinker_params": 9.5e9,
    "attention_layers": 4, "kv_heads": 8, "head_dim": 128,
    "mamba_layers": 27,
    # [unverified for the 9B: the Nemotron-Nano-v2 family's config; `verify-checkpoint` shows the shapes]
    "mamba_heads": 128, "mamba_head_dim": 80, "ssm_state": 128, "n_groups": 8, "conv_kernel": 4,
    "perception_params": 0.614e9,
    # Stage 1: EAR-TTS, fp32; Gemma3-style 28 layers, 16 heads x 72, sliding window 1500, full attention every 6th
    "talker_params": 0.797e9, "talker_layers": 28, "talker_full_every": 6, "talker_window": 1500,
    "talker_head_dim": 72,
    "talker_kv_heads": 16,  # [unverified: the heads count; GQA would divide the talker KV by heads / kv_heads]
    "talker_init_len": 37, "talker_tokens_per_position": 3,
    # Stage 2: the RVQ-VAE codec, fp32
    "codec_params": 0.2e9, "codec_cache_mib": 8.0,  # [estimate: the incremental causal-conv cache per stream]
}

GPUS = {
    "H100 SXM (80 GB, 3.35 TB/s)": {"memory_gib": 80, "bandwidth_tbs": 3.35},
    "H200 (141 GB, 4.8 TB/s)": {"memory_gib": 141, "bandwidth_tbs": 4.8},
}

COSTS = {
    # ms per forward on top of reading the weights: scheduler, input preparation, CUDA graph launch, outputs
    "stage0_overhead_ms": 1.0, "stage1_overhead_ms": 0.5, "stage2_overhead_ms": 0.5,
    # ms per request per position, whatever the batch [estimates until measured]: the thinker's streaming
    # perception (24 Conformer layers, eager, per request), the talker's MoG sampling (one captured graph per row,
    # about 2 ms of GPU work by vLLM-Omni's own account in talker_native.py), the codec's decode (per request)
    "stage0_row_ms": 1.5, "stage1_row_ms": 2.0, "stage2_row_ms": 1.5,
    # of the 80 ms tick, what the engine may use (the rest: the API process, jitter, the audio lag's slack)
    "tick_budget_ms": 64.0,
}

DEPLOY = {  # deploy/voicechat.yaml
    "max_session_model_frames": 5400, "stage0_max_model_len": 9216, "stage1_max_model_len": 16384,
    "gpu_memory_utilization": {"stage0": 0.58, "stage1": 0.16, "stage2": 0.06},
    "activation_reserve_gib": {"stage0": 4.0, "stage1": 1.0, "stage2": 1.0},
}


def memory_per_session(m: dict, d: dict) -> dict:
    """Bytes one session holds at its guard, by component."""
    positions = d["max_session_model_frames"]
    kv_token = 2 * m["attention_layers"] * m["kv_heads"] * m["head_dim"] * 2  # K and V, bf16
    thinker_kv = kv_token * d["stage0_max_model_len"]
    inner = m["mamba_heads"] * m["mamba_head_dim"]
    ssm = m["mamba_layers"] * inner * m["ssm_state"] * 4  # fp32 (mamba_ssm_cache_dtype)
    conv = m["mamba_layers"] * (inner + 2 * m["n_groups"] * m["ssm_state"]) * (m["conv_kernel"] - 1) * 2
    talker_tokens = min(d["stage1_max_model_len"], m["talker_init_len"] + m["talker_tokens_per_position"] * positions)
    full_layers = m["talker_layers"] // m["talker_full_every"]
    sliding_layers = m["talker_layers"] - full_layers
    talker_token_layer = 2 * m["talker_kv_heads"] * m["talker_head_dim"] * 4  # fp32
    talker_kv = talker_token_layer * (full_layers * talker_tokens
                                      + sliding_layers * min(talker_tokens, m["talker_window"]))
    return {"thinker_kv": thinker_kv, "mamba_ssm": ssm, "mamba_conv": conv, "talker_kv": talker_kv,
            "codec_cache": m["codec_cache_mib"] * MIB, "talker_tokens": talker_tokens}


def memory_limits(m: dict, d: dict, gpu: dict, per: dict) -> dict:
    """Sessions each stage's memory share holds, after its weights and activations."""
    total = gpu["memory_gib"] * GIB
    share = d["gpu_memory_utilization"]
    weights = {"stage0": m["thinker_params"] * 2, "stage1": m["talker_params"] * 4, "stage2": m["codec_params"] * 4}
    need = {"stage0": per["thinker_kv"] + per["mamba_ssm"] + per["mamba_conv"], "stage1": per["talker_kv"],
            "stage2": per["codec_cache"]}
    out = {}
    for stage in ("stage0", "stage1", "stage2"):
        free = share[stage] * total - weights[stage] - d["activation_reserve_gib"][stage] * GIB
        out[stage] = {"share_gib": round(share[stage] * total / GIB, 1), "weights_gib": round(weights[stage] / GIB, 1),
                      "per_session_mib": round(need[stage] / MIB, 1),
                      "sessions": max(0, math.floor(free / need[stage]))}
    return out


def tick_ms(m: dict, gpu: dict, c: dict, sessions: int, forwards: int) -> dict:
    """One tick's engine time when ``sessions`` positions run in ``forwards`` forwards per stage."""
    bandwidth = gpu["bandwidth_tbs"] * 1e12
    fixed = {"stage0": m["thinker_params"] * 2 / bandwidth * 1e3 + c["stage0_overhead_ms"],
             "stage1": m["talker_params"] * 4 / bandwidth * 1e3 + c["stage1_overhead_ms"],
             "stage2": m["codec_params"] * 4 / bandwidth * 1e3 + c["stage2_overhead_ms"]}
    rows = c["stage0_row_ms"] + c["stage1_row_ms"] + c["stage2_row_ms"]
    total = forwards * sum(fixed.values()) + sessions * rows
    return {"fixed_ms_per_forward": {k: round(v, 2) for k, v in fixed.items()}, "row_ms": rows,
            "tick_ms": round(total, 1)}


def capacity(m: dict, gpu: dict, c: dict, forwards_of) -> int:
    n = 0
    while tick_ms(m, gpu, c, n + 1, forwards_of(n + 1))["tick_ms"] <= c["tick_budget_ms"]:
        n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8, help="the deployment's max_sessions to check (default 8)")
    parser.add_argument("--slot-forwards", type=int, default=2,
                        help="forwards per tick with the engine tick: sessions at random phases fall into this many "
                             "ticks of a 40 ms slot (default 2)")
    parser.add_argument("--costs", type=Path, help="JSON overriding COSTS (measured on a GPU)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_sizing.json"))
    args = parser.parse_args()
    costs = {**COSTS, **(json.loads(args.costs.read_text()) if args.costs else {})}
    per = memory_per_session(MODEL, DEPLOY)
    report: dict = {"timestamp": now_utc(), "model": MODEL, "costs": costs, "deploy": DEPLOY,
                    "memory_per_session_mib": {k: round(v / MIB, 1) for k, v in per.items() if k != "talker_tokens"},
                    "talker_tokens_at_guard": per["talker_tokens"], "gpus": {}}
    print(f"per session at its guard ({DEPLOY['max_session_model_frames']} positions): "
          + ", ".join(f"{k} {v} MiB" for k, v in report["memory_per_session_mib"].items()))
    for name, gpu in GPUS.items():
        limits = memory_limits(MODEL, DEPLOY, gpu, per)
        unbatched = capacity(MODEL, gpu, costs, lambda n: n)
        batched = capacity(MODEL, gpu, costs, lambda n: min(n, args.slot_forwards))
        aligned = capacity(MODEL, gpu, costs, lambda n: 1)
        at = {"unbatched": tick_ms(MODEL, gpu, costs, args.sessions, args.sessions),
              "batched": tick_ms(MODEL, gpu, costs, args.sessions, min(args.sessions, args.slot_forwards))}
        memory_bound = min(v["sessions"] for v in limits.values())
        report["gpus"][name] = {"memory": limits, "memory_bound_sessions": memory_bound,
                                "compute_bound_sessions": {"unbatched": unbatched,
                                                           f"tick_{args.slot_forwards}_forwards": batched,
                                                           "tick_aligned": aligned},
                                f"tick_at_{args.sessions}_sessions": at}
        print(f"\n{name}")
        for stage, v in limits.items():
            print(f"  {stage}: {v['share_gib']} GiB share, {v['weights_gib']} GiB weights, "
                  f"{v['per_session_mib']} MiB a session -> {v['sessions']} sessions by memory")
        print(f"  by compute (tick budget {costs['tick_budget_ms']} ms): {unbatched} unbatched, {batched} with the "
              f"engine tick ({args.slot_forwards} forwards a tick), {aligned} when every session is in one tick")
        print(f"  {args.sessions} sessions: {at['unbatched']['tick_ms']} ms a tick unbatched, "
              f"{at['batched']['tick_ms']} ms batched; memory holds {memory_bound}")
    print(f"\nreport: {write_report(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

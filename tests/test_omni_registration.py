"""Registration of our vLLM-Omni 0.30.0 pipeline: entry points, early hook, deploy YAML.

The first three tests need no vLLM; the rest are skipped unless ``vllm_omni`` imports (run them in the omni venv:
``scripts/install_omni_cpu.sh``). Two of those start the real ``vllm-omni`` CLI in subprocesses (about 20 s
each on two cores; they run concurrently).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vllm_omni_voicechat.omni.register import (
    ENTRY_POINT_GROUPS,
    ENTRY_POINT_NAME,
    ENTRY_POINT_VALUE,
    PACKAGED_DEPLOY_CONFIG,
    PIPELINE_KEY,
    register,
)

try:
    import vllm_omni  # noqa: F401

    _NO_OMNI: str | None = None
except ImportError as exc:  # the same condition as pytest.importorskip("vllm_omni") in test_omni_plugin.py
    _NO_OMNI = f"vllm_omni is not importable ({exc}); create an omni venv with scripts/install_omni_cpu.sh"
requires_omni = pytest.mark.skipif(_NO_OMNI is not None, reason=_NO_OMNI or "")

REPO = Path(__file__).resolve().parent.parent
REPO_DEPLOY_CONFIG = "deploy/voicechat.yaml"  # as a user types it, from the repository root
PLUGIN_PATH = "vllm_omni_voicechat.omni.plugin.VoiceChatDuplexPlugin"
CHECKPOINT_NAME = "NVIDIA-NemotronLabs-VoiceChat-11B"  # its config.json has no model_type
CLI_TIMEOUT_S = 300
STAGES = 3


# --------------------------------------------------------------------------- no vLLM needed


@pytest.mark.parametrize("name", ["voicechat.yaml", "voicechat-cpu.yaml"])
def test_deploy_yaml_copies_are_identical(name):
    assert (REPO / "deploy" / name).read_bytes() == (PACKAGED_DEPLOY_CONFIG.parent / name).read_bytes()


def test_pyproject_declares_both_entry_points_and_the_yaml_as_package_data():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    for group in ENTRY_POINT_GROUPS:
        assert project["project"]["entry-points"][group] == {ENTRY_POINT_NAME: ENTRY_POINT_VALUE}
    patterns = project["tool"]["setuptools"]["package-data"]["vllm_omni_voicechat.omni"]
    package_dir = REPO / "vllm_omni_voicechat" / "omni"
    assert PACKAGED_DEPLOY_CONFIG in {path for pattern in patterns for path in package_dir.glob(pattern)}


_LIGHT_IMPORT_PROBE = """
import json, sys
at_startup = "vllm_omni_voicechat.omni.register" in sys.modules
before = set(sys.modules)
import vllm_omni_voicechat.omni.register as reg
added = sorted(set(sys.modules) - before)
sys.modules["vllm_omni"] = None  # as if vLLM-Omni were not installed (e.g. plain `vllm serve`)
result = reg.register()
print(json.dumps({"at_startup": at_startup, "added": added, "result": result}))
"""


def test_register_module_imports_nothing_heavy_and_is_a_noop_without_vllm_omni():
    done = subprocess.run(
        [sys.executable, "-c", _LIGHT_IMPORT_PROBE], check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    # Python never loads entry points by itself: a bare interpreter has not imported the target.
    assert probe["at_startup"] is False
    ours = {"vllm_omni_voicechat", "vllm_omni_voicechat.omni", "vllm_omni_voicechat.omni.register"}
    foreign = [m for m in probe["added"] if m not in ours and m.split(".")[0] not in sys.stdlib_module_names]
    assert foreign == []  # no vllm, vllm_omni, torch, transformers, numpy ...
    assert probe["result"] is False


# --------------------------------------------------------------------------- the real vLLM-Omni stack


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> Path:
    """A weightless stand-in for the checkpoint folder: its name and a config.json without model_type."""
    path = tmp_path_factory.mktemp("ckpt") / CHECKPOINT_NAME
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({"architectures": ["NemotronVoiceChatThinkerForConditionalGeneration"]})
    )
    return path


@pytest.fixture()
def registry():
    from vllm_omni.config import pipeline_registry

    register()
    return pipeline_registry


@requires_omni
def test_entry_points_are_installed_under_both_groups_and_resolve_to_register():
    from importlib.metadata import entry_points

    from vllm_omni.plugins import load_omni_plugins_by_group

    for group in ENTRY_POINT_GROUPS:
        ours = [ep for ep in entry_points(group=group) if ep.name == ENTRY_POINT_NAME]
        assert len(ours) == 1, f"{group}: reinstall the package (pip install --no-deps -e .) to refresh its metadata"
        assert ours[0].value == ENTRY_POINT_VALUE
        assert ours[0].dist is not None and ours[0].dist.name == "vllm-omni-voicechat"
        assert ours[0].load() is register
    # vLLM-Omni's own loader for its group (which otherwise honours VLLM_PLUGINS exactly like vLLM's) finds it.
    assert load_omni_plugins_by_group("vllm_omni.general_plugins")[ENTRY_POINT_NAME] is register


@requires_omni
def test_pipeline_is_the_in_tree_topology_with_our_plugin_mode_and_deploy_default():
    from vllm_omni.config.stage_config import _DEPLOY_DIR, load_deploy_config
    from vllm_omni.model_executor.models.nemotron_voicechat.pipeline import NEMOTRON_VOICECHAT_PIPELINE

    from vllm_omni_voicechat.omni import plugin
    from vllm_omni_voicechat.omni.pipeline import VOICECHAT_DUPLEX_PLUGIN, VOICECHAT_PIPELINE

    assert VOICECHAT_DUPLEX_PLUGIN == plugin.PLUGIN_PATH == PLUGIN_PATH
    from vllm_omni_voicechat.omni.scheduler import STAGE_SCHEDULERS

    ours = {"model_type", "duplex_plugin", "default_session_mode", "default_deploy_config_name", "stages"}
    for f in dataclasses.fields(VOICECHAT_PIPELINE):
        if f.name not in ours:
            assert getattr(VOICECHAT_PIPELINE, f.name) == getattr(NEMOTRON_VOICECHAT_PIPELINE, f.name), f.name
    # the in-tree stages, each with a stage scheduler of ours (the engine tick, chunk waits, the batch log)
    assert len(VOICECHAT_PIPELINE.stages) == 3
    assert [dataclasses.replace(s, scheduler_cls=None) for s in VOICECHAT_PIPELINE.stages] == [
        dataclasses.replace(s, scheduler_cls=None) for s in NEMOTRON_VOICECHAT_PIPELINE.stages]
    assert all(s.scheduler_cls is None for s in NEMOTRON_VOICECHAT_PIPELINE.stages)
    assert [s.scheduler_cls for s in VOICECHAT_PIPELINE.stages] == [STAGE_SCHEDULERS[i] for i in range(3)]
    assert VOICECHAT_PIPELINE.model_type == PIPELINE_KEY
    assert VOICECHAT_PIPELINE.duplex_plugin == PLUGIN_PATH
    assert VOICECHAT_PIPELINE.default_session_mode == "duplex"
    # vLLM-Omni joins the default name onto its own deploy folder; an absolute name lands on our YAML.
    assert _DEPLOY_DIR / VOICECHAT_PIPELINE.default_deploy_config_name == PACKAGED_DEPLOY_CONFIG
    assert load_deploy_config(_DEPLOY_DIR / VOICECHAT_PIPELINE.default_deploy_config_name).pipeline == PIPELINE_KEY


@requires_omni
def test_register_is_idempotent_and_never_clobbers(registry, monkeypatch):
    from vllm_omni_voicechat.omni.pipeline import VOICECHAT_PIPELINE

    calls = []
    real = registry.register_pipeline
    monkeypatch.setattr(registry, "register_pipeline", lambda *a, **k: (calls.append(a), real(*a, **k)))
    monkeypatch.delitem(registry.OMNI_PIPELINES, PIPELINE_KEY)
    assert register() is True
    assert register() is False  # the second group, another loader: no second register_pipeline, no warning
    assert len(calls) == 1 and registry.OMNI_PIPELINES[PIPELINE_KEY] is VOICECHAT_PIPELINE

    foreign = object()
    monkeypatch.setitem(registry.OMNI_PIPELINES, PIPELINE_KEY, foreign)
    assert register() is False
    assert registry.OMNI_PIPELINES[PIPELINE_KEY] is foreign and len(calls) == 1
    # The in-tree Nemotron keys are untouched.
    from vllm_omni.model_executor.models.nemotron_voicechat.pipeline import NEMOTRON_VOICECHAT_PIPELINE

    for key in ("nemotron_voicechat", "nemotron_labs_voicechat"):
        assert registry.OMNI_PIPELINES[key] is NEMOTRON_VOICECHAT_PIPELINE


@requires_omni
def test_vllm_load_general_plugins_registers_our_pipeline(registry, monkeypatch):
    import vllm.plugins

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delitem(registry.OMNI_PIPELINES, PIPELINE_KEY)
    vllm.plugins.load_general_plugins()
    assert registry.OMNI_PIPELINES[PIPELINE_KEY].duplex_plugin == PLUGIN_PATH


@requires_omni
@pytest.mark.parametrize("where", ["repo", "package"])
def test_stage_config_factory_resolves_our_pipeline_and_deploy_yaml(where, registry, checkpoint_dir, monkeypatch):
    from vllm_omni.config.config_factory import StageConfigFactory
    from vllm_omni.config.stage_config import load_deploy_config

    if where == "repo":
        monkeypatch.chdir(REPO)
        deploy = REPO_DEPLOY_CONFIG  # relative, the way `--deploy-config deploy/voicechat.yaml` arrives
    else:
        deploy = str(PACKAGED_DEPLOY_CONFIG)
    model = str(checkpoint_dir)
    # The YAML's `pipeline:` wins over the checkpoint basename (which alone selects the in-tree Nemotron pipeline).
    pipeline = StageConfigFactory.get_pipeline_config(model=model, trust_remote_code=False, deploy_config_path=deploy)
    assert pipeline is registry.OMNI_PIPELINES[PIPELINE_KEY]
    assert pipeline.model_type == PIPELINE_KEY and pipeline.duplex_plugin == PLUGIN_PATH

    deploy_config = load_deploy_config(deploy)
    assert deploy_config.pipeline == PIPELINE_KEY
    assert deploy_config.session_mode == "duplex"
    assert deploy_config.duplex_session.max_sessions > 1
    assert len(deploy_config.stages) == STAGES

    config = StageConfigFactory.create_from_model(
        model, trust_remote_code=False, cli_overrides={}, deploy_config_path=deploy
    )
    assert config is not None and config.pipeline_config is pipeline
    assert len(config.stage_configs) == STAGES
    for stage in config.stage_configs:
        assert stage.model_config.session_mode == "duplex"
        assert stage.model_config.duplex_max_sessions == deploy_config.duplex_session.max_sessions


@requires_omni
def test_checkpoint_name_alone_still_selects_the_in_tree_pipeline(registry, checkpoint_dir):
    from vllm_omni.config.config_factory import StageConfigFactory
    from vllm_omni.model_executor.models.nemotron_voicechat.pipeline import NEMOTRON_VOICECHAT_PIPELINE

    # Our key is no substring of the checkpoint name, so registering it changes nothing for in-tree deployments.
    pipeline = StageConfigFactory.get_pipeline_config(model=str(checkpoint_dir), trust_remote_code=False)
    assert pipeline is NEMOTRON_VOICECHAT_PIPELINE


@requires_omni
def test_deploy_yaml_is_the_in_tree_streaming_duplex_merge_plus_our_changes():
    from vllm_omni.config.stage_config import _DEPLOY_DIR, load_deploy_config

    upstream = load_deploy_config(_DEPLOY_DIR / "nemotron_labs_voicechat_duplex.yaml")
    ours = load_deploy_config(PACKAGED_DEPLOY_CONFIG)
    sessions = ours.duplex_session.max_sessions
    assert sessions == 8  # sized from the model (docs/running-on-gpu.md, "Sizing"; benchmarks/gpu_sizing.py)
    # vLLM-Omni's duplex YAML serves one session (window 1); every admitted session must stream at once
    assert upstream.active_stream_window == 1 and upstream.duplex_session.max_sessions == 1
    expected = dataclasses.replace(
        upstream,
        pipeline=PIPELINE_KEY,
        active_stream_window=sessions,
        # the chunks between stages through our connector: vLLM-Omni's shared-memory one, received without polling
        connectors={name: {**spec, "name": "VoiceChatSharedMemoryConnector"}
                    for name, spec in upstream.connectors.items()},
        # our server owns idle policy and runs its own warmup (vLLM-Omni's would hit our routes)
        duplex_session=dataclasses.replace(upstream.duplex_session, max_sessions=sessions, idle_ttl_s=None,
                                           warmup_frames=0),
        stages=[dataclasses.replace(s, max_num_seqs=sessions) for s in upstream.stages],
    )
    # Stage 0 runs our thinker (RNNT evidence, controls) on the LLM's tokenizer, with room for the position guard
    stage0 = expected.stages[0]
    assert stage0.gpu_memory_utilization == 0.62 and expected.stages[1].gpu_memory_utilization == 0.12
    expected.stages[0] = dataclasses.replace(stage0, max_model_len=9216, gpu_memory_utilization=0.58, engine_extras={
        **stage0.engine_extras,
        "model_arch": "VoiceChatRealtimeThinkerForConditionalGeneration",
        "tokenizer": "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
    })
    # Stage 1's request must hold its 37-token speaker prefill + max_tokens within max_model_len (16,384), as
    # vLLM-Omni's own non-streaming YAML has it (the streaming one says 16,383); omni/settings checks the guard
    stage1 = expected.stages[1]
    assert stage1.max_model_len == 16384 and stage1.default_sampling_params["max_tokens"] == 16383
    # and runs our talker: vLLM-Omni's, drawing its noise from a stream per session (omni/talker)
    # (its fp32 KV for eight full-length sessions: a larger share, taken from Stage 0's)
    expected.stages[1] = dataclasses.replace(stage1, gpu_memory_utilization=0.16, default_sampling_params={
        **stage1.default_sampling_params, "max_tokens": 16347}, engine_extras={
        **stage1.engine_extras, "model_arch": "VoiceChatRealtimeTalkerForConditionalGeneration"})
    # and Stage 2 our codec: vLLM-Omni's, a forward's sessions decoded in one call (omni/codec)
    stage2 = expected.stages[2]
    expected.stages[2] = dataclasses.replace(stage2, engine_extras={
        **stage2.engine_extras, "model_arch": "VoiceChatRealtimeCode2Wav"})
    assert ours == expected


@requires_omni
def test_resolved_duplex_plugin_loads_and_validates(registry):
    from vllm.sampling_params import SamplingParams
    from vllm_omni.engine.duplex.plugin import load_duplex_plugin, validate_duplex_plugin_sampling
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio

    from vllm_omni_voicechat.omni.plugin import VoiceChatDuplexPlugin

    path = registry.OMNI_PIPELINES[PIPELINE_KEY].duplex_plugin
    plugin = load_duplex_plugin(path, encode_audio)
    assert isinstance(plugin, VoiceChatDuplexPlugin)
    validate_duplex_plugin_sampling(plugin, sampling_defaults=tuple(SamplingParams() for _ in range(STAGES)))


# --------------------------------------------------------------------------- the real CLI (subprocesses)

# Runs `vllm-omni serve CKPT --omni --deploy-config deploy/voicechat.yaml` through vLLM-Omni's real CLI main and
# stops it at the serving decision (vllm_omni.entrypoints.openai.api_server._should_serve_duplex, the first
# pipeline resolution in the API process), recording what the registry held at each point. Spies only; the
# registration itself is whatever the installed entry points do.
_EARLY_HOOK_PROBE = """
import json, os, sys
KEY = %(key)r
record = {}
import vllm.engine.arg_utils as vllm_arg_utils
import vllm.plugins
from vllm_omni.config.pipeline_registry import OMNI_PIPELINES
import vllm_omni.entrypoints.openai.api_server as api_server

record["before_main"] = {
    "plugins_loaded": vllm.plugins.plugins_loaded,
    "registered": KEY in OMNI_PIPELINES,
    "register_module_imported": "vllm_omni_voicechat.omni.register" in sys.modules,
}
real_load = vllm_arg_utils.load_general_plugins
def spy_load():  # what AsyncEngineArgs.add_cli_args calls while the serve parser is built
    before = KEY in OMNI_PIPELINES
    real_load()
    record.setdefault("add_cli_args_loads", []).append([before, KEY in OMNI_PIPELINES])
vllm_arg_utils.load_general_plugins = spy_load

real_should = api_server._should_serve_duplex
def spy_should(model, kwargs):
    record["at_resolution"] = {"registered": KEY in OMNI_PIPELINES, "deploy_config": kwargs.get("deploy_config")}
    record["serve_duplex"] = real_should(model, kwargs)
    from vllm_omni.config.config_factory import StageConfigFactory
    p = StageConfigFactory.get_pipeline_config(
        model=model, trust_remote_code=False, deploy_config_path=kwargs.get("deploy_config"))
    record["resolved"] = [p.model_type, p.duplex_plugin]
    print("PROBE " + json.dumps(record), flush=True)
    os._exit(0)  # stop before any engine starts
api_server._should_serve_duplex = spy_should

sys.argv = ["vllm-omni", "serve", %(model)r, "--omni", "--deploy-config", %(deploy)r, "--port", "0"]
from vllm_omni.entrypoints.cli.main import main
main()
print("PROBE-NOT-REACHED " + json.dumps(record), flush=True)
"""


@pytest.fixture(scope="module")
def cli_runs(checkpoint_dir) -> dict[str, subprocess.CompletedProcess[str]]:
    """Both CLI subprocesses, started together (each spends ~20 s importing vLLM-Omni)."""
    cli = Path(sys.executable).with_name("vllm-omni")
    if not cli.exists():
        pytest.fail("vllm_omni is importable but its `vllm-omni` console script is missing")
    probe = _EARLY_HOOK_PROBE % {"key": PIPELINE_KEY, "model": str(checkpoint_dir), "deploy": REPO_DEPLOY_CONFIG}
    commands = {
        # DEBUG makes vLLM list the vllm.general_plugins entry points it loads while building the parser.
        "help": ([str(cli), "serve", "--omni", "--help"], {"VLLM_LOGGING_LEVEL": "DEBUG"}),
        "probe": ([sys.executable, "-c", probe], {}),
        # our wrapper delegates a real checkpoint to `vllm-omni serve ... --omni --deploy-config <packaged>`
        "wrapper_help": ([str(Path(sys.executable).with_name("vllm-omni-voicechat")), "serve", str(checkpoint_dir),
                          "--help"], {}),
    }
    procs = {
        name: subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, (argv, extra) in commands.items()
    }
    runs = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            raise
        runs[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    return runs


@requires_omni
def test_vllm_omni_voicechat_serve_model_help_is_vllm_omni_serve_help(cli_runs):
    done = cli_runs["wrapper_help"]
    assert done.returncode == 0, done.stdout[-4000:]
    assert "usage: vllm serve" in done.stdout and "--omni" in done.stdout


@requires_omni
def test_vllm_omni_serve_help_exits_0_with_our_entry_point_loaded(cli_runs):
    done = cli_runs["help"]
    assert done.returncode == 0, done.stdout[-4000:]
    assert "usage: vllm serve" in done.stdout and "--omni" in done.stdout
    assert f"{ENTRY_POINT_NAME} -> {ENTRY_POINT_VALUE}" in done.stdout
    assert "Failed to load plugin" not in done.stdout


@requires_omni
def test_cli_registers_our_pipeline_before_it_resolves_the_deploy_yaml(cli_runs):
    done = cli_runs["probe"]
    lines = [line for line in done.stdout.splitlines() if "PROBE" in line]
    assert done.returncode == 0 and lines and "PROBE-NOT-REACHED" not in lines[-1], done.stdout[-4000:]
    record = json.loads(lines[-1].split("PROBE ", 1)[1])
    # Nothing registered it before the CLI ran...
    assert record["before_main"] == {"plugins_loaded": False, "registered": False, "register_module_imported": False}
    # ...the first plugin load of the serve parser (vllm.general_plugins, our entry point) did...
    assert record["add_cli_args_loads"][0] == [False, True]
    # ...so the serving decision sees our key, picks duplex serving, and resolves our pipeline.
    assert record["at_resolution"] == {"registered": True, "deploy_config": REPO_DEPLOY_CONFIG}
    assert record["serve_duplex"] is True
    assert record["resolved"] == [PIPELINE_KEY, PLUGIN_PATH]


@requires_omni
def test_our_thinker_architecture_maps_to_the_nemotron_model_type_through_the_private_table():
    """Private seam (docs/running-on-gpu.md): vLLM-Omni's ``arg_utils._ARCH_TO_MODEL_TYPE`` resolves a config with
    no ``model_type`` by its architecture; without our entry the checkpoint's config cannot load for Stage 0."""
    from vllm_omni.engine import arg_utils

    from vllm_omni_voicechat.omni.thinker import ARCHITECTURE, MODEL_TYPE, register_architecture

    register_architecture()
    assert isinstance(arg_utils._ARCH_TO_MODEL_TYPE, dict)
    assert arg_utils._ARCH_TO_MODEL_TYPE[ARCHITECTURE] == MODEL_TYPE

import os
import sys, time; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from vllm_omni_voicechat.omni.register import register; register()
from vllm_omni.config.stage_config import load_deploy_config, resolve_deploy_yaml
from vllm_omni.config.config_factory import StageConfigFactory
dc = load_deploy_config("vc_extra.yaml")
print("DeployConfig ok; warmup_frames", dc.duplex_session.warmup_frames, "max_sessions", dc.duplex_session.max_sessions, "pipeline", dc.pipeline)
print("raw voicechat block:", resolve_deploy_yaml("vc_extra.yaml").get("voicechat"))
pc = StageConfigFactory.get_pipeline_config(model="nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", trust_remote_code=False, deploy_config_path="vc_extra.yaml")
print("pipeline:", pc.model_type, pc.duplex_plugin)
try:
    from vllm_omni.config.stage_config import DuplexSessionRuntimeConfig
    DuplexSessionRuntimeConfig(warmup_positions=2)
except TypeError as e:
    print("unknown duplex_session key ->", type(e).__name__, e)

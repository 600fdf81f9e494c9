"""A talker request's seed (omni/talker/seed.py): the same in every process, distinct per session and epoch."""

from __future__ import annotations

import subprocess
import sys

from vllm_omni_voicechat.omni.talker.seed import MAX_SEED, digest_seed, epoch_of, request_seed

RID = "duplex-s.ZHVwbGV4LWFi.e.{}.r.stage0"


def test_the_epoch_is_read_from_the_request_id():
    assert epoch_of(RID.format(0)) == 0
    assert epoch_of(RID.format(12)) == 12
    assert epoch_of("not-a-duplex-id") == 0


def test_a_session_seed_gives_each_epoch_a_stream_of_its_own():
    seeds = {request_seed(RID.format(e), 42) for e in range(20)}
    assert len(seeds) == 20 and all(0 <= s <= MAX_SEED for s in seeds)
    assert request_seed(RID.format(3), 42) == request_seed("duplex-s.other.e.3.r.stage0", 42)  # not the id's
    assert request_seed(RID.format(3), 42) != request_seed(RID.format(3), 43)


def test_without_a_session_seed_the_request_id_is_the_seed():
    assert request_seed(RID.format(0), None) != request_seed(RID.format(1), None)
    assert request_seed(RID.format(0), None) == request_seed(RID.format(0), None)


def test_the_digest_is_the_same_in_another_process():
    code = "from vllm_omni_voicechat.omni.talker.seed import digest_seed; print(digest_seed('prompt', 'Be brief.'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(other) == digest_seed("prompt", "Be brief.")

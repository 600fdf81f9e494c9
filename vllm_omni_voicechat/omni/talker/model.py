"""``VoiceChatRealtimeTalker``: vLLM-Omni 0.30.0's Nemotron VoiceChat talker, each request drawing its own noise.

The talker samples its mixture-of-Gaussians head with the process's default generator (``ear_tts_model.py``:
``torch.rand_like`` for the component, ``torch.randn_like`` for the noise, no generator argument), so with several
sessions on one engine each session's codes depended on the others' draws, and no run could be repeated. Here each
talker request keeps a generator state of its own (``seed.request_seed``: the session's seed and the epoch), and
every draw the parent makes for that request runs with that state swapped into the default generator of the device
the draw runs on, then saved back, so a request's codes depend on its own inputs and seed only, whatever else
shares the forward. Where a captured graph is replayed (CUDA) the parent samples the rows one at a time, each run
inside its session's swap; elsewhere (CPU) a forward's rows are sampled in one call with a generator per row
(``rows.sample_rows``), handed to the parent's loop in its order. Nothing of vLLM-Omni is patched: its per-row step
(the MoG step graph on the native path, ``_step_session`` on the eager one) runs unchanged inside the swap.

[GPU] On CUDA the native path replays a captured graph that draws from the default CUDA generator's Philox stream;
``set_state`` before a replay sets the seed and offset the replay reads (docs/running-on-gpu.md lists the check).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from typing import Any

import torch
from vllm_omni.model_executor.models.nemotron_voicechat.nemotron_voicechat_talker import (
    NemotronVoiceChatTalkerForConditionalGeneration,
)

from .rows import sample_rows
from .seed import request_seed

CAS_ROWS_KEPT = 4096
"""Subword table rows kept by token id, the least recently used dropped first: ~19 MB at the real talker's width
(1,152, fp32); a conversation's tokens fit."""

RNG_KEY = "vc_rng"
"""A talker session's generator state (in the parent's per-request session dict: dropped with the request)."""


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def initial_state(seed: int, device: torch.device) -> torch.Tensor:
    return torch.Generator(device=device).manual_seed(seed).get_state()


@contextlib.contextmanager
def session_draws(session: dict[str, Any], device: torch.device):
    """Run the enclosed draws on ``session``'s own stream (and leave the process's stream as it was)."""
    generator = _default_generator(device)
    saved = generator.get_state()
    generator.set_state(session[RNG_KEY])
    try:
        yield
    finally:
        session[RNG_KEY] = generator.get_state()
        generator.set_state(saved)


class _SessionDrawsMoG:
    """The parent's MoG step graph, each ``run`` on the stream of the session whose row it samples (the owner queues
    them in row order before the parent's sampling loop)."""

    def __init__(self, inner: Any, owner: VoiceChatRealtimeTalker) -> None:
        self.inner = inner
        self.owner = owner

    def run(self, hidden: torch.Tensor) -> torch.Tensor:
        session = self.owner._draws.popleft() if self.owner._draws else None
        if self.owner._sampled:  # the forward's rows were sampled together (rows.sample_rows)
            return self.owner._sampled.popleft()
        if session is None or RNG_KEY not in session:
            return self.inner.run(hidden)
        with session_draws(session, hidden.device):
            return self.inner.run(hidden)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class VoiceChatRealtimeTalker(NemotronVoiceChatTalkerForConditionalGeneration):
    @property
    def _mog_graph(self) -> Any:
        return self.__dict__.get("_vc_mog_graph")

    @_mog_graph.setter
    def _mog_graph(self, graph: Any) -> None:
        # The parent builds its MoG step graph at load and lazily on a first frame; both go through this setter.
        if graph is not None and not isinstance(graph, _SessionDrawsMoG):
            graph = _SessionDrawsMoG(graph, self)
        self.__dict__["_vc_mog_graph"] = graph

    def _queue(self, key: str) -> deque:
        # Made on first use: the parent's constructor reaches the MoG graph setter before ours could make them.
        queue = self.__dict__.get(key)
        if queue is None:
            queue = self.__dict__[key] = deque()
        return queue

    @property
    def _draws(self) -> deque:
        """The sessions of the rows the parent's loop will sample, in its order."""
        return self._queue("_vc_draws")

    @property
    def _sampled(self) -> deque:
        """Those rows' codes when they were sampled together (``rows.sample_rows``)."""
        return self._queue("_vc_sampled")

    def _seed(self, request_id: str, info: dict[str, Any], session: dict[str, Any], device: torch.device) -> None:
        base = info.get("_omni_seed")
        session[RNG_KEY] = initial_state(request_seed(request_id, base if isinstance(base, int) else None), device)

    def _init_native_session(self, request_id: str, info: dict[str, Any], device: torch.device) -> dict[str, Any]:
        session = super()._init_native_session(request_id, info, device)
        self._seed(request_id, info, session, device)
        return session

    def _init_session(self, request_id: str, info: dict[str, Any], device: torch.device) -> dict[str, Any]:
        session = super()._init_session(request_id, info, device)
        if isinstance(session, dict):
            self._seed(request_id, info, session, device)
        return session

    def _native_make_omni_output(self, hidden: torch.Tensor, **kwargs: Any):
        # The rows the parent will sample, in its order (its own filter: a native session with a pending step).
        infos = kwargs.get("model_intermediate_buffer") or kwargs.get("runtime_additional_information") or []
        draws, sampled = self._draws, self._sampled
        draws.clear()
        sampled.clear()
        rows: list[int] = []
        for index, info in enumerate(infos):
            request_id = info.get("request_id") if isinstance(info, dict) else None
            session = self._sessions.get(str(request_id)) if request_id is not None else None
            if session and session.get("use_native") and session.get("pending_step") is not None:
                draws.append(session)
                rows.append(index)
        try:
            if self._samples_together(hidden, draws):
                sampled.extend(self._sample_together(hidden, rows, draws, kwargs.get("request_token_spans")))
            return super()._native_make_omni_output(hidden, **kwargs)
        finally:
            draws.clear()
            sampled.clear()

    def _samples_together(self, hidden: torch.Tensor, sessions: deque) -> bool:
        """Whether this forward's rows go through one MoG call: several rows, all ours, all guided alike, and no
        captured graph to replay (on CUDA one replay per row is cheaper than one eager call for all)."""
        if len(sessions) < 2 or hidden.device.type == "cuda" or self._mog_graph is None:
            return False
        guided = {session.get("uncond_stream") is not None for session in sessions}
        if len(guided) != 1 or any(RNG_KEY not in session for session in sessions):
            return False
        return not guided.pop() or all(session.get("uncond_hidden") is not None for session in sessions)

    def _sample_together(self, hidden: torch.Tensor, rows: list[int], sessions: deque, spans: Any) -> list:
        if spans is None:
            return []  # the parent raises its own error for this
        conditional = [hidden[spans[i][1] - 1 : spans[i][1]] for i in rows]
        unconditional = None
        if sessions[0].get("uncond_stream") is not None:
            conditional = [row.to(self._dtype) for row in conditional]
            unconditional = [session["uncond_hidden"].to(self._dtype) for session in sessions]
        codes, states = sample_rows(self.tts.tts_model, self._mog_graph.generation_config, conditional,
                                    unconditional, [session[RNG_KEY] for session in sessions])
        for session, state in zip(sessions, states):
            session[RNG_KEY] = state
        return codes

    def _encode_cas_rows(self, ids: torch.Tensor) -> torch.Tensor:
        # A row of the parent's character-aware subword table is a function of its token id alone (the token's
        # characters through the encoder, plus per-id flag embeddings), and a duplex timeline grows by about one
        # token a position, mostly the same few (text pad): each row is encoded once, alone, and kept.
        rows = self.__dict__.get("_vc_cas_rows")
        if rows is None:
            rows = self.__dict__["_vc_cas_rows"] = OrderedDict()
        out = []
        for token in ids.reshape(-1).tolist():
            row = rows.get(token)
            if row is None:
                row = super()._encode_cas_rows(ids.new_tensor([token]))
                rows[token] = row
                while len(rows) > CAS_ROWS_KEPT:
                    rows.popitem(last=False)
            else:
                rows.move_to_end(token)
            out.append(row)
        return torch.cat(out) if out else super()._encode_cas_rows(ids)

    def _step_session(self, session: dict[str, Any]) -> tuple[torch.Tensor, bool]:
        if RNG_KEY not in session:
            return super()._step_session(session)
        device = session["timeline"].device if isinstance(session.get("timeline"), torch.Tensor) else torch.device("cpu")
        with session_draws(session, device):
            return super()._step_session(session)


__all__ = ["RNG_KEY", "VoiceChatRealtimeTalker", "initial_state", "session_draws"]

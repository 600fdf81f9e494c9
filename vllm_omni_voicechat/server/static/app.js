// The voicechat page: one WebSocket session (v3 or tiered), microphone capture through an AudioWorklet, a
// client-side voice-activity detector, scheduled playback, typed and tool turns. No framework, no build step.
// `window.voicechat` exposes what the page received and did, for tests and for the curious.

const FRAME_SAMPLES = 1280; // 80 ms at 16 kHz: one model position per append
const FRAME_MS = 80;
const INPUT_RATE = 16000;
const OUTPUT_RATE = { v3: 22050, tiered: 24000 }; // v3 is fixed; tiered is the session default
const PATHS = { v3: "/v1/voicechat", tiered: "/v1/duplex" };
const ONSET_FRAMES = 2; // loud frames that open a turn (160 ms: a click does not)
const HANGOVER_FRAMES = 8; // quiet frames that end it (640 ms)
const PREROLL_FRAMES = 5; // frames before the onset sent with the turn (400 ms: the first syllable)
const PREBUFFER_S = 0.12; // playback lead that absorbs network jitter
const MAX_LOG = 300;
const MAX_RESPONSES_KEPT = 24;

const CLOSE_WORDS = {
  1000: "closed normally",
  1001: "the server is going away",
  1002: "protocol error: the server refused an event in this state",
  1005: "closed without a status code",
  1006: "the connection dropped (no close frame)",
  1008: "refused by the server (policy)",
  1009: "a message was too big",
  1011: "server error: the session failed",
  1012: "the server is restarting",
  1013: "server busy: all session slots are in use, try again later",
};

const INSTRUCTIONS = "You are a helpful voice assistant. Use the local_time tool when asked for the time.";
const LOCAL_TIME = {
  name: "local_time",
  description: "The current local time on the user's device (24-hour clock).",
  parameters: { type: "object", properties: {} },
};

const $ = (id) => document.getElementById(id);
const now = () => performance.now();
const pad2 = (n) => String(n).padStart(2, "0");

function localTime() {
  const d = new Date();
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}

const TOOLS = { local_time: () => localTime() };

// ------------------------------------------------------------------------------------------ what tests read

const debug = {
  events: [], // received events (audio payloads dropped), oldest first, bounded
  sent: [], // sent event types with their ids (appends only counted)
  appendsSent: 0,
  metrics: 0,
  responses: {}, // response_id -> {turnId, text, status, reason, rate, chunks, scheduledSamples, droppedSamples}
  order: [], // response ids in creation order
  toolCalls: [], // {callId, name, arguments, output, state}
  latencies: [], // {n, kind, createdMs, firstAudioMs, status}
  errors: [], // what the banner showed: {kind, code, message, fatal, text}
  stops: [], // playback stops: {reason, responseId, unplayedMs}
  closes: [], // {code, reason, words}
  userTurns: [], // {key, transcript, final}
  state: "idle",
  configured: false,
  dialect: null,
  capabilities: null,
  pcmBase64(rid) {
    const r = this.responses[rid];
    if (!r) return null;
    const total = r.chunks.reduce((n, c) => n + c.length, 0);
    const all = new Int16Array(total);
    let at = 0;
    for (const c of r.chunks) { all.set(c, at); at += c.length; }
    return bytesToBase64(new Uint8Array(all.buffer));
  },
};
window.voicechat = debug;

// ------------------------------------------------------------------------------------------------ helpers

function bytesToBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function base64ToInt16(b64) {
  const bin = atob(b64);
  const view = new DataView(new ArrayBuffer(bin.length));
  for (let i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
  const out = new Int16Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true);
  return out;
}

function pcm16Base64(pcm) {
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] === 1) return bytesToBase64(new Uint8Array(pcm.buffer));
  const view = new DataView(new ArrayBuffer(pcm.length * 2)); // big-endian host: the wire is little-endian
  pcm.forEach((s, i) => view.setInt16(2 * i, s, true));
  return bytesToBase64(new Uint8Array(view.buffer));
}

function clock() {
  const d = new Date();
  const ms = String(d.getMilliseconds()).padStart(3, "0");
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}.${ms}`;
}

function logLine(dir, text) {
  const li = document.createElement("li");
  li.textContent = `${clock()} ${dir} ${text}`;
  const log = $("log");
  log.append(li);
  while (log.childElementCount > MAX_LOG) log.firstElementChild.remove();
}

// ------------------------------------------------------------------------------------------------ banner

function showBanner(text, level = "error") {
  $("banner-text").textContent = text;
  $("banner").dataset.level = level;
  $("banner").hidden = false;
}

function showError(kind, code, message, fatal) {
  const text = `${fatal ? "Fatal error" : "Error"} ${code}: ${message}`;
  debug.errors.push({ kind, code, message, fatal, text });
  showBanner(text, "error");
}

function setStatus(state, label) {
  debug.state = state;
  $("status").dataset.state = state;
  $("status").textContent = label;
}

// ------------------------------------------------------------------------------------------------ transcript

const bubbles = new Map(); // key -> element

function bubble(key, role, label) {
  let li = bubbles.get(key);
  if (!li) {
    li = document.createElement("li");
    li.className = role;
    li.innerHTML = '<span class="who"></span><span class="body"></span><span class="meta"></span>';
    li.querySelector(".who").textContent = label;
    $("transcript").append(li);
    bubbles.set(key, li);
    li.scrollIntoView({ block: "end" });
  }
  return li;
}

function setBubble(key, role, label, text, meta) {
  const li = bubble(key, role, label);
  if (text !== undefined) li.querySelector(".body").textContent = text;
  if (meta !== undefined) li.querySelector(".meta").textContent = meta;
  return li;
}

function note(text) {
  const li = document.createElement("li");
  li.className = "note";
  li.textContent = text;
  $("transcript").append(li);
}

// ------------------------------------------------------------------------------------------------ playback

class Player {
  constructor(rate) {
    this.ctx = new AudioContext({ sampleRate: rate, latencyHint: "interactive" });
    this.next = 0;
    this.sources = new Set();
  }

  // Back to back on the context's clock: each chunk starts where the previous one ends, so arrival jitter
  // below the lead never shows; an underrun re-primes the lead.
  enqueue(samples, rate) {
    const buffer = this.ctx.createBuffer(1, samples.length, rate);
    const data = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) data[i] = samples[i] / 32768;
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.ctx.destination);
    const t = this.ctx.currentTime;
    if (this.next < t + 0.01) this.next = t + PREBUFFER_S;
    src.start(this.next);
    this.next += samples.length / rate;
    this.sources.add(src);
    src.onended = () => this.sources.delete(src);
  }

  queuedSeconds() {
    return this.sources.size ? Math.max(0, this.next - this.ctx.currentTime) : 0;
  }

  stop() {
    const unplayed = this.queuedSeconds();
    for (const src of this.sources) src.stop();
    this.sources.clear();
    this.next = 0;
    return unplayed;
  }

  close() {
    this.stop();
    this.ctx.close();
  }
}

// ------------------------------------------------------------------------------------------------ session

let conn = null;
let player = null;

function newConnection(dialect) {
  return {
    dialect,
    ws: null,
    ids: 0,
    configured: false,
    closing: false,
    outputRate: OUTPUT_RATE[dialect],
    openResponse: null, // response_id between created and done
    interrupted: new Set(), // responses barged in on: their late audio is dropped
    clientTurnId: 0,
    openTurn: null, // v3 microphone turn: {clientTurnId}
    turnIds: new Map(), // v3 client_turn_id -> turn_id
    typedJob: null, // v3: {jobId} from request to injection_finished / rejected
    jobs: 0,
    origins: new Map(), // latency origins: v3 turn_id (or pending key) -> {t0, kind}
    pendingOrigins: [], // tiered: typed origins waiting for response.created
    lastSeq: 0,
    ackedSeq: 0,
    ackTimer: null,
  };
}

function nextId(prefix = "client_evt") {
  conn.ids += 1;
  return `${prefix}_${conn.ids}_${Math.random().toString(16).slice(2, 10)}`;
}

function send(event) {
  if (!conn || !conn.ws || conn.ws.readyState !== WebSocket.OPEN) return false;
  conn.ws.send(JSON.stringify(event));
  if (event.type === "input_audio_buffer.append") debug.appendsSent += 1;
  else {
    debug.sent.push({ type: event.type, event_id: event.event_id ?? null });
    logLine("→", event.type);
  }
  return true;
}

function connect() {
  const dialect = $("dialect").value;
  conn = newConnection(dialect);
  debug.dialect = dialect;
  debug.configured = false;
  player?.close();
  player = new Player(conn.outputRate); // created in the click: the autoplay policy lets it run
  player.ctx.resume();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // With --api-key the key rides in a subprotocol, as OpenAI's browser clients send it (no headers on an upgrade).
  const key = $("api-key").value.trim();
  // Behind a balancer (deploy/haproxy) the tiered page is not pinned to a replica by its address: it never resumes.
  const url = `${scheme}://${location.host}${PATHS[dialect]}${dialect === "tiered" ? "?persist=session_id" : ""}`;
  const ws = key ? new WebSocket(url, ["realtime", `openai-insecure-api-key.${key}`]) : new WebSocket(url);
  conn.ws = ws;
  setStatus("connecting", "connecting…");
  $("connect").textContent = "Disconnect";
  $("dialect").disabled = true;
  $("banner").hidden = true;
  $("latency-origin").textContent = dialect === "v3"
    ? "From the commit (typed: the request) to the server's event."
    : "From the end of your speech (typed: response.create) to the server's event.";
  const mine = conn;
  ws.onopen = () => {
    if (dialect === "tiered") {
      // The first message opens the session (no autostart); the model owns turn-taking.
      send({
        type: "session.update",
        event_id: nextId("evt"),
        session: {
          instructions: INSTRUCTIONS,
          tools: [{ type: "function", ...LOCAL_TIME }],
          input_audio_format: "pcm16",
          output_audio_format: "pcm16",
          turn_detection: null,
        },
      });
      mine.ackTimer = setInterval(() => {
        if (mine.lastSeq > mine.ackedSeq && send({ type: "session.event_ack", server_event_seq: mine.lastSeq })) {
          mine.ackedSeq = mine.lastSeq;
        }
      }, 2000);
    }
  };
  ws.onmessage = (msg) => {
    if (conn !== mine) return;
    let event;
    try {
      event = JSON.parse(msg.data);
    } catch {
      showError("client", "invalid_json", "the server sent a frame that is not JSON", false);
      return;
    }
    if (typeof event.server_event_seq === "number") mine.lastSeq = Math.max(mine.lastSeq, event.server_event_seq);
    record(event);
    (dialect === "v3" ? onV3 : onTiered)(event);
  };
  ws.onerror = () => logLine("!", "WebSocket error");
  ws.onclose = (e) => {
    if (mine.ackTimer) clearInterval(mine.ackTimer);
    const words = CLOSE_WORDS[e.code] ?? "closed";
    debug.closes.push({ code: e.code, reason: e.reason, words });
    logLine("×", `closed ${e.code} ${e.reason}`);
    if (conn === mine) {
      setStatus("closed", `closed (${e.code})`);
      if (!(mine.closing && e.code === 1000)) {
        const prior = debug.errors.length && $("banner").hidden === false ? `${$("banner-text").textContent} — ` : "";
        showBanner(`${prior}Connection closed (${e.code}): ${words}${e.reason ? ` [${e.reason}]` : ""}`, "error");
      }
      disconnected();
    }
  };
}

function disconnect() {
  if (!conn) return;
  conn.closing = true;
  const ws = conn.ws;
  const stop = conn.dialect === "v3" ? { type: "session.stop", event_id: nextId() } : { type: "session.close" };
  if (conn.configured) send(stop);
  else ws.close(1000);
  // The server answers with session.closed and closes; a server that does not is closed after 5 s.
  setTimeout(() => { if (ws.readyState !== WebSocket.CLOSED) ws.close(1000); }, 5000);
}

function disconnected() {
  conn.configured = false;
  debug.configured = false;
  $("connect").textContent = "Connect";
  $("dialect").disabled = false;
  for (const id of ["text", "send", "raw-send"]) $(id).disabled = true;
  refreshHealth();
}

function configured(capabilities) {
  conn.configured = true;
  Object.assign(vad, { loudRun: 0, quietRun: 0, inSpeech: false, preroll: [], held: [] }); // nothing from before
  debug.configured = true;
  debug.capabilities = capabilities;
  $("capabilities").textContent = JSON.stringify(capabilities, null, 2);
  setStatus("ready", `ready · ${conn.dialect}`);
  for (const id of ["text", "send", "raw-send", "mic"]) $(id).disabled = false;
  refreshHealth();
}

function record(event) {
  if (event.type === "voicechat.metrics") { debug.metrics += 1; return; }
  const kept = { ...event };
  if (typeof kept.delta === "string" && event.type.endsWith("audio.delta")) kept.delta = `<${kept.delta.length} b64>`;
  debug.events.push(kept);
  if (debug.events.length > 5000) debug.events.splice(0, 1000);
  if (!event.type.endsWith(".delta")) logLine("←", summarise(event));
}

function summarise(e) {
  const bits = [e.type];
  for (const k of ["status", "reason", "code", "transcript", "text", "call_id", "name", "disposition"]) {
    if (typeof e[k] === "string" && e[k]) bits.push(`${k}=${e[k].slice(0, 60)}`);
  }
  if (e.error && typeof e.error === "object") bits.push(`${e.error.code}: ${e.error.message}`);
  if (e.response && e.response.status) bits.push(`status=${e.response.status}`);
  return bits.join(" ");
}

// ------------------------------------------------------------------------------------------------ responses

function responseCreated(rid, turnId) {
  const r = { turnId, text: "", status: "in_progress", reason: null, rate: conn.outputRate, chunks: [],
              scheduledSamples: 0, droppedSamples: 0, createdAt: now(), firstAudioAt: null, latency: null };
  debug.responses[rid] = r;
  debug.order.push(rid);
  while (debug.order.length > MAX_RESPONSES_KEPT) delete debug.responses[debug.order.shift()];
  conn.openResponse = rid;
  return r; // its bubble appears with its first words (a tiered tool-call response has none)
}

function responseText(rid, text) {
  const r = debug.responses[rid];
  if (!r) return;
  r.text = text;
  if (text) setBubble(`r:${rid}`, "assistant", "assistant", text);
}

function responseAudio(rid, b64, rate) {
  const r = debug.responses[rid];
  if (!r) return;
  const samples = base64ToInt16(b64);
  if (conn.interrupted.has(rid)) { r.droppedSamples += samples.length; return; }
  r.rate = rate;
  r.chunks.push(samples);
  r.scheduledSamples += samples.length;
  player.enqueue(samples, rate);
  if (r.firstAudioAt === null) {
    r.firstAudioAt = now();
    if (r.latency) { r.latency.firstAudioMs = Math.round(r.firstAudioAt - r.latency.t0); renderLatency(); }
  }
}

function responseDone(rid, status, reason) {
  const r = debug.responses[rid];
  if (conn.openResponse === rid) conn.openResponse = null;
  if (!r) return;
  r.status = status;
  r.reason = reason;
  if (r.latency) { r.latency.status = status; renderLatency(); }
  if (status !== "completed") {
    setBubble(`r:${rid}`, "assistant", "assistant", r.text || "—", `${status}${reason ? ` (${reason})` : ""}`);
  }
}

function attachLatency(rid, origin) {
  const r = debug.responses[rid];
  if (!r || !origin) return;
  r.latency = { n: debug.latencies.length + 1, kind: origin.kind, t0: origin.t0,
                createdMs: Math.round(r.createdAt - origin.t0), firstAudioMs: null, status: "in_progress" };
  debug.latencies.push(r.latency);
  renderLatency();
}

function renderLatency() {
  const body = $("latency").tBodies[0];
  body.textContent = "";
  for (const l of debug.latencies.slice(-12)) {
    const tr = body.insertRow();
    for (const v of [l.n, l.kind, l.createdMs ?? "", l.firstAudioMs ?? "…", l.status]) {
      tr.insertCell().textContent = typeof v === "number" && v !== l.n ? `${v} ms` : v;
    }
  }
}

// Stop what is audible now: a new user turn always wins over the assistant.
function bargeIn(reason) {
  const rid = conn.openResponse;
  if (rid) conn.interrupted.add(rid);
  const unplayed = player.stop();
  if (rid || unplayed > 0) {
    debug.stops.push({ reason, responseId: rid, unplayedMs: Math.round(unplayed * 1000),
                       scheduledSamples: rid ? debug.responses[rid]?.scheduledSamples ?? 0 : 0 });
  }
  return { rid, unplayed };
}

// ------------------------------------------------------------------------------------------------ tools

function toolCall(callId, name, args, respond) {
  const entry = { callId, name, arguments: args, output: null, state: "running" };
  debug.toolCalls.push(entry);
  const key = `t:${callId}`;
  setBubble(key, "tool", "tool", `${name}(${args})`, "running on this page…");
  const fn = TOOLS[name];
  entry.output = fn ? fn(JSON.parse(args || "{}")) : `unknown tool ${name}`;
  respond(entry.output);
  entry.state = "sent";
  setBubble(key, "tool", "tool", `${name}(${args}) → ${entry.output}`, "result sent, waiting for the model");
}

function toolApplied(callId, state, meta) {
  const entry = debug.toolCalls.find((t) => t.callId === callId);
  if (!entry) return;
  entry.state = state;
  setBubble(`t:${callId}`, "tool", "tool", undefined, meta);
}

// ------------------------------------------------------------------------------------------------ v3

function onV3(e) {
  switch (e.type) {
    case "session.created":
      $("capabilities").textContent = JSON.stringify(e.capabilities, null, 2);
      debug.capabilities = e.capabilities;
      setStatus("connecting", "configuring…");
      send({
        type: "session.update",
        event_id: nextId(),
        session: { protocol_version: 3, instructions: INSTRUCTIONS, tools: [{ type: "function", function: LOCAL_TIME }] },
      });
      break;
    case "session.updated":
      configured(e.capabilities);
      break;
    case "input_audio_buffer.speech_started":
      if (e.source === "microphone") {
        conn.turnIds.set(e.correlation, e.turn_id);
        setBubble(`u:${e.turn_id}`, "user", "you (microphone)", "…");
      } else {
        const origin = conn.origins.get(`j:${e.job_id}`);
        conn.origins.delete(`j:${e.job_id}`);
        if (origin) conn.origins.set(e.turn_id, origin);
      }
      break;
    case "input_audio_buffer.committed": {
      const origin = conn.origins.get(`c:${e.client_turn_id}`);
      conn.origins.delete(`c:${e.client_turn_id}`);
      if (origin) conn.origins.set(e.turn_id, origin);
      break;
    }
    case "conversation.item.input_audio_transcription.delta":
      if (e.source === "microphone") setUserTranscript(`u:${e.turn_id}`, e.transcript, false);
      break;
    case "conversation.item.input_audio_transcription.completed":
      if (e.source === "microphone") setUserTranscript(`u:${e.turn_id}`, e.transcript, true);
      break;
    case "input_text.rejected":
      if (conn.typedJob?.jobId === e.job_id) conn.typedJob = null;
      conn.origins.delete(`j:${e.job_id}`);
      showError("typed", e.reason, `the server rejected the typed message (${e.reason.replaceAll("_", " ")})`, false);
      break;
    case "input_text.injection_finished":
      if (conn.typedJob?.jobId === e.job_id) conn.typedJob = null;
      break;
    case "response.created": {
      responseCreated(e.response_id, e.turn_id);
      attachLatency(e.response_id, conn.origins.get(e.turn_id));
      conn.origins.delete(e.turn_id);
      break;
    }
    case "response.output_text.delta":
      responseText(e.response_id, e.text);
      break;
    case "response.output_audio.delta":
      responseAudio(e.response_id, e.delta, e.sample_rate);
      break;
    case "response.done":
      responseDone(e.response_id, e.status, e.reason);
      break;
    case "response.function_call_arguments.done":
      toolCall(e.call_id, e.name, e.arguments, (output) => send({
        type: "conversation.item.create", event_id: nextId(),
        item: { type: "function_call_output", call_id: e.call_id, output },
      }));
      break;
    case "conversation.item.function_call_output.applied":
      toolApplied(e.call_id, "applied", "applied ✓ (the model has the result)");
      break;
    case "response.function_call.failed":
      toolApplied(e.call_id, "failed", `failed: ${e.reason}`);
      break;
    case "error":
      showError("server", e.error.code, e.error.message, e.error.fatal);
      break;
    case "session.closed":
      note(`session closed: ${e.status} (${e.reason})`);
      break;
  }
}

function setUserTranscript(key, text, final) {
  let turn = debug.userTurns.find((t) => t.key === key);
  if (!turn) { turn = { key, transcript: "", final: false }; debug.userTurns.push(turn); }
  turn.transcript = text;
  turn.final = final;
  setBubble(key, "user", "you (microphone)", text || (final ? "(nothing recognised)" : "…"));
}

function v3StartTurn() {
  bargeIn("turn_start");
  const id = ++conn.clientTurnId;
  conn.openTurn = { clientTurnId: id };
  send({ type: "input_audio_buffer.turn_start", event_id: nextId(), client_turn_id: id });
}

function v3Commit() {
  const turn = conn.openTurn;
  if (!turn) return;
  conn.openTurn = null;
  conn.origins.set(`c:${turn.clientTurnId}`, { t0: now(), kind: "voice" });
  send({ type: "input_audio_buffer.commit", event_id: nextId(), client_turn_id: turn.clientTurnId });
}

function sendAudio(pcm) {
  if (conn.dialect === "v3") {
    send({ type: "input_audio_buffer.append", encoding: "pcm16", sample_rate: INPUT_RATE, channels: 1, audio: pcm16Base64(pcm) });
  } else {
    send({ type: "input_audio_buffer.append", audio: pcm16Base64(pcm) });
  }
}

// ------------------------------------------------------------------------------------------------ tiered

function onTiered(e) {
  switch (e.type) {
    case "session.created":
      conn.outputRate = e.session?.audio?.output?.sample_rate_hz ?? conn.outputRate;
      break;
    case "session.updated":
      if (!conn.configured) configured(e.session?.capabilities ?? {});
      break;
    case "input_audio_buffer.speech_started":
      setBubble(`u:${e.item_id}`, "user", "you (microphone)", "…");
      break;
    case "conversation.item.input_audio_transcription.delta": {
      const turn = debug.userTurns.find((t) => t.key === `u:${e.item_id}`);
      setUserTranscript(`u:${e.item_id}`, (turn?.transcript ?? "") + e.delta, false);
      break;
    }
    case "conversation.item.input_audio_transcription.completed":
      setUserTranscript(`u:${e.item_id}`, e.transcript, true);
      break;
    case "response.created": {
      const rid = e.response?.id ?? e.response_id;
      responseCreated(rid, null);
      const typed = conn.pendingOrigins.shift();
      attachLatency(rid, typed ?? (vad.lastLoudAt !== null && mic ? { t0: vad.lastLoudAt, kind: "voice" } : null));
      vad.lastLoudAt = null;
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const r = debug.responses[e.response_id];
      if (r && !conn.interrupted.has(e.response_id)) responseText(e.response_id, r.text + e.delta);
      break;
    }
    case "response.output_audio.delta":
      responseAudio(e.response_id, e.delta, e.sample_rate_hz ?? conn.outputRate);
      break;
    case "response.done":
      responseDone(e.response.id, e.response.status, e.response.status_details?.reason ?? null);
      break;
    case "response.function_call_arguments.done":
      toolCall(e.call_id, e.name, e.arguments, (output) => send({
        type: "conversation.item.create", event_id: nextId("evt"),
        item: { type: "function_call_output", call_id: e.call_id, output },
      }));
      break;
    case "turn.event":
      if (e.event === "function_call_output.applied") toolApplied(e.call_id, "applied", "applied ✓ (the model has the result)");
      break;
    case "error": {
      const err = typeof e.error === "object" ? e.error : { code: e.code, message: e.error };
      showError("server", err.code, err.message, false); // the tiered envelope has no fatal flag: the close says it
      break;
    }
    case "session.closed":
      note(`session closed: ${e.reason}`);
      break;
  }
}

// ------------------------------------------------------------------------------------------------ typed

function sendTyped(text) {
  if (!conn?.configured) return;
  if (conn.dialect === "v3") {
    const jobId = `page-job-${++conn.jobs}`;
    bargeIn("typed");
    conn.typedJob = { jobId };
    conn.origins.set(`j:${jobId}`, { t0: now(), kind: "typed" });
    send({ type: "input_text.request", event_id: nextId(), job_id: jobId, text });
  } else {
    const { rid } = bargeIn("typed");
    if (rid) send({ type: "response.cancel", event_id: nextId("evt"), response_id: rid });
    send({ type: "conversation.item.create", event_id: nextId("evt"),
           item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
    conn.pendingOrigins.push({ t0: now(), kind: "typed" });
    send({ type: "response.create", event_id: nextId("evt") });
  }
  setBubble(`typed:${conn.ids}`, "user", "you (typed)", text);
}

// ------------------------------------------------------------------------------------------------ microphone

let mic = null; // {stream, ctx, node}
const vad = { loudRun: 0, quietRun: 0, inSpeech: false, preroll: [], held: [], lastLoudAt: null, pttDown: false };

async function startMic() {
  const processing = $("aec").checked;
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing },
  });
  const ctx = new AudioContext({ latencyHint: "interactive" });
  await ctx.audioWorklet.addModule("/ui/capture-worklet.js");
  const node = new AudioWorkletNode(ctx, "voicechat-capture", {
    processorOptions: { targetRate: INPUT_RATE, frameSamples: FRAME_SAMPLES },
  });
  node.port.onmessage = (msg) => onFrame(msg.data.pcm, msg.data.rms);
  ctx.createMediaStreamSource(stream).connect(node);
  node.connect(ctx.destination); // the node writes silence; being connected keeps it pulled
  await ctx.resume();
  mic = { stream, ctx, node, rate: ctx.sampleRate };
  debug.micRate = ctx.sampleRate;
  Object.assign(vad, { loudRun: 0, quietRun: 0, inSpeech: false, preroll: [], held: [] });
  $("mic").textContent = "Stop microphone";
  $("mic").classList.add("live");
}

function stopMic() {
  if (!mic) return;
  if (conn?.openTurn) v3Commit();
  for (const t of mic.stream.getTracks()) t.stop();
  mic.ctx.close();
  mic = null;
  $("mic").textContent = "Start microphone";
  $("mic").classList.remove("live");
  $("level").value = -90;
}

function onFrame(pcm, rms) {
  const db = rms > 0 ? 20 * Math.log10(rms) : -90;
  $("level").value = Math.max(-90, db);
  if (!conn?.configured) return;
  const loud = db >= Number($("threshold").value);
  if (loud) vad.lastLoudAt = now();
  vad.loudRun = loud ? vad.loudRun + 1 : 0;
  vad.quietRun = loud ? 0 : vad.quietRun + 1;
  if ($("turn-mode").value === "ptt") return pttFrame(pcm);
  if (conn.dialect === "tiered") {
    // The model owns turn-taking: stream everything; our detector only stops what is playing. While the
    // assistant is audible a possible onset is held back until decided, so the cancel goes out before the
    // speech that caused it (the model's cancel tail then never splits the user's first word).
    const audible = conn.openResponse !== null || player.queuedSeconds() > 0;
    vad.held.push(pcm);
    if (!vad.inSpeech && vad.loudRun >= ONSET_FRAMES) { vad.inSpeech = true; tieredBargeIn("speech"); }
    if (!(audible && loud && !vad.inSpeech)) { for (const f of vad.held) sendAudio(f); vad.held = []; }
    if (vad.inSpeech && vad.quietRun >= HANGOVER_FRAMES) vad.inSpeech = false;
    return;
  }
  if (!vad.inSpeech) {
    vad.preroll.push(pcm);
    if (vad.preroll.length > PREROLL_FRAMES) vad.preroll.shift();
    // A turn_start during a typed job is a protocol conflict: the onset waits for the job to finish.
    if (vad.loudRun >= ONSET_FRAMES && !conn.typedJob) {
      vad.inSpeech = true;
      v3StartTurn();
      for (const f of vad.preroll) sendAudio(f);
      vad.preroll = [];
    }
  } else {
    sendAudio(pcm);
    if (vad.quietRun >= HANGOVER_FRAMES) { vad.inSpeech = false; v3Commit(); }
  }
}

function tieredBargeIn(reason) {
  const { rid, unplayed } = bargeIn(reason);
  if (rid) send({ type: "response.cancel", event_id: nextId("evt"), response_id: rid });
  else if (unplayed > 0) send({ type: "output_audio_buffer.clear", event_id: nextId("evt") });
}

function pttFrame(pcm) {
  if (vad.pttDown) sendAudio(pcm);
  else if (conn.dialect === "v3") {
    vad.preroll.push(pcm);
    if (vad.preroll.length > 2) vad.preroll.shift();
  }
}

function pttPress() {
  if (!conn?.configured || vad.pttDown) return;
  vad.pttDown = true;
  $("ptt").classList.add("live");
  if (conn.dialect === "v3") {
    if (conn.typedJob) { vad.pttDown = false; showBanner("Wait for the typed message to finish.", "info"); return; }
    v3StartTurn();
    for (const f of vad.preroll) sendAudio(f);
    vad.preroll = [];
  } else {
    tieredBargeIn("push_to_talk");
  }
}

function pttRelease() {
  if (!vad.pttDown) return;
  vad.pttDown = false;
  $("ptt").classList.remove("live");
  if (conn?.dialect === "v3") v3Commit();
  else if (conn?.configured) {
    conn.pendingOrigins.push({ t0: now(), kind: "voice" });
    send({ type: "input_audio_buffer.commit", event_id: nextId("evt") });
  }
}

// ------------------------------------------------------------------------------------------------ health

async function refreshHealth() {
  const dl = $("health");
  try {
    const res = await fetch("/health", { cache: "no-store" });
    const h = await res.json();
    debug.health = h;
    $("key-label").hidden = !h.auth_required;
    const rows = [
      ["status", `${h.status} (${h.model_kind ?? "?"})`],
      ["protocol", h.protocol ? `${h.protocol.name} v${h.protocol.version}` : "?"],
      ["sessions", `${h.active_sessions} of ${h.max_sessions} in use`],
      ["typed input", h.typed_input?.ready ? `ready (${h.typed_input.synthesizer})` : "unavailable"],
    ];
    if (h.speech) {
      // The simulator's ear and mouth: its own tones, or real speech (serve --speech real)
      rows.push(["speech", h.speech === "real" ? "real: PocketSphinx hears you, eSpeak NG answers"
                                               : "simulator tones (serve --speech real for your voice)"]);
    }
    dl.textContent = "";
    for (const [k, v] of rows) {
      dl.append(Object.assign(document.createElement("dt"), { textContent: k }));
      dl.append(Object.assign(document.createElement("dd"), { textContent: v }));
    }
  } catch (err) {
    dl.textContent = `GET /health failed: ${err.message}`;
  }
}

// ------------------------------------------------------------------------------------------------ wiring

function init() {
  const params = new URLSearchParams(location.search);
  if (params.get("dialect") in PATHS) $("dialect").value = params.get("dialect");
  $("connect").onclick = () => (conn && conn.ws && conn.ws.readyState <= WebSocket.OPEN ? disconnect() : connect());
  $("mic").onclick = async () => {
    if (mic) { stopMic(); return; }
    $("mic").disabled = true;
    try {
      await startMic();
    } catch (err) {
      showError("microphone", err.name || "microphone", err.message || String(err), false);
    } finally {
      $("mic").disabled = false;
    }
  };
  $("typed").onsubmit = (ev) => {
    ev.preventDefault();
    const text = $("text").value;
    if (!text.trim()) { showError("client", "empty_text", "type something first", false); return; }
    $("text").value = "";
    sendTyped(text);
  };
  $("raw").onsubmit = (ev) => {
    ev.preventDefault();
    let event;
    try {
      event = JSON.parse($("raw-text").value);
    } catch (err) {
      showError("client", "invalid_json", `not JSON: ${err.message}`, false);
      return;
    }
    if (!event || typeof event !== "object" || Array.isArray(event) || typeof event.type !== "string") {
      showError("client", "invalid_event", "an event is a JSON object with a string type", false);
      return;
    }
    send(event);
  };
  $("turn-mode").onchange = () => {
    const ptt = $("turn-mode").value === "ptt";
    $("ptt").hidden = !ptt;
    $("ptt").disabled = !ptt;
    if (ptt && conn?.openTurn) { vad.inSpeech = false; v3Commit(); }
  };
  $("ptt").addEventListener("pointerdown", pttPress);
  for (const ev of ["pointerup", "pointerleave", "pointercancel"]) $("ptt").addEventListener(ev, pttRelease);
  $("threshold").oninput = () => { $("threshold-out").textContent = $("threshold").value; };
  $("banner-close").onclick = () => { $("banner").hidden = true; };
  window.addEventListener("beforeunload", () => conn?.ws?.close(1000));
  refreshHealth();
  debug.ready = true;
  document.body.dataset.ready = "true";
}

init();

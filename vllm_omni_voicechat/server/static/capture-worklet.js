// Microphone capture: mix to mono, resample the context rate to 16 kHz with a windowed-sinc low-pass, and post
// one 80 ms frame (1,280 PCM16 samples) at a time with its RMS level. Runs on the audio thread.

const PHASES = 512; // kernel table resolution per input sample (linear interpolation between entries)
const ZERO_CROSSINGS = 12; // per side: ~-70 dB stopband with the Blackman window

class Resampler {
  constructor(inRate, outRate) {
    this.step = inRate / outRate; // input samples per output sample
    const cutoff = 0.5 * Math.min(1, 1 / this.step) * 0.92; // cycles per input sample, below the output Nyquist
    this.half = Math.ceil(ZERO_CROSSINGS / (2 * cutoff));
    const n = 2 * this.half * PHASES + 1;
    this.table = new Float32Array(n + 1);
    for (let i = 0; i < n; i++) {
      const d = i / PHASES - this.half; // distance in input samples
      const x = 2 * cutoff * d;
      const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
      const w = 0.42 + 0.5 * Math.cos(Math.PI * d / this.half) + 0.08 * Math.cos(2 * Math.PI * d / this.half);
      this.table[i] = 2 * cutoff * sinc * w;
    }
    this.buf = new Float32Array(this.half); // leading zeros pad the first kernel
    this.t = this.half; // position of the next output sample in buf
  }

  push(input, out) {
    const merged = new Float32Array(this.buf.length + input.length);
    merged.set(this.buf);
    merged.set(input, this.buf.length);
    const buf = merged;
    const { half, table } = this;
    let t = this.t;
    while (t + half < buf.length) {
      const base = Math.floor(t);
      let acc = 0;
      for (let k = base - half + 1; k <= base + half; k++) {
        const pos = (t - k + half) * PHASES; // table index of distance t - k
        const i = pos | 0;
        acc += buf[k] * (table[i] + (table[i + 1] - table[i]) * (pos - i));
      }
      out.push(acc);
      t += this.step;
    }
    const keep = Math.floor(t) - half; // samples before this are never needed again
    this.buf = buf.slice(keep);
    this.t = t - keep;
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 16000, frameSamples = 1280 } = options.processorOptions || {};
    this.resampler = new Resampler(sampleRate, targetRate);
    this.frameSamples = frameSamples;
    this.pending = [];
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const n = channels[0].length;
    const mono = new Float32Array(n);
    for (const ch of channels) for (let i = 0; i < n; i++) mono[i] += ch[i] / channels.length;
    this.resampler.push(mono, this.pending);
    while (this.pending.length >= this.frameSamples) {
      const samples = this.pending.splice(0, this.frameSamples);
      const pcm = new Int16Array(this.frameSamples);
      let energy = 0;
      for (let i = 0; i < samples.length; i++) {
        const s = Math.max(-1, Math.min(1, samples[i]));
        pcm[i] = Math.round(s * 32767);
        energy += s * s;
      }
      this.port.postMessage({ pcm, rms: Math.sqrt(energy / samples.length) }, [pcm.buffer]);
    }
    return true;
  }
}

registerProcessor("voicechat-capture", CaptureProcessor);

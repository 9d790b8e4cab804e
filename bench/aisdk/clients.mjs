// The clients of bench/aisdk/run.py, on the AI SDK's own transport and reader (Node).
// Env: API (the chat endpoint), CHAT, MODE (`latency`: one sender and CLIENTS-1 followers
// through the resume request, every token's latency; `cuts`: a sender and CUTS clients each
// cut at a random byte and resumed), TOKENS, SEED. Prints one JSON line.
import { DefaultChatTransport, readUIMessageStream } from 'ai';

const { API, CHAT, MODE } = process.env;
const TOKENS = Number(process.env.TOKENS || 2000);
const CLIENTS = Number(process.env.CLIENTS || 10);
const CUTS = Number(process.env.CUTS || 100);
let seed = Number(process.env.SEED || 1) >>> 0;
const rand = () => {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = Math.imul(seed ^ (seed >>> 15), seed | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const user = { id: `u-${CHAT}`, role: 'user', parts: [{ type: 'text', text: 'Count.' }] };
const tokens = (text) => [...text.matchAll(/t(\d+):(\d+) /g)].map((m) => [Number(m[1]), Number(m[2])]);

// Tokens made before this client's stream opened come as a replay: not latency.
async function timed(stream, latencies, opened) {
  for await (const chunk of stream) {
    if (chunk.type !== 'text-delta') continue;
    const now = Date.now();
    for (const [, at] of tokens(chunk.delta)) if (at >= opened) latencies.push(now - at);
  }
}

function cutting(bytes, seen) {
  let calls = 0;
  return async (url, init) => {
    calls += 1;
    if (calls > 1) return fetch(url, init);
    const abort = new AbortController();
    const response = await fetch(url, { ...init, signal: abort.signal });
    if (response.status !== 200) return response;
    const reader = response.body.getReader();
    let passed = 0;
    return new Response(new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        if (passed + value.length >= bytes) {
          controller.enqueue(value.slice(0, bytes - passed));
          seen.cut = true;
          abort.abort();
          return controller.error(new TypeError('network error: cut'));
        }
        passed += value.length;
        controller.enqueue(value);
      },
    }), { status: 200, headers: response.headers });
  };
}

async function final(stream) {
  let last;
  for await (const message of readUIMessageStream({ stream })) last = message;
  return last;
}

const transport = new DefaultChatTransport({ api: API });
const sentAt = Date.now();
const sender = await transport.sendMessages({ chatId: CHAT, messages: [user], trigger: 'submit-message', messageId: undefined });
const out = {};
if (MODE === 'latency') {
  const latencies = [];
  const followers = [];
  for (let i = 1; i < CLIENTS; i++) {
    followers.push((async () => {
      const opened = Date.now();
      const stream = await transport.reconnectToStream({ chatId: CHAT });
      if (stream) await timed(stream, latencies, opened);
    })());
  }
  await Promise.all([timed(sender, latencies, sentAt), ...followers]);
  latencies.sort((a, b) => a - b);
  const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
  Object.assign(out, { tokens: latencies.length, p50: q(0.5), p99: q(0.99), max: latencies.at(-1) });
} else {
  const senderDone = final(sender);
  const results = await Promise.all(Array.from({ length: CUTS }, async () => {
    const seen = { cut: false };
    const bytes = 1 + Math.floor(rand() * 40000);
    let message;
    try {
      const first = await new DefaultChatTransport({ api: API, fetch: cutting(bytes, seen) }).reconnectToStream({ chatId: CHAT });
      if (first) message = await final(first);
    } catch {
      // the cut: resume as the SDK does after a disconnect
    }
    if (seen.cut) {
      try {
        const again = await transport.reconnectToStream({ chatId: CHAT });
        message = again ? await final(again) : undefined;
      } catch {
        message = undefined; // the resume itself failed: counted as not resumed
      }
    }
    const text = message ? message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('') : '';
    const got = tokens(text).map(([i]) => i);
    const unique = new Set(got);
    return { cut: seen.cut, resumed: message != null, lost: TOKENS - unique.size, duplicated: got.length - unique.size, inOrder: got.every((v, k) => k === 0 || v > got[k - 1]) };
  }));
  await senderDone;
  const cut = results.filter((r) => r.cut);
  Object.assign(out, {
    cuts: cut.length,
    resumed: cut.filter((r) => r.resumed).length,
    lost: cut.reduce((s, r) => s + r.lost, 0),
    duplicated: cut.reduce((s, r) => s + r.duplicated, 0),
    outOfOrder: cut.filter((r) => !r.inOrder).length,
    whole: cut.filter((r) => r.resumed && r.lost === 0 && r.duplicated === 0 && r.inOrder).length,
  });
}
console.log(JSON.stringify(out));

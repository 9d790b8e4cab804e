// The AI SDK's own chat client (`ai`, the version client/web/package.json pins) against a
// real hub's /v1/aisdk, run by tests/web/test_js_aisdk.py with `node --test` (the hub and a
// Python worker run in that test). The chat is the SDK's `AbstractChat` (what `useChat`
// wraps) with a plain state, over `DefaultChatTransport`, so the requests, the stream's
// parsing and validation, the resume logic and the approval round trip are the SDK's.
//
// Environment: CONVSYNC_HUB (http://127.0.0.1:PORT), CONVSYNC_CHAT (the conversation id),
// CONVSYNC_PHASE (`turn`: a turn with 50 cut and resumed clients, then an approval; or
// `history`: the history after a hub restart), CONVSYNC_OUT (a JSON file: what this phase
// saw, for the Python side to compare with its replica), CONVSYNC_SEED (the cuts' seed).

import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.resolve(here, '..', '..', 'client', 'web', 'node_modules');
const ai = await import(pathToFileURL(path.join(modules, 'ai', 'dist', 'index.mjs')).href);
const {
  AbstractChat,
  DefaultChatTransport,
  readUIMessageStream,
  validateUIMessages,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} = ai;

const HUB = process.env.CONVSYNC_HUB;
const CHAT = process.env.CONVSYNC_CHAT;
const PHASE = process.env.CONVSYNC_PHASE;
const OUT = process.env.CONVSYNC_OUT;
const API = `${HUB}/v1/aisdk`;
const CUTS = 50;

/** The plain state `useChat` keeps in React. */
class State {
  constructor(messages = []) {
    this.messages = messages;
    this.status = 'ready';
    this.error = undefined;
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(value) {
    return structuredClone(value);
  }
}

class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new State(messages) });
  }
}

/** Messages as JSON carries them (undefined fields dropped), for deep comparison. */
const plain = (value) => JSON.parse(JSON.stringify(value));

/** A seeded generator (mulberry32), so a failing cut can be replayed. */
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A fetch whose first response body is cut after `bytes` bytes with the TypeError a lost
 * connection gives (the SDK then treats it as a disconnect it may resume); the request is
 * aborted for real, so the hub sees the client go.
 */
function cuttingFetch(bytes, seen) {
  let calls = 0;
  return async (url, init) => {
    calls += 1;
    if (calls > 1) return fetch(url, init);
    const abort = new AbortController();
    init.signal?.addEventListener('abort', () => abort.abort());
    const response = await fetch(url, { ...init, signal: abort.signal });
    if (response.status !== 200) return response;
    const reader = response.body.getReader();
    let passed = 0;
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) {
          controller.close();
          return;
        }
        const room = bytes - passed;
        if (value.length >= room) {
          if (room > 0) controller.enqueue(value.slice(0, room));
          seen.cut = true;
          abort.abort();
          controller.error(new TypeError('network error: the connection was cut'));
          return;
        }
        passed += value.length;
        controller.enqueue(value);
      },
      cancel() {
        abort.abort();
      },
    });
    return new Response(body, { status: 200, headers: response.headers });
  };
}

async function until(check, what, seconds = 60) {
  const end = Date.now() + seconds * 1000;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function readAll(stream) {
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) last = message;
  return last;
}

async function history() {
  const response = await fetch(`${API}/${CHAT}/messages`);
  assert.equal(response.status, 200);
  return response.json();
}

if (PHASE === 'turn') {
  test('a turn read by the SDK, cut at 50 random points and resumed, then an approval', async () => {
    const rand = random(Number(process.env.CONVSYNC_SEED || '1'));
    const chat = new Chat({ id: CHAT, transport: new DefaultChatTransport({ api: API }) });
    const sent = chat.sendMessage({ text: "What's the weather in Lisbon?" });
    await until(() => chat.messages.length === 2, 'the answer to start');
    const asked = chat.messages[0];

    // The same history sent again (another tab, a retry): not pushed twice; the stream
    // read with the SDK's own reader replays the answer from its start.
    const again = new DefaultChatTransport({ api: API }).sendMessages({
      chatId: CHAT,
      messages: [asked],
      trigger: 'submit-message',
      messageId: undefined,
      abortSignal: undefined,
    });

    // 50 clients reloading at once (`useChat({resume: true})`), each cut at a random byte.
    const cut = Array.from({ length: CUTS }, async () => {
      const seen = { cut: false };
      const bytes = 1 + Math.floor(rand() * 6000);
      const client = new Chat({
        id: CHAT,
        messages: [structuredClone(asked)],
        transport: new DefaultChatTransport({ api: API, fetch: cuttingFetch(bytes, seen) }),
      });
      await client.resumeStream();
      const wasCut = seen.cut && client.status === 'error';
      await client.resumeStream(); // after the cut: the resume request again
      return { bytes, wasCut, status: client.status, message: client.lastMessage };
    });
    const resumed = await Promise.all(cut);
    const repeated = await readAll(await again);
    await sent;
    assert.equal(chat.status, 'ready', String(chat.error));
    const uncut = plain(chat.lastMessage);
    await validateUIMessages({ messages: chat.messages });

    let lost = 0;
    let duplicated = 0;
    const text = (m) => m.parts.map((p) => p.text ?? JSON.stringify(p.input ?? '')).join('');
    for (const r of resumed) {
      const got = text(r.message);
      const want = text(uncut);
      if (got.length < want.length) lost += want.length - got.length;
      if (got.length > want.length) duplicated += got.length - want.length;
    }
    const cutsMidAnswer = resumed.filter((r) => r.wasCut).length;
    assert.equal(cutsMidAnswer, CUTS, 'every client was cut mid-answer');
    assert.equal(lost, 0);
    assert.equal(duplicated, 0);
    for (const r of resumed) {
      assert.equal(r.status, 'ready');
      assert.deepEqual(plain(r.message), uncut, `the client cut at byte ${r.bytes}`);
    }
    assert.deepEqual(plain(repeated), uncut);
    const loaded = await history();
    assert.deepEqual(plain(loaded), plain(chat.messages));

    // An approval: the worker asks before its call; the SDK's approval response, sent
    // back in the message's parts, decides it; the answer continues in the same message.
    const approving = new Chat({
      id: CHAT,
      messages: structuredClone(chat.messages),
      transport: new DefaultChatTransport({ api: API }),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    });
    await approving.sendMessage({ text: 'Please approve the lookup in Lisbon.' });
    const card = approving.lastMessage.parts.find((p) => p.state === 'approval-requested');
    assert.ok(card, JSON.stringify(approving.lastMessage.parts.map((p) => [p.type, p.state])));
    await approving.addToolApprovalResponse({ id: card.approval.id, approved: true, reason: 'fine' });
    await until(() => approving.status === 'ready' && approving.lastMessage.parts.at(-1)?.state === 'done', 'the approved answer');
    assert.equal(approving.status, 'ready', String(approving.error));
    await validateUIMessages({ messages: approving.messages });
    const after = await history();
    assert.deepEqual(plain(after), plain(approving.messages));

    writeFileSync(OUT, JSON.stringify({ messages: plain(approving.messages), cuts: cutsMidAnswer, lost, duplicated }));
  });
}

if (PHASE === 'history') {
  test('the history after a hub restart is there on the first request', async () => {
    const before = JSON.parse(readFileSync(OUT, 'utf8'));
    const started = performance.now();
    const loaded = await history();
    const ms = performance.now() - started;
    assert.deepEqual(plain(loaded), before.messages);
    const resume = await fetch(`${API}/${CHAT}/stream`);
    assert.equal(resume.status, 204, 'nothing runs after the restart');
    writeFileSync(OUT, JSON.stringify({ ...before, historyMs: ms }));
  });
}

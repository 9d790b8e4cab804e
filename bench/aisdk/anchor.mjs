// The AI SDK's recommended resumable setup, minimal (its docs' "Chatbot Resume Streams":
// `toUIMessageStreamResponse`-style `consumeSseStream` into `resumable-stream` on Redis, an
// `activeStreamId` per chat, GET /api/chat/{id}/stream resuming it, 204 when none), on
// Node's http instead of Next.js. The "model" writes TOKENS text deltas, one every DELAY ms,
// each `t{i}:{epoch ms} ` so a client can tell each token's latency and order.
// Prints the port once listening. Env: REDIS_URL, KEY_PREFIX, TOKENS, DELAY.
import http from 'node:http';
import { Readable } from 'node:stream';
import { createUIMessageStream, createUIMessageStreamResponse, generateId } from 'ai';
import { createClient } from 'redis';
import { createResumableStreamContext } from 'resumable-stream';

const TOKENS = Number(process.env.TOKENS || 2000);
const DELAY = Number(process.env.DELAY || 5);
const url = process.env.REDIS_URL || 'redis://127.0.0.1:6379';
const publisher = createClient({ url });
const subscriber = createClient({ url });
await Promise.all([publisher.connect(), subscriber.connect()]);
const context = createResumableStreamContext({
  waitUntil: null, // a long-running server: nothing is suspended
  keyPrefix: process.env.KEY_PREFIX || `bench-${generateId()}`,
  publisher,
  subscriber,
});
// resumable-stream emits an unhandled 'error' ("Timeout waiting for ack") when a resume's
// handshake over Redis pub/sub is slow (seen with 100 resumes at once at a load of 20): that
// would kill the server. Counted and logged instead; the client sees its resume fail.
let failures = 0;
process.on('uncaughtException', (error) => {
  failures += 1;
  console.error(`anchor: ${error.message} (${failures})`);
});
const chats = new Map(); // chat id -> activeStreamId (the docs' chat store, in memory)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function send(res, response) {
  res.writeHead(response.status, Object.fromEntries(response.headers));
  if (!response.body) return res.end();
  Readable.fromWeb(response.body).pipe(res);
}

async function body(req) {
  const parts = [];
  for await (const part of req) parts.push(part);
  return JSON.parse(Buffer.concat(parts).toString());
}

const server = http.createServer(async (req, res) => {
  const match = req.url.match(/^\/api\/chat\/([^/]+)\/stream$/);
  if (req.method === 'GET' && match) {
    const active = chats.get(decodeURIComponent(match[1]));
    if (active == null) return send(res, new Response(null, { status: 204 }));
    const stream = await context.resumeExistingStream(active);
    if (!stream) return send(res, new Response(null, { status: 204 }));
    return send(res, new Response(stream.pipeThrough(new TextEncoderStream()), {
      headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-vercel-ai-ui-message-stream': 'v1' },
    }));
  }
  if (req.method === 'POST' && req.url === '/api/chat') {
    const { id } = await body(req);
    chats.set(id, null);
    const stream = createUIMessageStream({
      async execute({ writer }) {
        writer.write({ type: 'start-step' });
        writer.write({ type: 'text-start', id: 't' });
        for (let i = 0; i < TOKENS; i++) {
          writer.write({ type: 'text-delta', id: 't', delta: `t${i}:${Date.now()} ` });
          await sleep(DELAY);
        }
        writer.write({ type: 'text-end', id: 't' });
        writer.write({ type: 'finish-step' });
      },
      onFinish() {
        chats.set(id, null);
      },
    });
    const response = createUIMessageStreamResponse({
      stream,
      async consumeSseStream({ stream: sse }) {
        const streamId = generateId();
        await context.createNewResumableStream(streamId, () => sse);
        chats.set(id, streamId);
      },
    });
    return send(res, response);
  }
  res.writeHead(404).end();
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));

// An AG-UI client and an AI SDK client on one conversation at once (SPEC 13), run by
// tests/web/test_kits_together.py (which holds the hub, the worker and a Python UI replica).
//
// The AG-UI client (`HttpAgent`) sends the user's message and follows the run; once it has
// the answer streaming, the AI SDK client attaches as `useChat({resume: true})` does
// (`DefaultChatTransport.reconnectToStream`, read with `readUIMessageStream`); once both show
// the answer growing, the AG-UI client stops it (`POST /v1/agui/{id}/stop`). Prints one JSON
// line: each client's answer text when its stream ended, and how each stream ended.
// env: CONVSYNC_HUB (http://127.0.0.1:PORT), CONVSYNC_CHAT (the conversation id).
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.resolve(here, '..', '..', 'client', 'web', 'node_modules');
const load = (file) => import(pathToFileURL(path.join(modules, file)).href);
const { HttpAgent } = await load('@ag-ui/client/dist/index.mjs');
const { DefaultChatTransport, readUIMessageStream } = await load('ai/dist/index.mjs');

const HUB = process.env.CONVSYNC_HUB;
const CHAT = process.env.CONVSYNC_CHAT;
const SCALE = Number(process.env.CONVSYNC_TIMEOUT_SCALE ?? '1');

async function until(check, what, seconds = 60) {
  const end = Date.now() + seconds * 1000 * SCALE;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const agent = new HttpAgent({ url: `${HUB}/v1/agui/${CHAT}`, threadId: CHAT });
agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: 'A long answer, please.' });
const aguiEvents = [];
const aguiDone = agent.runAgent({}, { onEvent: ({ event }) => void aguiEvents.push(event) });
const answerOf = () => {
  const last = agent.messages.at(-1);
  return last?.role === 'assistant' && !last.toolCalls ? (last.content ?? '') : '';
};
await until(() => answerOf().includes('w3 '), 'the AG-UI client to show the answer');

const transport = new DefaultChatTransport({ api: `${HUB}/v1/aisdk` });
const stream = await transport.reconnectToStream({ chatId: CHAT });
if (stream === null) throw new Error('the AI SDK resume found nothing running');
let sdkMessage = null;
const sdkDone = (async () => {
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) sdkMessage = message;
})();
const sdkText = () => sdkMessage?.parts.filter((p) => p.type === 'text').at(-1)?.text ?? '';
await until(() => sdkText().includes('w6 '), 'the AI SDK client to show the answer');

const stop = await fetch(`${HUB}/v1/agui/${CHAT}/stop`, { method: 'POST' });
const stopped = await stop.json();
await aguiDone;
await sdkDone;
const finished = aguiEvents.at(-1);
process.stdout.write(
  JSON.stringify({
    stopped,
    agui: { text: answerOf(), end: finished.type, outcome: finished.outcome ?? null },
    aisdk: { text: sdkText(), parts: sdkMessage.parts.map((p) => p.type) },
  }) + '\n',
);

// Tabs sharing one socket (`shared: true`, SPEC §14) in one Node realm, for
// tests/web/test_js_shared.py: node --experimental-websocket js_shared.mjs URL ID
// Tabs A and B (`tab` names them apart; in-realm locks, Node's BroadcastChannel) open replicas
// of ID; each pushes and sees the other's edit; then B pushes 20 messages while A, the leader,
// closes halfway through; B flushes; tab C joins. It prints B's presence (sessions, and
// `people()`: the two tabs are one person), then after each step one JSON line
// {step, metrics: {connections, channels}, texts: {...}}: the hub's /metrics and each live
// tab's texts. Exits 0 when done, 2 on a timeout.
import { connect, Message, people, sharedLink } from '../../client/web/convsync.js';

const [url, id] = process.argv.slice(2);
const out = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
const deadline = setTimeout(() => {
  out({ error: 'timed out' });
  process.exit(2);
}, 20_000);
// No keepalive: only the hand-over itself may bring B's replica back (a ping unanswered would
// too, after 10 s, and hide a hand-over that never came).
const RETRY = { backoff: 20, maxBackoff: 100, keepalive: null };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(check, what) {
  const end = Date.now() + 15_000;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}
const texts = (replica) => replica.conversation.messages().map((m) => m.content[0].text);

async function metrics() {
  const answer = await fetch(`${url.replace('ws://', 'http://')}/metrics`);
  const text = await answer.text();
  const gauge = (name) => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(text)?.[1]);
  return { connections: gauge('convsync_connections'), channels: gauge('convsync_channels') };
}

async function report(step, tabs) {
  const seen = {};
  for (const [name, replica] of Object.entries(tabs)) seen[name] = texts(replica);
  out({ step, metrics: await metrics(), texts: seen });
}

const open = (tab) =>
  connect(url, id, { shared: true, tab, client: `js-${tab}`, live: true, ...RETRY });
const a = open('A');
await a.ready;
const b = open('B');
await b.ready;
const leaders = ['A', 'B'].filter((tab) => sharedLink(url, { tab }).leading);
out({ step: 'leaders', leaders });
a.conversation.push(Message.user('from a'));
await until(() => texts(b).includes('from a'), "A's edit at B");
b.conversation.push(Message.user('from b'));
await until(() => texts(a).includes('from b'), "B's edit at A");
await until(() => b.presence.size === 2, 'both tabs in presence');
out({ step: 'people', sessions: b.presence.size, people: people(b.presence).length });
await report('both', { a, b });

// The leader's tab closes while B edits: B's edits go on through B, the next leader.
for (let k = 0; k < 20; k += 1) {
  b.conversation.push(Message.user(`b${k}`));
  if (k === 9) {
    a.close();
    sharedLink(url, { tab: 'A' }).close();
  }
  await sleep(5);
}
await b.flush();
await until(() => sharedLink(url, { tab: 'B' }).leading, 'B to lead');
await report('handed over', { b });

const c = open('C');
await c.ready;
await until(() => texts(c).length === texts(b).length, 'C to catch up');
await report('joined', { b, c });
b.close();
c.close();
sharedLink(url, { tab: 'B' }).close();
sharedLink(url, { tab: 'C' }).close();
clearTimeout(deadline);

// A JavaScript replica for tests/web/test_js_replica.py: node --experimental-websocket js_peer.mjs
// URL ID MODE [N] [TOTAL]. Prints one JSON line with what it saw, then exits.
//   mirror N TOTAL: push N user messages ("js 0".."js N-1"), flush, wait until the conversation
//                   holds TOTAL entries, print {state, revision, events}.
//   refused:        expect the hub to refuse the connection; print {refused, state, sockets}.
//   large N TOTAL:  push one user message of N characters, flush, try one of MAX_FRAME
//                   (refused at the call), wait for TOTAL entries; print {state, revision,
//                   events, refused: {reason, message}, pending, length}.
//   ask:            open a turn, make call c1, ask about it, print {decision, approvals}
//                   once a (Python) UI decided; then wait for the result of call f1 (a
//                   frontend tool the UI answers) and print {decision, approvals, result}.
import { connect, MAX_FRAME, Message } from '../../client/web/convsync.js';

const [url, id, mode, n = '0', total = '0'] = process.argv.slice(2);
const out = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
let replica = null;
const seen = [];
const deadline = setTimeout(() => {
  const session = replica?.session;
  out({
    error: 'timed out',
    state: replica?.state,
    length: replica?.conversation.length,
    revision: replica?.revision,
    pending: session?.pending,
    inflight: session?.inflight && { seq: session.inflight.seq, doomed: session.inflight.doomed },
    events: seen,
  });
  process.exit(2);
}, 20_000);

async function until(check) {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 5));
}

if (mode === 'refused') {
  let sockets = 0;
  class Counting extends WebSocket {
    constructor(...args) {
      super(...args);
      sockets += 1;
    }
  }
  const replica = connect(url, id, { client: 'js-peer', WebSocket: Counting });
  try {
    await replica.ready;
    out({ error: 'not refused' });
  } catch (error) {
    await new Promise((resolve) => setTimeout(resolve, 300)); // a retry would show here
    out({ refused: error.code, state: replica.state, sockets });
  }
} else if (mode === 'large') {
  replica = connect(url, id, { client: 'js-peer' });
  const events = seen;
  replica.on('*', (event) =>
    events.push(event.type === 'conflict' ? `conflict ${event.reason}` : event.type),
  );
  await replica.ready;
  replica.conversation.push(Message.user('x'.repeat(Number(n))));
  await replica.flush();
  const length = replica.conversation.length;
  let refused = null;
  try {
    replica.conversation.push(Message.user('y'.repeat(MAX_FRAME)));
  } catch (error) {
    refused = { reason: error.reason, message: error.message };
  }
  const after = { pending: replica.session.pending, length: replica.conversation.length };
  await until(() => replica.conversation.length >= Number(total) && replica.session.settled);
  out({
    state: replica.conversation.state(),
    revision: replica.revision,
    events,
    refused,
    pending: after.pending,
    length: after.length - length,
  });
  replica.close();
} else if (mode === 'ask') {
  replica = connect(url, id, { client: 'js-worker' });
  await replica.ready;
  const talk = replica.conversation;
  talk.push(Message.user('clean up'));
  const rig = { kind: 'rig', name: null, request: null, title: null };
  const value = { index: 0, start: talk.id(0), end: null };
  talk.addAside({ kind: 'rig.turn', after: null, author: rig, value, saved: true });
  const calls = [
    { type: 'tool_call', id: 'c1', name: 'rm', arguments: {} },
    { type: 'tool_call', id: 'f1', name: 'pick_file', arguments: {} },
  ];
  talk.push({ role: 'assistant', content: calls, stop: null, origin: null });
  await replica.flush();
  const decision = await replica.ask({ call: 'c1', prompt: 'rm?' });
  const result = await replica.result('f1');
  out({ decision, approvals: replica.approvals.length, result });
  replica.close();
} else {
  replica = connect(url, id, { client: 'js-peer' });
  const events = seen;
  replica.on('*', (event) =>
    events.push(event.type === 'conflict' ? `conflict ${event.reason}` : event.type),
  );
  await replica.ready;
  for (let i = 0; i < Number(n); i += 1) {
    replica.conversation.push(Message.user(`js ${i}`));
    if (i % 3 === 0) await new Promise((resolve) => setTimeout(resolve, 1));
  }
  await replica.flush();
  await until(() => replica.conversation.length >= Number(total) && replica.session.settled);
  out({ state: replica.conversation.state(), revision: replica.revision, events });
  replica.close();
}
clearTimeout(deadline);

// The React bindings (client/web/react.js) over jsdom, with a real Replica and its session fed
// frames through a fake WebSocket (the test plays the hub): what re-renders when a token
// streams or an entry lands, and how many replicas StrictMode opens.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { JSDOM } from 'jsdom';

import { Conversation, Message } from '../convsync.js';

import { FakeSocket, manualTimers } from './support/fakes.mjs';

// jsdom's window as the globals react-dom and the testing library read, before they load.
const dom = new JSDOM('<!doctype html><html><body></body></html>', { url: 'http://localhost/' });
for (const name of Object.getOwnPropertyNames(dom.window)) {
  if (name in globalThis || name.startsWith('_')) continue;
  Object.defineProperty(globalThis, name, {
    configurable: true,
    get: () => dom.window[name],
  });
}
globalThis.IS_REACT_ACT_ENVIRONMENT = true;

const React = await import('react');
const { render, act } = await import('@testing-library/react');
const { useReplica, useConversation, useDrafts, usePresence, usePeople, useApprovals, useConnection } =
  await import('../react.js');

const h = React.createElement;
const HUB = 'ws://hub:1';
const LINEAGE = 5;
const plain = (value) => JSON.parse(JSON.stringify(value));

let conversations = 0;

/**
 * A conversation of its own per test (the registry is per `(url, id)`), the options the
 * hooks' replica gets, and render counts by key.
 */
function fixture() {
  conversations += 1;
  FakeSocket.made = [];
  const timers = manualTimers();
  const options = {
    WebSocket: FakeSocket,
    client: `ui-${conversations}`,
    keepalive: null,
    random: () => 0.5,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
  };
  return { id: `conv.${conversations}`, options, timers, renders: new Map() };
}

/** A memoised component per entry and per draft, counting its renders. */
function transcript(renders) {
  const count = (key) => renders.set(key, (renders.get(key) ?? 0) + 1);
  const EntryView = React.memo(function EntryView({ entry }) {
    count(`entry:${entry.id}`);
    return h('li', { 'data-id': entry.id }, entry.message.content[0].text);
  });
  const DraftView = React.memo(function DraftView({ draft }) {
    count(`draft:${draft.id}`);
    return h('li', { 'data-draft': draft.id }, draft.parts.text ?? '');
  });
  let replicaSeen = null;
  function App({ id, options }) {
    const replica = useReplica(HUB, id, options);
    replicaSeen = replica;
    const { entries } = useConversation(replica);
    const drafts = useDrafts(replica);
    return h(
      'ul',
      null,
      entries.map((entry) => h(EntryView, { key: entry.id, entry })),
      drafts.map((draft) => h(DraftView, { key: draft.id, draft })),
    );
  }
  return { App, replica: () => replicaSeen };
}

/** Let the replica's start (it awaits `getToken`) and the view's microtask run. */
async function settle() {
  await act(async () => {
    for (let i = 0; i < 5; i += 1) await Promise.resolve();
  });
}

/** Deliver `message` from the hub inside `act`. */
async function deliver(ws, message) {
  await act(async () => ws.deliver(message));
}

/** The hub's log: records to send as they are made. */
function hubLog() {
  const log = new Conversation();
  let sent = 0;
  return {
    log,
    /** The `records` frame of everything pushed to the log since the last one. */
    records() {
      const records = plain(log.unsaved()).slice(sent);
      const frame = { type: 'records', from: sent, records, origin: null };
      sent += records.length;
      return frame;
    },
    get revision() {
      return log.revision;
    },
  };
}

/** Open the first socket and welcome it with `hub`'s log so far. */
async function welcome(hub, lineage = LINEAGE) {
  await settle();
  const ws = FakeSocket.made.at(-1);
  ws.open();
  await deliver(ws, { type: 'welcome', lineage, revision: hub.revision, acked: 0 });
  return ws;
}

function ids(container, attribute) {
  return Array.from(container.querySelectorAll(`[${attribute}]`), (el) =>
    el.getAttribute(attribute),
  );
}

test('200 tokens streamed into one draft re-render that draft alone, once per token', async () => {
  const { id, options, renders } = fixture();
  const { App } = transcript(renders);
  const hub = hubLog();
  const early = [hub.log.push(Message.user('hello')), hub.log.push(Message.assistant('hi'))];
  const view = render(h(App, { id, options }));
  const ws = await welcome(hub);
  await deliver(ws, hub.records());
  assert.deepEqual(ids(view.container, 'data-id'), early);
  const streaming = 'msg_019a0000000070008000000000000001';
  const other = 'msg_019a0000000070008000000000000002';
  await deliver(ws, {
    type: 'drafts',
    drafts: [
      { id: streaming, role: 'assistant', client: 'agent', parts: { text: '' } },
      { id: other, role: 'assistant', client: 'agent2', parts: { text: 'thinking' } },
    ],
    more: false,
  });
  let text = '';
  for (let k = 0; k < 200; k += 1) {
    const token = `t${k} `;
    await deliver(ws, { type: 'draft', id: streaming, op: 'append', offset: text.length, text: token });
    text += token;
  }
  const shown = view.container.querySelector(`[data-draft="${streaming}"]`);
  assert.equal(shown?.textContent, text);
  assert.equal(renders.get(`draft:${streaming}`), 201); // opened, then one per token
  assert.equal(renders.get(`draft:${other}`), 1);
  for (const entry of early) assert.equal(renders.get(`entry:${entry}`), 1);
  // The hub sending a draft again as it was (a new object in the session) renders nothing.
  await deliver(ws, {
    type: 'drafts',
    drafts: [{ id: other, role: 'assistant', client: 'agent2', parts: { text: 'thinking' } }],
    more: false,
  });
  assert.equal(renders.get(`draft:${other}`), 1);
  view.unmount();
});

test('a new entry, from the hub or made here, renders itself alone; an ack re-renders none', async () => {
  const { id, options, renders } = fixture();
  const { App, replica } = transcript(renders);
  const hub = hubLog();
  const early = [hub.log.push(Message.user('hello')), hub.log.push(Message.assistant('hi'))];
  const view = render(h(App, { id, options }));
  const ws = await welcome(hub);
  await deliver(ws, hub.records());
  const before = new Map(renders);
  // From the hub: one record with one new entry.
  const landed = hub.log.push(Message.user('from someone else'));
  await deliver(ws, hub.records());
  assert.equal(renders.get(`entry:${landed}`), 1);
  for (const entry of early) assert.equal(renders.get(`entry:${entry}`), before.get(`entry:${entry}`));
  // Made here: no session event names it, the replica's `edited` does.
  let mine = '';
  await act(async () => {
    mine = replica().conversation.push(Message.user('mine'));
  });
  assert.deepEqual(ids(view.container, 'data-id'), [...early, landed, mine]);
  assert.equal(renders.get(`entry:${mine}`), 1);
  const push = ws.sent.find((frame) => frame.type === 'push');
  assert.ok(push, 'the edit was pushed');
  await deliver(ws, { type: 'ack', seq: push.seq, from: hub.revision, revision: hub.revision + 1 });
  assert.equal(replica().pending, 0);
  for (const entry of [...early, landed, mine]) assert.equal(renders.get(`entry:${entry}`), 1);
  view.unmount();
});

test('a reconnect that resets to an equal value keeps every entry: nothing re-renders', async () => {
  const { id, options, timers, renders } = fixture();
  const { App } = transcript(renders);
  const hub = hubLog();
  const early = [hub.log.push(Message.user('hello')), hub.log.push(Message.assistant('hi'))];
  const view = render(h(App, { id, options }));
  const first = await welcome(hub);
  await deliver(first, hub.records());
  await act(async () => first.close(1011, 'unavailable'));
  timers.fire(); // the backoff
  // A new lineage (a restored hub): the whole value comes as a state, entries decoded anew.
  const ws = await welcome(hub, LINEAGE + 1);
  await deliver(ws, {
    type: 'state',
    lineage: LINEAGE + 1,
    revision: hub.revision,
    state: plain(hub.log.state()),
  });
  assert.deepEqual(ids(view.container, 'data-id'), early);
  for (const entry of early) assert.equal(renders.get(`entry:${entry}`), 1);
  view.unmount();
});

test('StrictMode opens one replica; unmount closes it after the grace, a remount before keeps it', async () => {
  const { id, options, timers } = fixture();
  const seen = new Set();
  function Probe() {
    const replica = useReplica(HUB, id, options);
    seen.add(replica);
    const { state } = useConnection(replica);
    return h('p', null, state);
  }
  const tree = () => h(React.StrictMode, null, h(Probe), h(Probe));
  const view = render(tree());
  await settle();
  assert.equal(seen.size, 1);
  assert.equal(FakeSocket.made.length, 1);
  const [replica] = seen;
  const ws = FakeSocket.made[0];
  ws.open();
  await deliver(ws, { type: 'welcome', lineage: LINEAGE, revision: 0, acked: 0 });
  assert.equal(view.container.textContent, 'connectedconnected');
  // Unmounted: a grace timer, and the socket stays open until it fires.
  view.unmount();
  const grace = timers.pending.filter((timer) => timer.ms === 1000);
  assert.equal(grace.length, 1);
  assert.equal(ws.readyState, 1);
  // Mounted again before the grace ends: the same replica, no new socket, the timer gone.
  const again = render(tree());
  await settle();
  assert.equal(seen.size, 1);
  assert.equal(FakeSocket.made.length, 1);
  assert.equal(timers.pending.includes(grace[0]), false);
  again.unmount();
  assert.equal(replica.state, 'connected');
  await act(async () => timers.fire());
  assert.equal(ws.readyState, 3);
  assert.equal(replica.state, 'closed');
  // The next mount opens a new replica.
  const last = render(h(Probe));
  await settle();
  assert.equal(seen.size, 2);
  assert.equal(FakeSocket.made.length, 2);
  last.unmount();
  await act(async () => timers.fire());
});

test('another id lets go of the old replica (closed after the grace); a bad option opens none', async () => {
  const { id, options, timers } = fixture();
  const other = `${id}.other`;
  let shown = null;
  function Probe({ conversation }) {
    shown = useReplica(HUB, conversation, options);
    return null;
  }
  const view = render(h(Probe, { conversation: id }));
  await settle();
  const first = shown;
  view.rerender(h(Probe, { conversation: other }));
  await settle();
  assert.notEqual(shown, first);
  assert.deepEqual(
    FakeSocket.made.map((ws) => ws.url),
    [`${HUB}/v1/conversations/${id}`, `${HUB}/v1/conversations/${other}`],
  );
  assert.equal(first.closing, false); // within the grace
  await act(async () => timers.fire());
  assert.equal(first.closing, true);
  assert.equal(shown.closing, false);
  view.unmount();
  await act(async () => timers.fire());
  assert.equal(shown.closing, true);
  // A bad grace is refused before anything is made: no replica, no socket.
  const third = `${id}.third`;
  function Bad() {
    useReplica(HUB, third, { ...options, grace: -1 });
    return null;
  }
  const made = FakeSocket.made.length;
  const quiet = console.error;
  console.error = () => {}; // React reports the render error too
  try {
    assert.throws(() => render(h(Bad)), (error) => error.reason === 'bad_option');
  } finally {
    console.error = quiet;
  }
  assert.equal(FakeSocket.made.length, made);
  // Nothing of it was kept: the same conversation with good options opens as usual.
  const good = render(h(Probe, { conversation: third }));
  await settle();
  assert.equal(FakeSocket.made.length, made + 1);
  good.unmount();
  await act(async () => timers.fire());
});

test('presence, approvals and connection state follow the replica; drafts end when committed', async () => {
  const { id, options, renders } = fixture();
  const hub = hubLog();
  let snapshot = null;
  function Side() {
    const replica = useReplica(HUB, id, options);
    const presence = usePresence(replica);
    const people = usePeople(replica);
    const approvals = useApprovals(replica);
    const drafts = useDrafts(replica);
    const connection = useConnection(replica);
    const { pending } = useConversation(replica);
    renders.set('side', (renders.get('side') ?? 0) + 1);
    snapshot = { presence, people, approvals, drafts, connection, pending, replica };
    return null;
  }
  const view = render(h(Side));
  assert.equal(snapshot.connection.state, 'connecting');
  const ws = await welcome(hub);
  assert.equal(snapshot.connection.state, 'connected');
  const agent = { connection: 'c1', client: 'agent', kind: 'agent', status: 'thinking' };
  await deliver(ws, { type: 'presence', connections: [agent] });
  assert.deepEqual(plain(snapshot.presence), [agent]);
  assert.ok(Object.isFrozen(snapshot.presence) && Object.isFrozen(snapshot.presence[0]));
  const firstAgent = snapshot.presence[0];
  await deliver(ws, {
    type: 'presence_diff',
    joined: [{ connection: 'c2', client: 'ui' }],
    changed: [],
    left: [],
  });
  assert.equal(snapshot.presence.length, 2);
  assert.equal(snapshot.presence[0], firstAgent); // unchanged: the same object
  assert.equal(snapshot.people.length, 2); // two sockets: two people
  // Two tabs of one browser (one shared socket): two sessions, one person.
  await deliver(ws, {
    type: 'presence_diff',
    joined: [
      { connection: 'c3', client: 'tab-1', socket: 7 },
      { connection: 'c4', client: 'tab-2', socket: 7, status: 'typing' },
    ],
    changed: [],
    left: [],
  });
  assert.equal(snapshot.presence.length, 4);
  assert.deepEqual(
    snapshot.people.map((person) => [person.client, person.connections, person.status ?? null]),
    [
      ['agent', ['c1'], 'thinking'],
      ['ui', ['c2'], null],
      ['tab-1', ['c3', 'c4'], 'typing'],
    ],
  );
  await deliver(ws, { type: 'presence_diff', joined: [], changed: [], left: ['c3', 'c4'] });
  assert.equal(snapshot.people.length, 2);
  // The hub's ids are numbers: a person stands for its sessions in their order, 9 before 10
  // (not as text, where "10" < "9"), and takes the first one's item.
  await deliver(ws, {
    type: 'presence_diff',
    joined: [
      { connection: 10, client: 'tab-b', socket: 8, status: 'second' },
      { connection: 9, client: 'tab-a', socket: 8, status: 'first' },
    ],
    changed: [],
    left: [],
  });
  const tabs = snapshot.people.find((person) => person.socket === 8);
  assert.deepEqual([tabs.client, tabs.connections, tabs.status], ['tab-a', ['9', '10'], 'first']);
  await deliver(ws, { type: 'presence_diff', joined: [], changed: [], left: [9, 10] });
  assert.equal(snapshot.people.length, 2);
  // A draft, then the record that makes its id held: the draft ends.
  const draftId = 'msg_019a0000000070008000000000000003';
  await deliver(ws, { type: 'drafts', drafts: [{ id: draftId, parts: { text: 'par' } }] });
  assert.equal(snapshot.drafts.length, 1);
  assert.ok(Object.isFrozen(snapshot.drafts[0]) && Object.isFrozen(snapshot.drafts[0].parts));
  hub.log.push({ message: Message.assistant('partial answer'), id: draftId });
  await deliver(ws, hub.records());
  assert.equal(snapshot.drafts.length, 0);
  // No approval was asked: the list stays the one empty list through these changes.
  assert.equal(snapshot.approvals.length, 0);
  // An edit here is pending until its ack, which comes with no event of its own.
  await act(async () => {
    snapshot.replica.conversation.push(Message.user('mine'));
  });
  assert.equal(snapshot.pending, 1);
  const push = ws.sent.find((frame) => frame.type === 'push');
  await deliver(ws, { type: 'ack', seq: push.seq, from: hub.revision, revision: hub.revision + 1 });
  assert.equal(snapshot.pending, 0);
  const sideRenders = renders.get('side');
  await deliver(ws, { type: 'presence_diff', joined: [], changed: [], left: ['c2'] });
  assert.equal(snapshot.presence.length, 1);
  assert.equal(renders.get('side'), sideRenders + 1);
  view.unmount();
});

test('react.js imports React and convsync.js alone; react.d.ts declares exactly its exports', async () => {
  const source = (name) => readFileSync(new URL(`../${name}`, import.meta.url), 'utf8');
  const imported = Array.from(
    source('react.js').matchAll(/^import\s[^;]*?from\s+'([^']+)';/gm),
    (m) => m[1],
  );
  assert.deepEqual(imported.sort(), ['./convsync.js', 'react']);
  assert.doesNotMatch(source('convsync.js'), /from\s+'react/);
  const declared = Array.from(
    source('react.d.ts').matchAll(/^export (?:const|function) (\w+)/gm),
    (m) => m[1],
  );
  const bindings = await import('../react.js');
  assert.deepEqual([...new Set(declared)].sort(), Object.keys(bindings).sort());
});

// The IndexedDB outbox (`persist: 'indexeddb'`) over fake-indexeddb and a fake WebSocket.
import 'fake-indexeddb/auto';
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Conversation, Message, Refused, connect } from '../convsync.js';
import { COMPACT_AT, LAYOUT } from '../lib/persist.js';

import { FakeSocket } from './support/fakes.mjs';

let outboxes = 0;

/** A fresh outbox name per test: fake-indexeddb is one store for the whole file. */
function fresh() {
  outboxes += 1;
  return `test-outbox-${outboxes}-${Math.random().toString(16).slice(2)}`;
}

/** A replica on `outbox` whose sockets are FakeSockets that never open unless told. */
function open(outbox, options = {}) {
  return connect('ws://hub:1', 'conv.p', {
    WebSocket: FakeSocket,
    persist: 'indexeddb',
    outbox,
    keepalive: null,
    setTimeout: () => null, // no reconnect timers: the test opens sockets by hand
    clearTimeout: () => {},
    ...options,
  });
}

/** Wait for the socket the replica opens next (after its outbox is read). */
async function nextSocket(replica) {
  const before = FakeSocket.made.length;
  await replica.loaded;
  for (let i = 0; i < 50 && FakeSocket.made.length === before; i += 1) await tick();
  assert.ok(FakeSocket.made.length > before, 'the replica opened a socket');
  return FakeSocket.made.at(-1);
}

/** The records of pushing user messages `texts` (another client's). */
function madeElsewhere(...said) {
  const other = new Conversation();
  for (const text of said) other.push(Message.user(text));
  return other.takeUnsaved();
}

/** Wait (bounded) until `done()` holds. */
async function until(done) {
  for (let i = 0; i < 200 && !done(); i += 1) await tick();
  assert.ok(done(), 'the condition came to hold');
}

function tick() {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/** A tab that dies: its outbox is let go as it is, no last write, no socket close. */
function kill(replica) {
  replica.keeper.stopped = true;
  replica.keeper.outbox.close();
}

/** Read the outbox's meta row straight from IndexedDB. */
async function meta(name) {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(name, 1);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  const row = await new Promise((resolve) => {
    const request = db.transaction('meta').objectStore('meta').get('outbox');
    request.onsuccess = () => resolve(request.result);
  });
  db.close();
  return row;
}

function texts(conversation) {
  return conversation.messages().map((message) => message.content[0].text);
}

test('an edit made with no hub is kept: a reload holds it with the same client id', async () => {
  const name = fresh();
  const a = open(name);
  await a.loaded;
  a.conversation.push(Message.user('offline'));
  await a.saved();
  await tick();
  kill(a);
  const b = open(name);
  await b.loaded;
  assert.equal(b.client, a.client);
  assert.deepEqual(texts(b.conversation), ['offline']);
  assert.equal(b.pending, 1);
  b.close();
});

test('a batch goes only once the outbox holds it with its seq; a landed one is not resent', async () => {
  const name = fresh();
  const a = open(name);
  const ws = await nextSocket(a);
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  await a.ready;
  a.conversation.push(Message.user('hi'));
  assert.equal(ws.pushes().length, 0, 'not sent before the outbox wrote it');
  await a.saved();
  await tick();
  assert.deepEqual(ws.pushes().map((push) => push.seq), [1]);
  assert.deepEqual((await meta(name)).inflight, { seq: 1, count: 1 });
  const record = ws.pushes()[0].records[0];
  kill(a); // the tab dies before the ack

  const b = open(name);
  const ws2 = await nextSocket(b);
  ws2.open();
  assert.equal(ws2.sent[0].client, a.client);
  ws2.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 1 }); // the hub holds seq 1
  ws2.deliver({ type: 'records', from: 0, records: [record], origin: { client: a.client, seq: 1 } });
  await b.ready;
  await tick();
  assert.equal(ws2.pushes().length, 0, 'a batch the hub holds is not pushed again');
  assert.equal(b.pending, 0);
  assert.deepEqual(texts(b.conversation), ['hi']);
  b.close();
});

test('a batch the hub did not get goes again after a reload, past the kept seq', async () => {
  const name = fresh();
  const a = open(name);
  const ws = await nextSocket(a);
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  a.conversation.push(Message.user('one'));
  await a.saved();
  await tick();
  a.conversation.push(Message.user('two')); // pending behind the batch in flight
  await a.saved();
  kill(a);

  const b = open(name);
  const ws2 = await nextSocket(b);
  ws2.open();
  // The hub moved on meanwhile (another client's record) and never got seq 1.
  ws2.deliver({ type: 'welcome', lineage: 5, revision: 1, acked: 0 });
  ws2.deliver({ type: 'records', from: 0, records: madeElsewhere('other'), origin: null });
  await until(() => ws2.pushes().length > 0);
  const [push] = ws2.pushes();
  assert.equal(push.seq, 2, 'past the seq kept (1), never under it again');
  assert.equal(push.revision, 1, 'rebased onto the log as it is');
  const count = push.records.length;
  ws2.deliver({ type: 'ack', seq: 2, from: 1, revision: 1 + count });
  if (count < 2) await until(() => ws2.pushes().length > 1);
  const said = ws2
    .pushes()
    .flatMap((frame) => frame.records)
    .map((r) => r.change.entries[0].message.content[0].text);
  assert.deepEqual(said, ['one', 'two']);
  assert.deepEqual(texts(b.conversation), ['other', 'one', 'two']);
  b.close();
});

test('the confirmed value survives a reload, past a compaction of its records', async () => {
  const name = fresh();
  const a = open(name);
  const ws = await nextSocket(a);
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 7, revision: 0, acked: 0 });
  const count = COMPACT_AT + 20;
  for (let n = 0; n < count; n += 10) {
    const said = [];
    for (let k = n; k < Math.min(count, n + 10); k += 1) said.push(`m${k}`);
    const records = madeElsewhere(...said);
    ws.deliver({ type: 'records', from: n, records, origin: null });
    await tick();
  }
  await a.saved();
  assert.equal(a.revision, count);
  const want = JSON.stringify(a.conversation.state());
  kill(a);
  const made = FakeSocket.made.length;
  const b = open(name);
  await b.loaded;
  assert.equal(b.revision, count);
  assert.equal(JSON.stringify(b.conversation.state()), want);
  await until(() => FakeSocket.made.length > made);
  const ws2 = FakeSocket.made.at(-1);
  ws2.open();
  assert.deepEqual([ws2.sent[0].lineage, ws2.sent[0].revision], [7, count], 'resumes from it');
  b.close();
});

test('a second replica on a held outbox is refused naming it, and changes nothing', async () => {
  const name = fresh();
  const a = open(name);
  await a.loaded;
  a.conversation.push(Message.user('mine'));
  const made = FakeSocket.made.length;
  const b = open(name, { lockWait: 30 });
  await assert.rejects(b.ready, (error) => {
    assert.ok(error instanceof Refused);
    assert.equal(error.code, 'outbox_in_use');
    assert.match(error.message, new RegExp(name));
    return true;
  });
  assert.equal(b.state, 'closed');
  assert.equal(FakeSocket.made.length, made, 'no socket for the refused one');
  a.close();
  await a.saved();
  await tick();
  const c = open(name);
  await c.loaded;
  assert.deepEqual(texts(c.conversation), ['mine'], 'the first one kept its edit');
  c.close();
});

test('an outbox of another layout, or of another client, is refused and left as it is', async () => {
  const name = fresh();
  const a = open(name, { client: 'ui-a' });
  await a.loaded;
  a.conversation.push(Message.user('kept'));
  a.close();
  await a.saved();
  await tick();
  const other = open(name, { client: 'ui-b' });
  await assert.rejects(other.ready, /outbox_client/);
  const before = await meta(name);
  const db = await new Promise((resolve) => {
    const request = indexedDB.open(name, 1);
    request.onsuccess = () => resolve(request.result);
  });
  await new Promise((resolve) => {
    const tx = db.transaction('meta', 'readwrite');
    tx.objectStore('meta').put({ ...before, layout: LAYOUT + 1 }, 'outbox');
    tx.oncomplete = resolve;
  });
  db.close();
  const newer = open(name);
  await assert.rejects(newer.ready, /outbox_layout/);
  assert.equal((await meta(name)).layout, LAYOUT + 1, 'nothing rewritten');
});

test('a conversation the hub says was deleted empties its outbox', async () => {
  const name = fresh();
  const a = open(name);
  const ws = await nextSocket(a);
  a.conversation.push(Message.user('never goes'));
  await a.saved();
  ws.open();
  ws.deliver({ type: 'error', code: 'deleted', detail: 'gone' });
  ws.close(4410, 'deleted');
  await assert.rejects(a.ready, /deleted/);
  await a.saved();
  await tick();
  await tick();
  const b = open(name);
  await b.loaded;
  assert.equal(b.pending, 0);
  assert.deepEqual(texts(b.conversation), []);
  b.close();
});

test('persist takes only indexeddb', () => {
  assert.throws(() => open(fresh(), { persist: 'localStorage' }), /bad_option/);
});

test('shared with persist refuses one client id for every tab', () => {
  // Each tab keeps the client id of the outbox it takes; one given to all would make them
  // replace one another at the hub.
  assert.throws(() => open(fresh(), { shared: true, client: 'same' }), /do not pass client/);
});

test('shared tabs with persist take an outbox each, the first free of the name', async () => {
  const { Outbox } = await import('../lib/persist.js');
  const name = fresh();
  const slots = new Map();
  const storage = { getItem: (key) => slots.get(key) ?? null, setItem: (k, v) => slots.set(k, v) };
  const first = await Outbox.openAny(name, { sessionStorage: storage });
  const second = await Outbox.openAny(name, { sessionStorage: { getItem: () => null, setItem() {} } });
  assert.deepEqual([first.name, second.name], [name, `${name}#2`]);
  first.close();
  // The first tab reloads: it takes its own outbox back, not the next free one.
  const again = await Outbox.openAny(name, { sessionStorage: storage });
  assert.equal(again.name, name);
  again.close();
  second.close();
});

test('a tab dying while it catches up keeps the value its pending edits were made on', async () => {
  const name = fresh();
  const a = open(name);
  const ws = await nextSocket(a);
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  const id = a.conversation.push(Message.user('draft'));
  await a.saved();
  await tick();
  ws.deliver({ type: 'ack', seq: 1, from: 0, revision: 1 });
  a.conversation.splice(0, 1, [Message.user('edited')]); // made on revision 1, the hub is gone
  ws.close(1006, '');
  await a.saved();
  // Reconnected: the log moved (revision 3); its first records arrive, the rest have not yet.
  a.start();
  await until(() => FakeSocket.made.at(-1) !== ws);
  const ws2 = FakeSocket.made.at(-1);
  ws2.open();
  ws2.deliver({ type: 'welcome', lineage: 5, revision: 3, acked: 1 });
  ws2.deliver({ type: 'records', from: 1, records: madeElsewhere('x'), origin: null });
  await a.saved();
  kill(a);
  const b = open(name);
  await b.loaded; // replays: the splice applies to the value kept with it
  assert.equal(b.revision, 1);
  assert.deepEqual(texts(b.conversation), ['edited']);
  assert.notEqual(b.conversation.id(0), id);
  b.close();
});

// The early socket (`lib/early.js`): opened before the replica, adopted by its first
// connection with what it received; never adopted when the replica would say another hello.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Conversation, Message, connect, openEarly } from '../convsync.js';

import { FakeSocket, manualTimers } from './support/fakes.mjs';

async function settle() {
  for (let i = 0; i < 5; i += 1) await Promise.resolve();
}

/** Two pushed messages as the hub would send them: a welcome at revision 2, then records. */
function log() {
  const maker = new Conversation();
  maker.push(Message.user('question'));
  maker.push(Message.assistant('answer'));
  const records = maker.takeUnsaved();
  return [
    { type: 'welcome', lineage: 7, revision: records.length, acked: 0, features: ['ping'] },
    { type: 'records', from: 0, records },
  ];
}

function replicaOn(early, options = {}) {
  const timers = manualTimers();
  return connect('ws://hub:1/', 'conv.1', {
    client: 'web-1',
    WebSocket: FakeSocket,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
    early,
    ...options,
  });
}

test('a replica adopts the open early socket: one socket, one hello, the catch-up it got', async () => {
  FakeSocket.made = [];
  const early = openEarly('ws://hub:1', 'conv.1', { client: 'web-1', WebSocket: FakeSocket });
  const [ws] = FakeSocket.made;
  ws.open();
  for (const message of log()) ws.deliver(message); // before the replica exists: kept
  const r = replicaOn(early);
  await r.ready;
  assert.equal(FakeSocket.made.length, 1);
  assert.deepEqual(
    ws.sent.map((frame) => frame.type),
    ['hello'],
  );
  assert.deepEqual(ws.sent[0], {
    type: 'hello',
    client: 'web-1',
    lineage: 0,
    revision: 0,
    token: null,
    features: ['hub_rebase', 'ping'],
  });
  assert.equal(r.state, 'connected');
  assert.deepEqual(
    r.conversation.entries().map((entry) => entry.message.role),
    ['user', 'assistant'],
  );
  // It goes on as the replica's own socket: an edit is pushed on it.
  r.conversation.push(Message.user('more'));
  assert.equal(ws.sent.at(-1).type, 'push');
  r.close();
});

test('an early socket still connecting is adopted and says hello once it opens', async () => {
  FakeSocket.made = [];
  const early = openEarly('ws://hub:1', 'conv.1', { client: 'web-1', WebSocket: FakeSocket });
  const r = replicaOn(early);
  await settle();
  const [ws] = FakeSocket.made;
  ws.open();
  for (const message of log()) ws.deliver(message);
  await r.ready;
  assert.equal(FakeSocket.made.length, 1);
  assert.deepEqual(
    ws.sent.map((frame) => frame.type),
    ['hello'],
  );
  assert.equal(r.conversation.length, 2);
  r.close();
});

test('a replica that would say another hello closes the early socket and connects anew', async () => {
  FakeSocket.made = [];
  // The page asked for drafts and presence; this replica does not (`live` differs).
  const early = openEarly('ws://hub:1', 'conv.1', {
    client: 'web-1',
    live: true,
    WebSocket: FakeSocket,
  });
  const [first] = FakeSocket.made;
  first.open();
  first.deliver(log()[0]);
  const timers = manualTimers();
  const r = connect('ws://hub:1/', 'conv.1', {
    client: 'web-1',
    WebSocket: FakeSocket,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
    random: () => 0,
    early,
  });
  await settle();
  assert.equal(first.readyState, 3, 'the early socket is closed');
  assert.equal(r.conversation.length, 0, 'nothing it received was taken');
  timers.fire();
  await settle();
  const second = FakeSocket.made[1];
  assert.ok(second, 'a socket of its own');
  second.open();
  assert.deepEqual(second.sent[0].features, ['hub_rebase', 'ping']);
  for (const message of log()) second.deliver(message);
  await r.ready;
  assert.equal(r.conversation.length, 2);
  r.close();
});

test('an early socket of another client, or one that closed, is not adopted', async () => {
  for (const spoil of ['client', 'closed']) {
    FakeSocket.made = [];
    const client = spoil === 'client' ? 'web-other' : 'web-1';
    const early = openEarly('ws://hub:1', 'conv.1', { client, WebSocket: FakeSocket });
    const [first] = FakeSocket.made;
    first.open();
    if (spoil === 'closed') first.close(1006, '');
    const r = replicaOn(early);
    await settle();
    assert.equal(first.readyState, 3, spoil);
    const second = FakeSocket.made[1];
    assert.ok(second, spoil);
    second.open();
    assert.equal(second.sent[0].client, 'web-1', spoil);
    r.close();
  }
});

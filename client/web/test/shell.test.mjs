// The socket shell over a fake WebSocket: connection states, reconnect, the refusal rule.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Message, Refused, SummaryFeed, backoffDelay, connect, retryRule } from '../convsync.js';

import { FakeSocket, manualTimers } from './support/fakes.mjs';

async function settle() {
  for (let i = 0; i < 5; i += 1) await Promise.resolve();
}

function replica(options = {}) {
  FakeSocket.made = [];
  const timers = manualTimers();
  const states = [];
  const r = connect('ws://hub:1/', 'conv.1', {
    client: 'ui-1',
    WebSocket: FakeSocket,
    random: () => 0.5,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
    ...options,
  });
  r.on('state', (event) => states.push(event.state));
  return { r, timers, states };
}

test('connects, says hello with the token, and reaches connected after the welcome', async () => {
  const { r, states } = replica({ getToken: async () => 'jwt' });
  await settle();
  const ws = FakeSocket.made[0];
  assert.equal(ws.url, 'ws://hub:1/v1/conversations/conv.1');
  assert.equal(ws.protocol, 'convsync.v1');
  ws.open();
  assert.deepEqual(ws.sent[0], {
    type: 'hello',
    client: 'ui-1',
    lineage: 0,
    revision: 0,
    token: 'jwt',
    features: ['hub_rebase', 'auth', 'ping'],
  });
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.equal(r.state, 'connected');
  assert.deepEqual(states, ['connected']); // 'connecting' was set before the listener
  await r.ready;
  // An edit is pushed at once; the ack settles flush().
  r.conversation.push(Message.user('hi'));
  assert.equal(ws.sent[1].type, 'push');
  const flushed = r.flush();
  ws.deliver({ type: 'ack', seq: 1, from: 0, revision: 1 });
  await flushed;
  assert.equal(r.pending, 0);
  r.close();
  assert.equal(r.state, 'closed');
});

test('a transient close reconnects with capped, jittered backoff and resumes', async () => {
  const { r, timers, states } = replica({ backoff: 100, maxBackoff: 300 });
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  r.conversation.push(Message.user('hi')); // in flight when the hub goes away
  FakeSocket.made[0].close(1011, 'unavailable');
  assert.equal(r.state, 'disconnected');
  assert.equal(timers.fire(), 50); // 0.5 * 100
  await settle();
  FakeSocket.made[1].close(1006, '');
  assert.equal(timers.fire(), 100); // 0.5 * 200
  await settle();
  FakeSocket.made[2].close(1006, '');
  assert.equal(timers.fire(), 150); // 0.5 * min(300, 400)
  await settle();
  const ws = FakeSocket.made[3];
  ws.open();
  assert.deepEqual(ws.sent[0].type, 'hello');
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.equal(ws.sent[1].type, 'push', 'the batch goes again after the welcome');
  assert.equal(ws.sent[1].seq, 2);
  // One state event per change: none for the two failed attempts in between.
  assert.deepEqual(states, ['connected', 'disconnected', 'connected']);
  assert.equal(r.state, 'connected');
  r.close();
});

test('failed attempts after a lost connection give one disconnected event and state', async () => {
  const { r, timers, states } = replica();
  const events = [];
  r.on('*', (event) => events.push(event.type));
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  FakeSocket.made[0].close(1006, '');
  for (let attempt = 1; attempt <= 5; attempt += 1) {
    timers.fire();
    await settle();
    const ws = FakeSocket.made[attempt];
    if (attempt % 2 === 0) ws.open(); // some get the socket, then lose it before a welcome
    ws.close(1006, '');
  }
  assert.equal(r.state, 'disconnected');
  assert.equal(r.failure, 'closed 1006');
  assert.deepEqual(states, ['connected', 'disconnected']);
  assert.deepEqual(events.filter((type) => type.endsWith('connected')), [
    'connected',
    'disconnected',
  ]);
  timers.fire();
  await settle();
  FakeSocket.made[6].open();
  FakeSocket.made[6].deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.deepEqual(states, ['connected', 'disconnected', 'connected']);
  assert.equal(r.failure, null);
  r.close();
});

test('a hub not there at the start: connecting, then one disconnected', async () => {
  FakeSocket.made = [];
  const timers = manualTimers();
  const states = [];
  const r = new (await import('../convsync.js')).Replica('ws://hub:1', 'conv.1', {
    WebSocket: FakeSocket,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
  });
  r.on('state', (event) => states.push([event.state, event.reason]));
  void r.start();
  await settle();
  for (let attempt = 0; attempt < 4; attempt += 1) {
    FakeSocket.made[attempt].close(1006, 'refused');
    timers.fire();
    await settle();
  }
  assert.deepEqual(states, [
    ['connecting', ''],
    ['disconnected', 'refused'],
  ]);
  r.close();
});

test('lagging reconnects at once', async () => {
  const { r, timers } = replica();
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  FakeSocket.made[0].close(4000, 'lagging');
  assert.equal(timers.fire(), 0);
  r.close();
});

for (const [code, close] of [
  ['bad_conversation_id', 1008],
  ['bad_client', 1008],
  ['too_big', 1009],
  ['forbidden', 4003],
  ['malformed_json', 1008],
  ['replaced', 4009],
  ['deleted', 4410], // the conversation was deleted (SPEC §15)
]) {
  test(`refused for good: ${code} is never retried`, async () => {
    const { r, timers, states } = replica();
    let refused = null;
    r.on('refused', (error) => (refused = error));
    await settle();
    const ws = FakeSocket.made[0];
    ws.open();
    ws.deliver({ type: 'error', code, detail: 'no' });
    ws.close(close, code);
    assert.equal(r.state, 'closed');
    assert.deepEqual(states, ['closed']);
    assert.equal(timers.pending.length, 0, 'no reconnect scheduled');
    assert.ok(refused instanceof Refused);
    assert.equal(refused.code, code);
    await assert.rejects(r.ready, Refused);
  });
}

test('a bare close 4410 (deleted) stops the replica for good with a refused event', async () => {
  const { r, timers } = replica({ getToken: () => 't' });
  let refused = null;
  r.on('refused', (error) => (refused = error));
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].close(4410, '');
  assert.equal(r.state, 'closed');
  assert.equal(timers.pending.length, 0, 'no reconnect scheduled');
  assert.equal(refused?.code, 'deleted');
});

test('unauthorized is retried only with a getToken hook', async () => {
  const without = replica();
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].close(4001, 'token expired');
  assert.equal(without.r.state, 'closed');
  let calls = 0;
  const withHook = replica({ getToken: () => `t${(calls += 1)}` });
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].deliver({ type: 'error', code: 'unauthorized', detail: 'expired' });
  assert.equal(withHook.r.state, 'disconnected');
  withHook.timers.fire();
  await settle();
  FakeSocket.made[1].open();
  assert.equal(FakeSocket.made[1].sent[0].token, 't2');
  withHook.r.close();
});

test('a token that expires is refreshed with getToken and sent as auth', async () => {
  let calls = 0;
  const { r, timers } = replica({ getToken: async () => `t${(calls += 1)}` });
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  assert.deepEqual(ws.sent[0].features, ['hub_rebase', 'auth', 'ping']);
  ws.deliver({
    type: 'welcome',
    lineage: 5,
    revision: 0,
    acked: 0,
    features: ['auth'],
    expires_in: 60,
  });
  assert.equal(timers.pending.length, 1);
  assert.equal(timers.pending[0].ms, 48_000);
  timers.fire();
  await settle();
  assert.deepEqual(ws.sent[1], { type: 'auth', token: 't2' });
  ws.deliver({ type: 'auth_ok', expires_in: 10 });
  assert.equal(timers.pending[0].ms, 8000);
  ws.close(1011, 'unavailable');
  assert.equal(timers.pending.length, 1, 'the refresh is dropped with its connection');
  r.close();
});

test('the retry table and the backoff law', () => {
  assert.equal(retryRule('rate_limited', 4008, false), 'backoff');
  assert.equal(retryRule('internal', 1011, false), 'backoff');
  assert.equal(retryRule('shutting_down', 1001, false), 'backoff');
  assert.equal(retryRule(null, 1008, false), 'backoff', 'a bare 1008 names no code');
  assert.equal(retryRule(null, 1008, false, 'bad_client'), 'refused', 'the reason names it');
  assert.equal(retryRule(null, 4003, false), 'refused');
  assert.equal(retryRule(null, 4009, false), 'refused');
  assert.equal(retryRule(null, 4410, true), 'refused', 'deleted: even with a new token');
  assert.equal(retryRule(null, 4000, false), 'at_once');
  assert.equal(retryRule(null, 4001, true), 'backoff');
  assert.equal(retryRule(null, 4001, false), 'refused');
  assert.equal(retryRule(null, 1006, false), 'backoff');
  assert.equal(retryRule(null, null, false), 'backoff');
  assert.equal(retryRule('some_new_code', 4999, false), 'backoff');
  for (let failures = 1; failures < 20; failures += 1) {
    const cap = Math.min(5000, 50 * 2 ** (failures - 1));
    assert.ok(backoffDelay(failures, 50, 5000, () => 0.999999) < cap);
    assert.equal(
      backoffDelay(failures, 50, 5000, () => 0),
      0,
    );
  }
});

test('a close whose reason is a refusing code is final even without an error message', async () => {
  const { r, timers } = replica();
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].close(1008, 'bad_conversation_id');
  assert.equal(r.state, 'closed');
  assert.equal(r.refused.code, 'bad_conversation_id');
  assert.equal(timers.pending.length, 0);
});

test('a message the session cannot take drops the connection and reconnects', async () => {
  const { r, timers } = replica();
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  ws.onmessage({ data: '{not json' });
  assert.equal(r.state, 'disconnected');
  assert.equal(timers.pending.length, 1);
  r.close();
  assert.equal(r.state, 'closed');
});

test('keepalive: pings a hub that lists ping; a silent one is given up at once', async () => {
  const { r, timers, states } = replica({ keepalive: 4000 });
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  assert.ok(ws.sent[0].features.includes('ping'));
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0, features: ['ping'] });
  assert.equal(timers.fire(), 2000); // the first ping is due after half the keepalive
  assert.deepEqual(ws.sent.at(-1), { type: 'ping' });
  ws.deliver({ type: 'pong' }); // answered: the next ping is due
  assert.equal(timers.pending.length, 1);
  assert.equal(timers.fire(), 2000);
  assert.deepEqual(ws.sent.at(-1), { type: 'ping' });
  assert.equal(r.state, 'connected');
  assert.equal(timers.fire(), 2000); // no answer within half the keepalive
  assert.equal(r.state, 'disconnected');
  assert.equal(r.failure, 'keepalive timed out: a ping went unanswered for 2s');
  assert.equal(ws.readyState, 3, 'the silent socket is closed without waiting for it');
  assert.deepEqual(states, ['connected', 'disconnected']);
  assert.equal(timers.pending.length, 1, 'only the reconnect is scheduled');
  ws.deliver({ type: 'pong' }); // a late answer from the given-up socket changes nothing
  assert.equal(r.state, 'disconnected');
  timers.fire();
  await settle();
  FakeSocket.made[1].open();
  FakeSocket.made[1].deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.equal(r.state, 'connected');
  assert.equal(timers.pending.length, 0, 'a hub without the ping feature is not pinged');
  r.close();
});

test('keepalive: any message answers the ping; close stops the pings', async () => {
  const { r, timers } = replica({ keepalive: 1000 });
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0, features: ['ping'] });
  timers.fire(); // ping
  ws.deliver({ type: 'presence_diff', joined: [], left: [], changed: [] });
  assert.equal(timers.pending.length, 1);
  assert.equal(timers.pending[0].ms, 500, 'the next ping, not the deadline');
  r.close();
  assert.equal(timers.pending.length, 0);
  const off = replica({ keepalive: null });
  await settle();
  FakeSocket.made[0].open();
  assert.ok(!FakeSocket.made[0].sent[0].features.includes('ping'));
  off.r.close();
  for (const bad of [0, 50, -1, Infinity, Number.NaN, '5000']) {
    assert.throws(
      () => replica({ keepalive: bad }),
      /keepalive must be null \(no pings\) or a number of milliseconds, at least 100/,
    );
  }
});

test('a token living longer than a timer can wait is refreshed once, not in a flood', async () => {
  // Timers take at most 2^31 - 1 ms: a 40-day token's refresh delay fired at once, and each
  // auth_ok armed it again (917 auths in 1.5 s against a real hub; review, stop 22).
  const { r, timers } = replica({ getToken: async () => 'jwt' });
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  const days40 = 40 * 24 * 3600;
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0, features: ['auth'], expires_in: days40 });
  assert.equal(timers.pending.length, 1);
  assert.equal(timers.pending[0].ms, 2 ** 31 - 1);
  r.close();
});

test('a token refused and given again by getToken is refused for good, not retried forever', async () => {
  // The viewer's getToken returns the one token its address carried: an expired one was
  // retried forever and `refused` never came (16 sockets in 2 s; review, stop 22).
  const { r, timers } = replica({ getToken: () => 'the only token' });
  let refused = null;
  r.on('refused', (error) => (refused = error));
  await settle();
  FakeSocket.made[0].open();
  FakeSocket.made[0].deliver({ type: 'error', code: 'unauthorized', detail: 'expired' });
  assert.equal(r.state, 'disconnected');
  timers.fire();
  await settle();
  assert.equal(FakeSocket.made.length, 1, 'no socket for the same token');
  assert.equal(r.state, 'closed');
  assert.equal(refused?.code, 'unauthorized');
  await r.ready.catch(() => {});
});

test('presence: false watches: the hello says watch; anything but a boolean is refused', async () => {
  const { r } = replica({ presence: false });
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  assert.equal(ws.sent[0].watch, true);
  r.close();
  const joined = replica();
  await settle();
  FakeSocket.made[0].open();
  assert.equal('watch' in FakeSocket.made[0].sent[0], false);
  joined.r.close();
  assert.throws(() => replica({ presence: 'no' }), /presence must be true or false/);
});

test('an error that no close follows (Node, a refused port) ends the attempt once and retries', async () => {
  const { r, timers, states } = replica();
  await settle();
  const ws = FakeSocket.made[0];
  ws.readyState = 3; // refused: Node fires error alone, and close() then does nothing
  ws.close = () => {};
  ws.onerror({ type: 'error', message: 'connect ECONNREFUSED' });
  ws.onerror({ type: 'error' }); // a second error ends nothing twice
  assert.equal(r.failure, 'connection failed: connect ECONNREFUSED');
  assert.equal(timers.pending.length, 1, 'one retry, not two');
  timers.fire();
  await settle();
  assert.equal(FakeSocket.made.length, 2, 'a new attempt');
  assert.deepEqual(states, ['disconnected']);
  r.close();
});

test('a SummaryFeed retrying after a lost connection stays disconnected, as a Replica does', async () => {
  FakeSocket.made = [];
  // The feed's retries use the real timers: keep them short and wait for each new socket.
  const feed = new SummaryFeed('ws://hub:1/', { WebSocket: FakeSocket, backoff: 1, maxBackoff: 2 });
  const states = [];
  feed.on('state', (event) => states.push(event.state));
  const attempt = async (n) => {
    for (let waited = 0; FakeSocket.made.length <= n; waited += 1) {
      assert.ok(waited < 1000, `no attempt ${n} within 5 s`);
      await new Promise((done) => setTimeout(done, 5));
    }
    return FakeSocket.made[n];
  };
  void feed.start();
  const first = await attempt(0);
  first.open();
  first.deliver({ type: 'rows', rows: [], snapshot: true });
  first.close(1006, '');
  for (let n = 1; n <= 3; n += 1) {
    const ws = await attempt(n);
    assert.equal(feed.state, 'disconnected', `during retry ${n}`);
    ws.close(1006, '');
  }
  assert.deepEqual(states, ['connecting', 'connected', 'disconnected']);
  feed.close();
});

test('a lost connection leaves the session connecting; close() releases it for good', async () => {
  const { r, timers } = replica();
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.equal(r.session.phase, 'live');
  ws.close(1006, '');
  assert.equal(r.session.phase, 'connecting'); // it waits for the next welcome
  assert.equal(r.state, 'disconnected');
  timers.fire();
  await settle();
  const again = FakeSocket.made[1];
  again.open();
  again.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  assert.equal(r.session.phase, 'live');
  r.close();
  assert.equal(r.state, 'closed');
  assert.equal(r.session.phase, 'closed');
  assert.throws(() => r.session.hello(), /closed/);
});

import { Conversation } from '../convsync.js';

test('edited: after each record made here (an edit, a rebase replay), never for the hub\'s', async () => {
  const { r } = replica();
  const edited = [];
  const wild = [];
  r.on('edited', (event) => edited.push(event.type));
  r.on('*', (event) => wild.push(event.type));
  await settle();
  const ws = FakeSocket.made[0];
  ws.open();
  ws.deliver({ type: 'welcome', lineage: 5, revision: 0, acked: 0 });
  r.conversation.push(Message.user('mine'));
  assert.deepEqual(edited, ['edited']);
  assert.equal(wild.includes('edited'), false); // `*` hears session events, as before
  // Someone else's record lands first: the push is rejected and rebased, the edit replayed.
  const theirs = new Conversation();
  theirs.push(Message.user('theirs'));
  const records = JSON.parse(JSON.stringify(theirs.unsaved()));
  ws.deliver({ type: 'records', from: 0, records, origin: null });
  ws.deliver({ type: 'reject', seq: 1, lineage: 5, revision: 1, reason: 'behind' });
  assert.deepEqual(r.conversation.messages().map((m) => m.content[0].text), ['theirs', 'mine']);
  assert.deepEqual(edited, ['edited', 'edited']);
  r.close();
});

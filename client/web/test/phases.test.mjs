// The session's phases as one table (lib/phases.js), and the shells' connection states
// (lib/reconnect.js): each phase takes what its row says and refuses the rest, unchanged.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Conversation, Message, ProtocolError, ReplicaSession, UsageError } from '../convsync.js';
import { Emitter } from '../lib/emitter.js';
import { KNOWN, PHASES } from '../lib/phases.js';
import { CONNECTION, Reconnect } from '../lib/reconnect.js';

const LINEAGE = 77;
const plain = (value) => JSON.parse(JSON.stringify(value));

/** A well-shaped message of each type the session knows (its phase alone decides). */
const MESSAGES = {
  welcome: { type: 'welcome', lineage: LINEAGE, revision: 1, acked: 0 },
  records: { type: 'records', from: 0, records: [] },
  state: { type: 'state', lineage: LINEAGE, revision: 0, state: { entries: [] } },
  entries: { type: 'entries', entries: [] },
  ack: { type: 'ack', seq: 1, from: 0, revision: 1 },
  reject: { type: 'reject', seq: 1, lineage: LINEAGE, revision: 1, reason: 'behind' },
  drafts: { type: 'drafts', drafts: [{ id: 'msg_x', parts: { text: 'hi' } }] },
  draft: { type: 'draft', id: 'msg_y', text: 'hi' },
  draft_end: { type: 'draft_end', id: 'msg_x', status: 'ended' },
  presence: { type: 'presence', connections: [{ connection: 1 }] },
  presence_diff: { type: 'presence_diff', joined: [{ connection: 2 }] },
  error: { type: 'error', code: 'internal', detail: 'x' },
};

/** A live session on a log of one record, with one edit pending. */
function sessions() {
  const log = new Conversation();
  log.push(Message.user('q'));
  const records = plain(log.unsaved());
  const made = (phase) => {
    const session = new ReplicaSession('ui', { live: true });
    session.local.push(Message.user('mine'));
    if (phase === 'connecting') {
      session.hello();
      return session;
    }
    session.hello();
    session.receive({ type: 'welcome', lineage: LINEAGE, revision: 1, acked: 0 });
    if (phase === 'catching_up') return session;
    session.receive({ type: 'records', from: 0, records });
    if (phase === 'live') return session;
    session.release();
    return session;
  };
  return made;
}

/** What of a session a refused message must leave as it was. */
function snapshot(session) {
  return plain({
    phase: session.phase,
    welcome: session.welcome,
    sub: session.sub,
    seq: session.seq,
    pending: session.pending,
    ready: session.ready,
    confirmed: session.confirmed.state(),
    revision: session.confirmed.revision,
    held: session.log.held,
    local: session.local.state(),
    unsaved: session.local.unsaved(),
    drafts: [...session.drafts.keys()],
    presence: [...session.presence.keys()],
  });
}

test('each phase is reached as the table says (hello, welcome, catch-up, release)', () => {
  const made = sessions();
  for (const phase of Object.keys(PHASES)) assert.equal(made(phase).phase, phase);
  // A lost connection waits for the next welcome; only `release()` closes for good.
  for (const phase of ['catching_up', 'live']) {
    const session = made(phase);
    session.disconnected('cut');
    assert.equal(session.phase, 'connecting');
  }
  const fresh = new ReplicaSession('ui');
  assert.equal(fresh.phase, 'connecting');
  // A welcome at the revision the session holds goes through catching_up to live at once.
  fresh.hello();
  fresh.receive({ type: 'welcome', lineage: LINEAGE, revision: 0, acked: 0 });
  assert.equal(fresh.phase, 'live');
  assert.ok(fresh.ready);
  const closed = made('closed');
  // The shell's last word on the welcomed connection is taken (its `disconnected` event).
  assert.deepEqual(closed.disconnected('late').map((event) => event.type), ['disconnected']);
  assert.equal(closed.phase, 'closed');
  closed.release();
  assert.throws(() => closed.hello(), (e) => e instanceof UsageError && e.reason === 'closed');
  assert.equal(closed.phase, 'closed');
});

test('a message its phase does not accept is refused `unexpected`, and nothing changes', () => {
  const made = sessions();
  let refused = 0;
  for (const [phase, row] of Object.entries(PHASES)) {
    for (const type of KNOWN) {
      if (row.accepts.includes(type)) continue;
      const session = made(phase);
      const before = snapshot(session);
      // The hub broke the protocol; or, released, the caller fed a session it let go.
      const kind = phase === 'closed' ? UsageError : ProtocolError;
      const reason = phase === 'closed' ? 'closed' : 'unexpected';
      assert.throws(
        () => session.receive(plain(MESSAGES[type])),
        (error) => error instanceof kind && error.reason === reason,
        `${phase} took ${type}`,
      );
      assert.deepEqual(snapshot(session), before, `${phase} changed on ${type}`);
      refused += 1;
    }
  }
  assert.equal(refused, 10 + 1 + 1 + 12); // connecting, catching_up, live, closed
});

test('what a phase accepts it takes (a welcomed session takes drafts, acks, the log)', () => {
  const made = sessions();
  for (const [phase, row] of Object.entries(PHASES)) {
    for (const type of row.accepts) {
      const session = made(phase);
      try {
        session.receive(plain(MESSAGES[type]));
      } catch (error) {
        // `error` is the hub's own code; `entries` needs a state first (the handler's rule).
        assert.ok(error instanceof ProtocolError, `${phase} ${type}: ${error}`);
        const why = `${phase} ${type}: ${error.reason}`;
        assert.ok(error.reason === 'internal' || type === 'entries', why);
      }
    }
  }
  const live = made('live');
  assert.deepEqual(live.receive(plain(MESSAGES.drafts)), [{ type: 'draft', id: 'msg_x' }]);
});

test('a message type the session does not know is ignored in every phase', () => {
  const made = sessions();
  for (const phase of Object.keys(PHASES)) {
    const session = made(phase);
    const before = snapshot(session);
    assert.deepEqual(session.receive({ type: 'from_a_newer_hub' }), []);
    assert.deepEqual(snapshot(session), before);
  }
});

test('the shells change connection state only along the table, each change one event', () => {
  const emitter = new Emitter();
  const seen = [];
  emitter.on('state', (event) => seen.push(event));
  const timers = [];
  const loop = new Reconnect(emitter, () => {}, {
    random: () => 0.5,
    setTimeout: (fn, ms) => timers.push(ms),
    clearTimeout: () => {},
  });
  assert.equal(loop.state, 'disconnected');
  loop.begin();
  loop.begin(); // a retry: no second `connecting`
  loop.ended(null, 1006, '', false); // a network failure: backoff
  loop.ended(null, 1006, '', false);
  assert.deepEqual(timers, [25, 50]);
  assert.equal(loop.failures, 2);
  loop.connected();
  assert.equal(loop.failures, 0);
  assert.throws(() => loop.set('connecting'), /from connected to connecting/);
  assert.equal(loop.ended('forbidden', 4003, 'forbidden', true), 'refused');
  assert.equal(loop.state, 'connected'); // a refusal is the shell's to close, with its code
  loop.set('closed', 'forbidden', 'no');
  assert.deepEqual(
    seen.map((event) => [event.state, event.code]),
    [
      ['connecting', null],
      ['disconnected', null],
      ['connected', null],
      ['closed', 'forbidden'],
    ],
  );
  for (const [from, to] of Object.entries(CONNECTION)) {
    for (const state of to) assert.ok(Object.hasOwn(CONNECTION, state), `${from} → ${state}`);
  }
  assert.ok(!CONNECTION.closed.includes('connecting')); // a closed shell never says connecting
});

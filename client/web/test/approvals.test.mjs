// Approvals (SPEC §12) in the JS replica: ask and decide as edits, a decision refused once
// decided, the events a session reports, and a decision that lost the race in a rebase.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  APPROVAL_KIND,
  Conversation,
  Message,
  ReplicaSession,
  UsageError,
  approvals,
  ask,
  decide,
  resultOf,
} from '../convsync.js';

const LINEAGE = 78;
const plain = (value) => JSON.parse(JSON.stringify(value));
const CALL = {
  role: 'assistant',
  content: [{ type: 'tool_call', id: 'c1', name: 'rm', arguments: {} }],
  stop: null,
  origin: null,
};

/** A log with an open turn, a call and an open approval about it; its records. */
function asked() {
  const log = new Conversation();
  log.extend([Message.user('clean up')]);
  log.addAside({
    kind: 'rig.turn',
    after: null,
    author: { kind: 'rig', name: null, request: null, title: null },
    value: { index: 0, start: log.id(0), end: null },
    saved: true,
  });
  log.push(CALL);
  const made = ask(log, { key: 'c1', call: 'c1', prompt: 'rm?', askedBy: 'w', askedClient: 'w' });
  return { log, id: made.id, records: plain(log.unsaved()) };
}

function welcomed(records) {
  const session = new ReplicaSession('ui');
  session.hello();
  session.receive({ type: 'welcome', lineage: LINEAGE, revision: records.length, acked: 0 });
  const events = session.receive({ type: 'records', from: 0, records, origin: null });
  return { session, events };
}

test('ask finds the approval of (turn, key) again, under the call it is about', () => {
  const { log, id } = asked();
  const again = ask(log, { key: 'c1', call: 'c1', askedBy: 'x', askedClient: 'y' });
  assert.equal(again.id, id);
  assert.equal(again.made, false);
  assert.equal(log.aside(id).after, log.id(1)); // drawn after the entry holding the call
  assert.throws(
    () => ask(new Conversation(), { key: 'k', askedBy: 'a', askedClient: 'b' }),
    (error) => error instanceof UsageError && error.reason === 'no_turn',
  );
});

test('a session reports an asked approval, and decide refuses a second decision', () => {
  const { id, records } = asked();
  const { session, events } = welcomed(records);
  assert.deepEqual(
    events.filter((e) => e.type === 'approval_asked').map((e) => e.id),
    [id],
  );
  const decided = decide(session.local, id, { approve: false, reason: 'no', decidedBy: 'ui' });
  assert.equal(decided.state, 'denied');
  assert.throws(
    () => decide(session.local, id, { approve: true, decidedBy: 'ui' }),
    (error) => error instanceof UsageError && error.reason === 'decided',
  );
  assert.equal(session.local.unsaved().length, 1);
});

test('a decision pending when another lands is a conflict decided, and the log one stands', () => {
  const { log, id, records } = asked();
  const { session } = welcomed(records);
  decide(session.local, id, { approve: false, decidedBy: 'b' });
  decide(log, id, { approve: true, decidedBy: 'a' });
  const theirs = plain(log.unsaved()).slice(records.length);
  const events = session.receive({ type: 'records', from: records.length, records: theirs, origin: null });
  const conflicts = events.filter((e) => e.type === 'conflict').map((e) => e.reason);
  assert.deepEqual(conflicts, ['decided']);
  assert.deepEqual(
    approvals(session.local).map(([, a]) => [a.state, a.decided_by]),
    [['approved', 'a']],
  );
  assert.ok(events.some((e) => e.type === 'approval_decided' && e.approval.state === 'approved'));
  assert.equal(session.local.asides().filter(([, a]) => a.kind === APPROVAL_KIND).length, 1);
});

test('an answer its schema refuses changes nothing', () => {
  const log = asked().log;
  const made = ask(log, {
    key: 'n',
    prompt: 'how many?',
    schema: { type: 'integer', minimum: 1 },
    askedBy: 'w',
    askedClient: 'w',
  });
  const before = plain(log.state());
  assert.throws(
    () => decide(log, made.id, { answer: 0, decidedBy: 'ui' }),
    (error) => error.reason === 'bad_answer' && error.message.includes('answer: at least 1'),
  );
  assert.deepEqual(plain(log.state()), before);
  assert.equal(decide(log, made.id, { answer: 3, decidedBy: 'ui' }).state, 'answered');
});

test('resultOf finds the first result after the call, and nothing before it', () => {
  const log = new Conversation();
  log.extend([Message.user('pick a file'), CALL]);
  assert.equal(resultOf(log, 'c1'), null);
  log.push({
    role: 'user',
    content: [
      { type: 'tool_result', call_id: 'c1', name: 'rm', content: [{ type: 'text', text: 'a' }] },
    ],
  });
  assert.equal(resultOf(log, 'c1').content[0].text, 'a');
  assert.equal(resultOf(log, 'nope'), null);
});

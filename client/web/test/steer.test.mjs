// Steering a running agent (SPEC §10) in the JS replica: the queued rule, the ack that counts
// a landed queue, and stop().
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  APPROVAL_KIND,
  Author,
  Conversation,
  Message,
  QUEUED_KIND,
  ReplicaSession,
  STOP_KIND,
  midStep,
  queuedId,
  stop,
} from '../convsync.js';

const LINEAGE = 77;
const plain = (value) => JSON.parse(JSON.stringify(value));
const CALL = {
  role: 'assistant',
  content: [{ type: 'tool_call', id: 'c1', name: 'search', arguments: {} }],
  stop: null,
  origin: null,
};

/** A welcomed, caught-up session on a log whose last message is a call nothing answers. */
function midCall() {
  const log = new Conversation();
  log.extend([Message.user('find x'), CALL]);
  const records = plain(log.unsaved());
  const session = new ReplicaSession('ui');
  session.hello();
  session.receive({ type: 'welcome', lineage: LINEAGE, revision: records.length, acked: 0 });
  session.receive({ type: 'records', from: 0, records, origin: null });
  assert.ok(session.ready && midStep(session.local));
  return session;
}

test('a push refused queued is replayed as a queued aside, and the entry leaves local', () => {
  const session = midCall();
  const id = session.local.push(Message.user('also y'));
  const { frame } = session.nextPush();
  assert.ok(frame !== null);
  const events = session.receive({
    type: 'reject',
    seq: 1,
    reason: 'queued',
    detail: 'mid-step',
    lineage: LINEAGE,
    revision: 1,
  });
  assert.deepEqual(events[0], { type: 'queued', ids: [queuedId(id)], mine: true });
  assert.equal(session.local.length, 2);
  const aside = session.local.aside(queuedId(id));
  assert.ok(aside !== null && aside.kind === QUEUED_KIND && aside.value.id === id);
  const [put] = session.local.unsaved();
  assert.equal(put.change.type, 'aside');
  // The aside goes next; its ack counts the result's push too (a queue landed with it).
  assert.ok(session.nextPush().frame !== null);
  session.receive({ type: 'ack', seq: 2, from: 1, revision: 5 });
  session.local.push(Message.user('more'));
  assert.equal(session.ready, false);
  assert.equal(session.nextPush().frame, null); // it waits for the records the ack counts
});

test('a withdrawal of a queued entry that landed is a conflict (landed)', () => {
  const session = midCall();
  const id = session.local.push(Message.user('also y'));
  session.nextPush();
  session.receive({
    type: 'reject',
    seq: 1,
    reason: 'queued',
    detail: '',
    lineage: LINEAGE,
    revision: 1,
  });
  session.nextPush();
  session.receive({ type: 'ack', seq: 2, from: 1, revision: 2 });
  session.local.removeAside(queuedId(id));
  session.nextPush();
  // The hub landed the queue before the withdrawal: the result, the entry, the aside's removal.
  const log = Conversation.fromState(plain(session.confirmed.state()));
  log.push(Message.toolResult('c1', 'search', 'found'));
  log.push({ message: Message.user('also y'), id });
  log.removeAside(queuedId(id));
  const records = plain(log.unsaved());
  session.receive({ type: 'records', from: 2, records, origin: null });
  const events = session.receive({
    type: 'reject',
    seq: 3,
    reason: 'behind',
    detail: '',
    lineage: LINEAGE,
    revision: 5,
  });
  assert.ok(events.some((event) => event.type === 'conflict' && event.reason === 'landed'));
  assert.equal(session.local.indexOf(id), 3);
  assert.equal(session.local.aside(queuedId(id)), null);
});

test('stop() asks mid-step, and halts stopped otherwise', () => {
  const working = midCall().local;
  assert.ok(stop(working, 5));
  const request = working.asides().find(([, aside]) => aside.kind === STOP_KIND);
  assert.ok(request !== undefined);
  assert.deepEqual(request[1].value, { turn: null, at: 5 });
  assert.equal(working.halted(), null);
  const idle = new Conversation();
  idle.push(Message.user('hi'));
  assert.ok(stop(idle));
  assert.equal(idle.halted(), 'stopped');
  assert.equal(stop(new Conversation()), false); // nothing runs, nothing is owed
});

test('an edit made on top of a queued batch merges with the records that overtook it', () => {
  const FOX = 'The quick brown fox jumps over the lazy dog.';
  const log = new Conversation();
  log.extend([Message.user(FOX), CALL]);
  const session = new ReplicaSession('ui');
  session.hello();
  const records = plain(log.takeUnsaved());
  session.receive({ type: 'welcome', lineage: LINEAGE, revision: records.length, acked: 0 });
  session.receive({ type: 'records', from: 0, records, origin: null });
  const edit = (conversation, old, word) => {
    const entry = conversation.entry(0);
    conversation.splice(0, 1, [{ ...entry, message: Message.user(FOX.replace(old, word)) }]);
  };
  session.local.push(Message.user('also y')); // mid-step: the hub will refuse it `queued`
  assert.ok(session.nextPush().frame !== null);
  edit(session.local, 'lazy', 'SLEEPY'); // made on top, on the text before the other edit
  const other = log.copy();
  edit(other, 'brown', 'RED'); // another replica's edit lands first and overtakes the batch
  const theirs = plain(other.unsaved());
  const from = records.length;
  session.receive({ type: 'records', from, records: theirs, origin: { client: 'w', seq: 1 } });
  const events = session.receive({
    type: 'reject',
    seq: 1,
    reason: 'queued',
    detail: 'mid-step',
    lineage: LINEAGE,
    revision: from + theirs.length,
  });
  assert.deepEqual(
    events.filter((e) => e.type === 'conflict'),
    [],
  );
  const merged = 'The quick RED fox jumps over the SLEEPY dog.';
  assert.equal(session.local.entry(0).message.content[0].text, merged);
});

test('a stop too late is the only conflict; the message typed with it is pushed again', () => {
  const session = midCall();
  assert.ok(stop(session.local, 5, 'anonymous'));
  const id = session.local.push(Message.user('and y'));
  assert.ok(session.nextPush().frame !== null);
  const events = session.receive({
    type: 'reject',
    seq: 1,
    reason: 'turn_ended',
    detail: 'the stop names a turn that has ended',
    lineage: LINEAGE,
    revision: 2,
  });
  const conflicts = events.filter((event) => event.type === 'conflict');
  assert.equal(conflicts.length, 1);
  assert.equal(conflicts[0].record.change.aside.kind, STOP_KIND);
  assert.ok(session.local.holds(id)); // still to be pushed
  assert.ok(!session.local.asides().some(([, aside]) => aside.kind === STOP_KIND));
  const [again] = session.local.unsaved();
  assert.equal(again.change.type, 'push');
});

test('a decision refused decided is the only conflict; the message typed with it is pushed again', () => {
  const session = midCall();
  const decided = {
    turn: 0,
    key: 'c1',
    call: 'c1',
    prompt: null,
    schema: null,
    state: 'denied',
    answer: null,
    reason: null,
    asked_by: 'anonymous',
    asked_client: 'worker',
    decided_by: 'anonymous',
    decided_at: 1,
  };
  session.local.addAside({ kind: APPROVAL_KIND, after: null, author: Author.user(), value: decided, saved: true });
  const id = session.local.push(Message.user('and y'));
  assert.ok(session.nextPush().frame !== null);
  const events = session.receive({
    type: 'reject',
    seq: 1,
    reason: 'decided',
    detail: "approval 'c1' was decided already (approved)",
    lineage: LINEAGE,
    revision: 2,
  });
  const conflicts = events.filter((event) => event.type === 'conflict');
  assert.equal(conflicts.length, 1);
  assert.equal(conflicts[0].record.change.aside.kind, APPROVAL_KIND);
  assert.ok(session.local.holds(id)); // still to be pushed
  const [again] = session.local.unsaved();
  assert.equal(again.change.type, 'push');
});

test('a decision refused turn_ended (its turn ended) is the only conflict; the message typed with it is pushed again', () => {
  // No stop in the batch: the hub refused it for the decision (SPEC §12, no decision once the
  // approval's turn ended), so the decision is the conflict and the message is kept.
  const session = midCall();
  const decided = {
    turn: 0,
    key: 'c1',
    call: 'c1',
    prompt: null,
    schema: null,
    state: 'approved',
    answer: null,
    reason: null,
    asked_by: 'anonymous',
    asked_client: 'worker',
    decided_by: 'anonymous',
    decided_at: 1,
  };
  session.local.addAside({ kind: APPROVAL_KIND, after: null, author: Author.user(), value: decided, saved: true });
  const id = session.local.push(Message.user('and y'));
  assert.ok(session.nextPush().frame !== null);
  const events = session.receive({
    type: 'reject',
    seq: 1,
    reason: 'turn_ended',
    detail: 'turn 0 has ended',
    lineage: LINEAGE,
    revision: 2,
  });
  const conflicts = events.filter((event) => event.type === 'conflict');
  assert.equal(conflicts.length, 1);
  assert.equal(conflicts[0].record.change.aside.kind, APPROVAL_KIND);
  assert.ok(session.local.holds(id)); // still to be pushed
  const [again] = session.local.unsaved();
  assert.equal(again.change.type, 'push');
});

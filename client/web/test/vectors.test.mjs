// Every shared vector (tests/vectors/*.json, written from the Python model) against convsync.js.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  answerProblem,
  ApplyError,
  CODES,
  closeCodeOf,
  codeOfClose,
  Conversation,
  DecodeError,
  diff,
  isAsideId,
  isMessageId,
  madeMs,
  mergeMessage,
  mergeText,
  midStep,
  ProtocolError,
  queueRecords,
  rebase,
  REJECTS,
  rejectRule,
  ReplicaSession,
  retryOf,
  schemaProblem,
} from '../convsync.js';

const load = (name) =>
  JSON.parse(readFileSync(new URL(`../../../tests/vectors/${name}`, import.meta.url), 'utf8'));

/** A value as JSON text and back: what a peer would see. */
const plain = (value) => JSON.parse(JSON.stringify(value));

test('ids: the message and aside id forms and their times', () => {
  const { message_ids: messageIds, aside_ids: asideIds } = load('ids.json');
  for (const { id, valid, made } of messageIds) {
    assert.equal(isMessageId(id), valid, id);
    if (valid) assert.equal(madeMs(id), made);
  }
  for (const { id, valid, made } of asideIds) {
    assert.equal(isAsideId(id), valid, id);
    if (valid) assert.equal(madeMs(id), made);
  }
});

for (const vector of load('fold.json').cases) {
  test(`fold: ${vector.name}`, () => {
    const conversation = new Conversation();
    let error = null;
    for (const [at, record] of vector.records.entries()) {
      const before = plain(conversation.state());
      try {
        conversation.apply(record);
      } catch (caught) {
        assert.ok(caught instanceof ApplyError || caught instanceof DecodeError, String(caught));
        error = { at, reason: caught.reason };
        // A record that does not fit changes nothing.
        assert.deepEqual(plain(conversation.state()), before);
        break;
      }
    }
    const { expect } = vector;
    assert.deepEqual(error, expect.error ?? null);
    assert.deepEqual(plain(conversation.state()), expect.state);
    assert.equal(conversation.revision, expect.revision);
    assert.equal(conversation.halted(), expect.halt);
    assert.equal(conversation.awaitsModel(), expect.awaits_model);
    assert.deepEqual(plain(conversation.turns()), expect.turns);
  });
}

for (const vector of load('rebase.json').cases) {
  test(`rebase: ${vector.name}`, () => {
    const base = new Conversation();
    for (const record of vector.base) base.apply(record);
    const onto = base.copy();
    for (const record of vector.log) onto.apply(record);
    const local = base.copy();
    for (const record of vector.pending) local.replay(record);
    const pending = local.takeUnsaved();
    const conflicts = rebase(local, onto, pending, vector.no_base ? null : base);
    const { expect } = vector;
    assert.deepEqual(plain(local.state()), expect.state);
    assert.equal(local.revision, expect.revision);
    assert.deepEqual(plain(local.unsaved()), expect.unsaved);
    assert.deepEqual(
      conflicts.map((c) => ({ at: pending.indexOf(c.record), reason: c.reason })),
      expect.conflicts,
    );
  });
}

// Steering (SPEC §10): the queued rule, mid-step and the reject table.
const steer = load('steer.json');
for (const vector of steer.queue) {
  test(`queue: ${vector.name}`, () => {
    assert.deepEqual(plain(queueRecords(vector.records, vector.after)), vector.expect);
  });
}
for (const vector of steer.mid_step) {
  test(`mid-step: ${vector.name}`, () => {
    const conversation = new Conversation();
    for (const record of vector.records) conversation.apply(record);
    assert.equal(midStep(conversation), vector.mid_step);
  });
}
test('rejects: the one table of reject reasons', () => {
  assert.deepEqual(plain(REJECTS), steer.rejects);
  assert.equal(rejectRule('some_newer_reason'), steer.unknown_reject);
});

// Approvals (SPEC §12): the JSON Schema subset an answer is checked with.
const approvalVectors = load('approvals.json');
test('approvals: answers checked against the schema subset, with the same messages', () => {
  for (const { schema, value, problem } of approvalVectors.answers) {
    assert.equal(answerProblem(schema, value), problem, JSON.stringify([schema, value]));
  }
});
test('approvals: schemas outside the subset are refused, with the same messages', () => {
  for (const { schema, problem } of approvalVectors.schemas) {
    assert.equal(schemaProblem(schema), problem, JSON.stringify(schema));
  }
});

// The error-code table (SPEC §5), once the Python side has it (`sync.errors.CODES`).
const codesFile = new URL('../../../tests/vectors/codes.json', import.meta.url);
test(
  'codes: the one table of error codes, close codes and retry rules',
  { skip: !existsSync(codesFile) },
  () => {
    const vectors = JSON.parse(readFileSync(codesFile, 'utf8'));
    assert.deepEqual(plain(CODES), vectors.codes);
    assert.equal(retryOf('some_newer_code'), vectors.unknown_retry);
    for (const { close, reason, code } of vectors.closes) {
      assert.equal(codeOfClose(close, reason), code, `${close} ${reason}`);
    }
    for (const [code, { close }] of Object.entries(vectors.codes))
      assert.equal(closeCodeOf(code), close);
  },
);

/** A session event as the vectors spell it (a conflict without its free-text detail). */
function eventOf(event) {
  if (event.type === 'conflict')
    return { type: 'conflict', reason: event.reason, record: plain(event.record) };
  return plain(event);
}

/** Play one step of a session script; return what came out. */
function observe(session, step) {
  try {
    switch (step.op) {
      case 'hello': // defaulted fields left out (the wire may omit them)
        return Object.fromEntries(
          Object.entries(plain(session.hello(step.token ?? null))).filter(
            ([, value]) => value !== null && !(Array.isArray(value) && value.length === 0),
          ),
        );
      case 'edit':
        for (const record of step.records) session.local.replay(record);
        return null;
      case 'receive':
        return session.receive(plain(step.message)).map(eventOf);
      case 'next_push': {
        const { frame, conflicts } = session.nextPush();
        return {
          frame: frame === null ? null : JSON.parse(frame),
          conflicts: conflicts.map(eventOf),
        };
      }
      case 'disconnected':
        return session.disconnected(step.reason).map(eventOf);
      default:
        throw new Error(`unknown step ${step.op}`);
    }
  } catch (error) {
    if (error instanceof ProtocolError) return { error: error.reason };
    throw error;
  }
}

for (const vector of load('session.json').cases) {
  test(`session: ${vector.name}`, () => {
    const { options } = vector;
    const session = new ReplicaSession(options.client, {
      maxFrame: options.max_frame,
      maxBatch: options.max_batch,
    });
    for (const [at, step] of vector.steps.entries()) {
      assert.deepEqual(observe(session, step), step.expect, `step ${at}: ${step.op}`);
    }
    const { final } = vector;
    assert.deepEqual(plain(session.local.state()), final.local);
    assert.equal(session.local.revision, final.local_revision);
    assert.deepEqual(plain(session.local.unsaved()), final.unsaved);
    assert.deepEqual(plain(session.confirmed.state()), final.confirmed);
    assert.equal(session.confirmed.revision, final.confirmed_revision);
    assert.equal(session.confirmed.lineage, final.lineage);
    assert.equal(session.pending, final.pending);
    assert.equal(session.seq, final.seq);
    assert.equal(session.ready, final.ready);
    assert.equal(session.settled, final.settled);
  });
}

const merges = load('merge.json');
test('merge: diff hunks over code points, as pinned', () => {
  for (const vector of merges.diffs) {
    assert.deepEqual(diff(vector.base, vector.other), vector.hunks, JSON.stringify(vector));
  }
});
for (const vector of merges.texts) {
  test(`merge text: ${vector.name}`, () => {
    assert.equal(mergeText(vector.base, vector.ours, vector.theirs), vector.merged);
    assert.equal(mergeText(vector.base, vector.theirs, vector.ours), vector.merged);
  });
}
for (const vector of merges.messages) {
  test(`merge message: ${vector.name}`, () => {
    // The vectors hold messages as Python encodes them: every field, defaults filled in.
    const merged = mergeMessage(vector.base, vector.ours, vector.theirs);
    assert.deepEqual(merged === null ? null : plain(merged), vector.merged);
  });
}

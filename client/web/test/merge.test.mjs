// Concurrent edits of one message merge, or conflict, never vanish (SPEC 16), in the JS model:
// two replicas' values edit one message made on the same base; one edit lands, the other is
// rebased onto the log as `ReplicaSession` rebases it.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  Author,
  Conversation,
  Message,
  mergeText,
  queueRecords,
  queuedId,
  rebase,
} from '../convsync.js';

const FOX = 'The quick brown fox jumps over the lazy dog.';

/** A base holding FOX, and two replicas' copies of it. */
function threeCopies() {
  const base = new Conversation();
  const maker = new Conversation();
  maker.push(Message.user(FOX));
  for (const record of maker.takeUnsaved()) base.apply(record);
  return { base, a: base.copy(), b: base.copy() };
}

/** Rewrite the first message in place (same id), `old` replaced by `word`. */
function edit(conversation, old, word) {
  const entry = conversation.entry(0);
  conversation.splice(0, 1, [{ ...entry, message: Message.user(FOX.replace(old, word)) }]);
}

/** A's edit lands in the log; B's, made on the same base, is rebased onto it. */
function landThenRebase(aWord, bWord, aOld = 'brown', bOld = 'brown') {
  const { base, a, b } = threeCopies();
  edit(a, aOld, aWord);
  edit(b, bOld, bWord);
  const log = base.copy();
  for (const record of a.takeUnsaved()) log.apply(record);
  const pending = b.takeUnsaved();
  const conflicts = rebase(b, log, pending, base);
  for (const record of b.unsaved()) log.apply(record); // B pushes what the rebase left
  return { log, b, conflicts };
}

const text = (conversation) => conversation.entry(0).message.content[0].text;

test("the issue's case merges: RED and SLEEPY both land, no conflict", () => {
  const { log, b, conflicts } = landThenRebase('RED', 'SLEEPY', 'brown', 'lazy');
  assert.deepEqual(conflicts, []);
  assert.equal(text(log), 'The quick RED fox jumps over the SLEEPY dog.');
  assert.equal(text(b), text(log));
});

test('both change "brown": one conflict `edited` with both versions, the log keeps its own', () => {
  const { log, b, conflicts } = landThenRebase('RED', 'BLUE');
  assert.equal(conflicts.length, 1);
  const [conflict] = conflicts;
  assert.equal(conflict.reason, 'edited');
  assert.equal(conflict.theirs.message.content[0].text, FOX.replace('brown', 'RED'));
  assert.equal(conflict.ours.message.content[0].text, FOX.replace('brown', 'BLUE'));
  assert.equal(text(log), FOX.replace('brown', 'RED'));
  assert.equal(text(b), text(log));
  assert.deepEqual(b.unsaved(), []);
});

test('code points, not UTF-16 units: edits beside astral characters merge', () => {
  const base = 'a\u{1F98A}b\u{1F600}c';
  assert.equal(
    mergeText(base, 'A\u{1F98A}b\u{1F600}c', 'a\u{1F98A}b\u{1F600}C'),
    'A\u{1F98A}b\u{1F600}C',
  );
  assert.equal(mergeText('\u{1F98A}', '\u{1F600}', '\u{1F525}'), null);
});

test('a queued aside put again after its queue landed is a conflict `landed`, not put back', () => {
  // The user's text waited as a queued aside; another step of this replica moved it (put it
  // again) while the hub landed the queue: pushed the entry and removed the aside.
  const maker = new Conversation();
  maker.push(Message.user('find x'));
  const text = new Conversation();
  const entryId = text.push(Message.user('again'));
  const [queued] = queueRecords(text.takeUnsaved(), null);
  const base = new Conversation();
  for (const record of [...maker.takeUnsaved(), queued]) base.apply(record);
  const id = queuedId(entryId);
  const local = base.copy();
  local.replaceAside(id, { ...local.aside(id), after: local.entry(0).id });
  const pending = local.takeUnsaved();
  const log = base.copy();
  const lands = new Conversation();
  lands.push({ ...queued.change.aside.value, id: entryId });
  log.apply(lands.takeUnsaved()[0]);
  log.apply({ change: { type: 'aside', id, aside: null }, by: Author.rig(), at: null });
  const conflicts = rebase(local, log, pending, base);
  assert.deepEqual(
    conflicts.map((c) => c.reason),
    ['landed'],
  );
  assert.equal(local.aside(id), null);
  assert.deepEqual(local.unsaved(), []);
});

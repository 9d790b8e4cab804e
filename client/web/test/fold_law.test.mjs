// The fold law for the JS edits: folding a value's records onto an empty conversation gives an
// equal value; and a rebase of random pending edits on a random log never loses one silently.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Author, Conversation, Message, rebase } from '../convsync.js';

/** A small seeded PRNG (mulberry32), so a failure names its seed. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const plain = (value) => JSON.parse(JSON.stringify(value));

/** One random edit of `c`. */
function edit(c, random, n) {
  const pick = (k) => Math.floor(random() * k);
  const length = c.length;
  switch (pick(9)) {
    case 0:
    case 1:
      c.push(random() < 0.5 ? Message.user(`u${n}`) : Message.assistant(`a${n}`));
      break;
    case 2:
      c.extend([Message.user(`x${n}`), Message.assistant(`y${n}`)]);
      break;
    case 3: {
      const start = pick(length + 1);
      const stop = start + pick(length - start + 1);
      const kept = c
        .entries()
        .slice(start, stop)
        .filter(() => random() < 0.5);
      c.splice(start, stop, [...kept, Message.system(`s${n}`)], Author.plugin('p'));
      break;
    }
    case 4:
      c.halt(random() < 0.5 ? 'stopped' : 'kept');
      break;
    case 5:
      c.resume();
      break;
    case 6:
      c.addAside({
        kind: 'note',
        after: c.id(pick(length + 1) - 1),
        author: Author.user(),
        value: { n },
      });
      break;
    case 7: {
      const asides = c.asides();
      if (asides.length > 0) c.removeAside(asides[pick(asides.length)][0]);
      break;
    }
    default: {
      const asides = c.asides();
      if (asides.length > 0) {
        const [id, aside] = asides[pick(asides.length)];
        c.replaceAside(id, { ...aside, value: { edited: n } });
      }
    }
  }
}

test('fold law: the records of 200 random edit runs rebuild the value they made', () => {
  for (let seed = 1; seed <= 200; seed += 1) {
    const random = prng(seed);
    const made = new Conversation();
    for (let n = 0; n < 30; n += 1) edit(made, random, n);
    const folded = new Conversation();
    for (const record of plain(made.unsaved())) folded.apply(record);
    assert.deepEqual(plain(folded.state()), plain(made.state()), `seed ${seed}`);
    assert.equal(folded.revision, made.revision, `seed ${seed}`);
  }
});

test('rebase: every pending record is replayed or reported, and the result folds', () => {
  for (let seed = 1; seed <= 200; seed += 1) {
    const random = prng(1000 + seed);
    const base = new Conversation();
    for (let n = 0; n < 10; n += 1) edit(base, random, n);
    base.takeUnsaved();
    const log = base.copy();
    for (let n = 10; n < 20; n += 1) edit(log, random, n);
    const onto = base.copy();
    for (const record of plain(log.takeUnsaved())) onto.apply(record);
    const local = base.copy();
    for (let n = 20; n < 30; n += 1) edit(local, random, n);
    const pending = local.takeUnsaved();
    const conflicts = rebase(local, onto, pending, base);
    const replayed = local.unsaved();
    // Nothing vanishes without a reason: each pending record was replayed, reported, or moot
    // (a push that landed, a clear or a removal with nothing left to do).
    assert.ok(replayed.length + conflicts.length <= pending.length, `seed ${seed}`);
    for (const c of conflicts) assert.ok(pending.includes(c.record) && c.reason, `seed ${seed}`);
    // What the rebase left to push applies on the log and gives the local value.
    const check = onto.copy();
    for (const record of plain(replayed)) check.apply(record);
    assert.deepEqual(plain(check.state()), plain(local.state()), `seed ${seed}`);
  }
});

// @ts-check
// Replaying pending records by intent on a log that moved (`sync/rebase.py`).
import { decidedMeanwhile } from './approvals.js';
import { jsonEqual } from './conversation.js';
import { ConvsyncError } from './errors.js';
import { mergeAside, mergeEntry } from './merge.js';
import { QUEUED_KIND, queuedEntryId } from './steer.js';

/**
 * Whether `rebase` needs the base `pending` was made on: for a pure insertion (placed by its
 * neighbour there) and for an edit (a splice putting entries in place of others, or an aside
 * put), merged with what the log changed since (as `sync/rebase.py`).
 * @param {ChangeRecord[]} pending
 */
export function needsBase(pending) {
  return pending.some((record) => {
    const change = record.change;
    if (change.type === 'splice') return change.removed.length === 0 || change.entries.length > 0;
    return change.type === 'aside' && change.aside !== null;
  });
}

/**
 * Whether `change` replaces content of `log` (entries put in place of others, or an aside put
 * over one the log holds): what only its base can tell was changed under it.
 * @param {Conversation} log @param {any} change
 */
function edits(log, change) {
  if (change.type === 'splice') return change.removed.length > 0 && change.entries.length > 0;
  if (change.type === 'aside' && change.aside !== null) {
    const held = log.aside(change.id);
    return held !== null && held.saved;
  }
  return false;
}

/**
 * `record` (made on `walk`) with each entry or aside it replaces that `local` changed since
 * `walk` merged three ways; a conflict `edited` when two edits clash (as Python's `_merged`).
 * @param {Conversation} local @param {Conversation} walk @param {ChangeRecord} record
 * @returns {ChangeRecord | Conflict}
 */
function merged(local, walk, record) {
  const change = /** @type {any} */ (record.change);
  if (change.type === 'aside') {
    if (change.aside === null) return record;
    const then = walk.aside(change.id);
    const held = local.aside(change.id);
    if (held === null || !held.saved || jsonEqual(held, then)) return record;
    if (decidedMeanwhile(then, held, change.aside)) {
      // SPEC §12: one decision stands; a pending one over it never merges or overwrites.
      return conflict(record, 'decided', 'the approval was decided meanwhile', held, change.aside);
    }
    if (then === null) {
      // Not in its base, yet the log put one under that id since: the same only when equal.
      if (jsonEqual(held, change.aside)) return record;
      return conflict(record, 'edited', 'the aside was put again meanwhile', held, change.aside);
    }
    const aside = mergeAside(then, held, change.aside);
    if (aside === null) {
      return conflict(record, 'edited', 'the aside was edited meanwhile', held, change.aside);
    }
    if (jsonEqual(aside, change.aside)) return record;
    return { ...record, change: { type: 'aside', id: change.id, aside } };
  }
  if (change.type !== 'splice' || change.removed.length === 0 || change.entries.length === 0) {
    return record; // a pure removal takes out what stands, edited or not
  }
  const entries = change.entries;
  /** @type {any[] | null} */
  let fresh = null;
  const keyed = new Map(entries.map((/** @type {any} */ e, /** @type {number} */ k) => [e.id, k]));
  const removed = new Set(change.removed);
  const oneToOne = entries.length === change.removed.length;
  for (let offset = 0; offset < change.removed.length; offset += 1) {
    const id = change.removed[offset];
    const at = local.indexOf(id);
    const was = walk.indexOf(id);
    if (at === null || was === null) return record; // gone: the re-targeting reports it
    const now = local.entry(at);
    const base = walk.entry(was);
    if (jsonEqual(now, base)) continue;
    let k = keyed.get(id);
    if (k === undefined && oneToOne && !removed.has(entries[offset].id)) k = offset;
    if (k === undefined) {
      return conflict(record, 'edited', 'an entry it replaces was edited meanwhile', now, null);
    }
    const mine = fresh === null ? entries[k] : fresh[k];
    const entry = mergeEntry(base, now, mine);
    if (entry === null) {
      return conflict(record, 'edited', 'an entry it edits was edited meanwhile', now, mine);
    }
    if (!jsonEqual(entry, mine)) {
      if (fresh === null) fresh = entries.slice();
      /** @type {any[]} */ (fresh)[k] = entry;
    }
  }
  if (fresh === null) return record;
  return { ...record, change: { ...change, entries: fresh } };
}

const NO_ANCHOR = '';

/**
 * Make `local` hold `onto` plus `pending` replayed by intent (as `sync/rebase.py`); return the
 * conflicts `{record, reason, detail}`. `local`'s outbox must be empty; afterwards it holds the
 * replayed records. `base` (the value `pending` was made on) is needed only when `needsBase`.
 * @param {Conversation} local @param {Conversation} onto @param {ChangeRecord[]} pending
 * @param {Conversation | null} [base]
 */
export function rebase(local, onto, pending, base = null) {
  const walk = base !== null && needsBase(pending) ? base.copy() : null;
  // An unsaved aside may stand where the log still has a saved one that a pending record
  // removes (a saved aside replaced by an unsaved one): set it apart over the reread, which
  // would refuse it, and put it back unless its saved twin is there again.
  const shadowing = local.asides().filter(([id, aside]) => {
    const held = aside.saved ? null : onto.aside(id);
    return held !== null && held.saved;
  });
  for (const [id] of shadowing) local.removeAside(id); // unsaved: records nothing
  local.reread(onto);
  /** @type {Conflict[]} */
  const conflicts = [];
  for (const record of pending) {
    /** @type {string | null} */
    let anchor = NO_ANCHOR;
    /** @type {ChangeRecord | Conflict} */
    let mergedRecord = record;
    if (walk !== null) {
      anchor = anchorOf(walk, record);
      mergedRecord = merged(local, walk, record);
      try {
        walk.apply(record);
      } catch (error) {
        if (!(error instanceof ConvsyncError)) throw error;
        conflicts.push({
          type: 'conflict',
          record,
          reason: error.reason,
          detail: 'does not fit the base',
        });
        continue;
      }
    } else if (edits(local, record.change)) {
      // Without the base there is no telling what the log changed under the edit.
      conflicts.push(conflict(record, 'base_unknown', 'no base to merge the edit'));
      continue;
    }
    if ('reason' in mergedRecord) {
      conflicts.push(mergedRecord);
      continue;
    }
    const replayed = retarget(local, mergedRecord, anchor);
    if (replayed === null) continue;
    if ('reason' in replayed) {
      conflicts.push({ ...replayed, record });
      continue;
    }
    try {
      local.replay(replayed);
    } catch (error) {
      if (!(error instanceof ConvsyncError)) throw error;
      conflicts.push({ type: 'conflict', record, reason: error.reason, detail: error.detail });
    }
  }
  for (const [id, aside] of shadowing) {
    if (local.aside(id) === null) local.restoreUnsavedAside(id, aside);
  }
  return conflicts;
}

/** For a pure insertion, the id of the entry it went after in `walk` (null: first). */
function anchorOf(walk, record) {
  const change = record.change;
  if (change.type === 'splice' && change.start === change.stop) {
    return change.start > 0 ? walk.id(change.start - 1) : null;
  }
  return NO_ANCHOR;
}

/**
 * @param {ChangeRecord} record @param {string} reason @param {string} detail
 * @param {any} [theirs] the log's version, for `edited` @param {any} [ours] the pending one
 * @returns {Conflict}
 */
export function conflict(record, reason, detail, theirs = null, ours = null) {
  return { type: 'conflict', record, reason, detail, theirs, ours };
}

/**
 * The record to replay on `local` now, a conflict, or null when it is moot.
 * @param {Conversation} local @param {ChangeRecord} record @param {string | null} anchor
 * @returns {ChangeRecord | Conflict | null}
 */
function retarget(local, record, anchor) {
  const change = record.change;
  switch (change.type) {
    case 'push': {
      const fresh = change.entries.filter((e) => !(local.holds(e.id) || local.isRetired(e.id)));
      if (fresh.length === 0) return null;
      if (fresh.length === change.entries.length) return record;
      return { ...record, change: { type: 'push', entries: fresh } };
    }
    case 'splice': {
      const { start, stop, removed, entries } = change;
      let at;
      if (removed.length > 0) {
        at = local.indexOf(removed[0]);
        let together = at !== null;
        for (let k = 0; together && k < removed.length; k += 1)
          together = local.id(/** @type {number} */ (at) + k) === removed[k];
        if (!together) return conflict(record, 'removed_moved', 'the entries it replaced changed');
      } else if (anchor === null) {
        at = 0;
      } else if (anchor === NO_ANCHOR) {
        return conflict(record, 'anchor_unknown', 'no base to place the insertion');
      } else {
        const held = local.indexOf(anchor);
        if (held === null) return conflict(record, 'anchor_gone', 'the entry it followed is gone');
        at = held + 1;
      }
      at = /** @type {number} */ (at);
      if (at === start && (removed.length === 0 || stop - start === removed.length)) return record;
      return {
        ...record,
        change: { type: 'splice', start: at, stop: at + removed.length, removed, entries },
      };
    }
    case 'halt':
      if (change.halt === null) return local.halted() !== null ? record : null;
      if (!local.awaitsModel())
        return conflict(record, 'answered', 'the model no longer owes an answer');
      return record;
    case 'aside': {
      if (change.aside === null) {
        const current = local.aside(change.id);
        if (current !== null && current.saved) return record;
        // SPEC §10: a queued entry that landed can no longer be withdrawn.
        if (local.holds(queuedEntryId(change.id)))
          return conflict(record, 'landed', 'the queued entry has landed');
        return null;
      }
      if (change.aside.kind === QUEUED_KIND) {
        // Put again (moved, say) after its queue landed: landing it twice.
        const entryId = queuedEntryId(change.id);
        if (local.holds(entryId) || local.isRetired(entryId))
          return conflict(record, 'landed', 'the queued entry has landed');
      }
      return record;
    }
    case 'reset':
      return record;
    default:
      return conflict(record, 'unknown_change', String(/** @type {any} */ (change).type));
  }
}

/**
 * A pending record that could not be replayed. For reason `edited`, `theirs` is the log's
 * version of the entry or aside (it stays) and `ours` the record's (it did not land; null when
 * the record put nothing in its place one to one); both null otherwise.
 * @typedef {{type: 'conflict', record: ChangeRecord, reason: string, detail: string,
 *   theirs?: any, ours?: any}} Conflict
 */

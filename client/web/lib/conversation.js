// @ts-check
// The conversation and its fold: the twin of `sync/conversation.py`.
import { ApplyError, UsageError } from './errors.js';
import { grouped, utf8Length } from './frames.js';
import { Lineage, defaultMinter, isAsideId, isMessageId } from './ids.js';
import { Author, STOPPED, isFailedReply } from './messages.js';
import {
  HALTS,
  isObject,
  malformed,
  readAside,
  readEntry,
  readMessage,
  readRecord,
  readState,
} from './records.js';

/**
 * @typedef {{kind: string, name: string | null, request: string | null, title: string | null}} AuthorValue
 * @typedef {{role: string, content: any, [field: string]: any}} MessageValue
 * @typedef {{message: MessageValue, id: string | null, author: AuthorValue | null, source_id: string | null}} Entry
 * @typedef {{kind: string, after: string | null, author: AuthorValue, value: any, saved: boolean}} AsideValue
 * @typedef {{entries: Entry[], asides: ({id: string} & AsideValue)[], halt: 'stopped' | 'kept' | null, retired: string[]}} ConversationState
 * @typedef {{type: 'push', entries: Entry[]}
 *   | {type: 'splice', start: number, stop: number, removed: string[], entries: Entry[]}
 *   | {type: 'halt', halt: 'stopped' | 'kept' | null}
 *   | {type: 'aside', id: string, aside: AsideValue | null}
 *   | {type: 'reset', state: ConversationState}} Change
 * @typedef {{change: Change, by: AuthorValue | null, at: number | null}} ChangeRecord
 */

/** Deep equality of JSON values (messages, authors, aside values). */
export function jsonEqual(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i += 1) if (!jsonEqual(a[i], b[i])) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  const keys = Object.keys(a).filter((k) => a[k] !== undefined);
  const other = Object.keys(b).filter((k) => b[k] !== undefined);
  if (keys.length !== other.length) return false;
  for (const key of keys) if (!jsonEqual(a[key], b[key])) return false;
  return true;
}

/** @param {any} item @returns {Entry} */
function asEntry(item) {
  if (isObject(item) && 'message' in item) return readEntry(item, 'entry');
  if (isObject(item) && 'role' in item) {
    return { message: readMessage(item, 'message'), id: null, author: null, source_id: null };
  }
  throw new UsageError('not_an_entry', 'expected an entry or a message');
}

/** @param {string[]} ids */
function repeatedId(ids) {
  const seen = new Set();
  for (const id of ids) {
    if (seen.has(id)) return id;
    seen.add(id);
  }
  return null;
}

/**
 * A conversation: entries, asides, a halt, retired ids, and the outbox of unsaved records.
 * The same value and the same fold as Python's `sync.Conversation`.
 */
export class Conversation {
  /** @type {Entry[]} */ #entries = [];
  /** @type {Map<string, number>} id → position; positions from `#freshUpto` on may be stale */
  #index = new Map();
  #freshUpto = 0;
  /** @type {Set<string>} */ #retired = new Set();
  /** @type {Map<string, any>} */ #asides = new Map();
  /** @type {string | null} */ #halt = null;
  /** @type {ChangeRecord[]} */ #outbox = [];
  /** @type {(() => void) | null} */ #listener = null;
  /** @type {(() => void) | null} */ #beforeEdit = null;
  /** @type {number | null} */ #recordLimit = null;
  /** The records behind this value. */
  revision = 0;
  /** The saved log this value continues. @type {number} */
  lineage = Lineage.EMPTY;

  /** @param {{ids?: IdMinter, recordLimit?: number | null}} [options] */
  constructor(options = {}) {
    this.ids = options.ids ?? defaultMinter;
    this.recordLimit = options.recordLimit ?? null;
  }

  /**
   * The most UTF-8 bytes one record made here may take as JSON; `null`: no limit (Python's
   * `record_limit`). An edit whose record is larger throws `UsageError` (`too_large`) and
   * changes nothing. A replica session sets it from `maxFrame`. Records folded by `apply` or
   * `replay` are not measured; copies have no limit.
   */
  get recordLimit() {
    return this.#recordLimit;
  }

  set recordLimit(limit) {
    if (limit !== null && !(Number.isInteger(limit) && limit >= 1)) {
      throw new UsageError(
        'bad_setting',
        `recordLimit must be a positive number of bytes, got ${JSON.stringify(limit)}`,
      );
    }
    this.#recordLimit = limit;
  }

  /**
   * A conversation holding `state` (the serde form), with lineage `DETACHED` and revision 0.
   * @throws {ApplyError | DecodeError}
   */
  static fromState(state, options = {}) {
    const conversation = new Conversation(options);
    conversation.#foldReset(readState(state, 'state'));
    conversation.lineage = Lineage.DETACHED;
    return conversation;
  }

  /** A full copy: entries, asides, halt, outbox, revision, lineage (messages shared). */
  copy() {
    const other = new Conversation({ ids: this.ids });
    other.#entries = this.#entries.slice();
    other.#index = new Map(this.#index);
    other.#freshUpto = this.#freshUpto;
    other.#retired = new Set(this.#retired);
    other.#asides = new Map(this.#asides);
    other.#halt = this.#halt;
    other.#outbox = this.#outbox.slice();
    other.revision = this.revision;
    other.lineage = this.lineage;
    return other;
  }

  // ---------------------------------------------------------------- reads

  get length() {
    return this.#entries.length;
  }

  /** The messages, oldest first: what a model request sends. */
  messages() {
    return this.#entries.map((entry) => entry.message);
  }

  /** The entries, oldest first (a copy of the list; the entries themselves are shared). */
  entries() {
    return this.#entries.slice();
  }

  /** Entry `at`, or `null` out of range. @param {number} at */
  entry(at) {
    return at >= 0 && at < this.#entries.length ? this.#entries[at] : null;
  }

  /** The id of entry `at`, or `null`. @param {number} at */
  id(at) {
    const entry = this.entry(at);
    return entry === null ? null : entry.id;
  }

  /** Where entry `id` is now, or `null`. @param {string} id */
  indexOf(id) {
    return this.#position(id);
  }

  /** Whether entry `id` is held now. @param {string} id */
  holds(id) {
    return this.#index.has(id);
  }

  /** Whether an edit took entry `id` out. @param {string} id */
  isRetired(id) {
    return this.#retired.has(id);
  }

  /** Its index while held; 0 once retired; the end for an id not made yet. @param {string} id */
  startOf(id) {
    const at = this.#position(id);
    if (at !== null) return at;
    return this.#retired.has(id) ? 0 : this.#entries.length;
  }

  /** Why the user's last message is left unanswered (`'stopped'`, `'kept'`), or `null`. */
  halted() {
    return this.#halt;
  }

  #readEnd() {
    let at = this.#entries.length;
    while (at > 0 && isFailedReply(this.#entries[at - 1].message)) at -= 1;
    return at;
  }

  /** Whether the model owes an answer: the last message it reads is the user's, unhalted. */
  awaitsModel() {
    const end = this.#readEnd();
    return end > 0 && this.#entries[end - 1].message.role === 'user' && this.#halt === null;
  }

  /** The asides, saved and unsaved, in the order put, as `[id, aside]` pairs. */
  asides() {
    return Array.from(this.#asides.entries());
  }

  /** Aside `id`, or `null`. @param {string} id */
  aside(id) {
    return this.#asides.get(id) ?? null;
  }

  /**
   * The turn records (asides of kind `rig.turn`), oldest first, as `[asideId, {index, start,
   * end}]`; malformed ones are skipped.
   */
  turns() {
    const turns = [];
    for (const [id, aside] of this.#asides) {
      const value = aside.value;
      if (
        aside.kind === 'rig.turn' &&
        isObject(value) &&
        Number.isInteger(value.index) &&
        typeof value.start === 'string' &&
        (value.end == null || (isObject(value.end) && typeof value.end.how === 'string'))
      ) {
        turns.push([id, { index: value.index, start: value.start, end: value.end ?? null }]);
      }
    }
    return turns;
  }

  /** The records made here that nobody saved yet, oldest first. */
  unsaved() {
    return this.#outbox.slice();
  }

  /** The serde form: `{entries, asides, halt, retired}` (saved asides only, in order put). */
  state() {
    const asides = [];
    for (const [id, aside] of this.#asides) {
      if (aside.saved) asides.push({ id, ...aside });
    }
    return {
      entries: this.#entries.slice(),
      asides,
      halt: this.#halt,
      retired: Array.from(this.#retired),
    };
  }

  toJSON() {
    return this.state();
  }

  /** Equality of entries, saved asides and halt (not outbox, revision or lineage). */
  equals(other) {
    return (
      other instanceof Conversation &&
      jsonEqual(this.state().entries, other.state().entries) &&
      this.#halt === other.#halt &&
      jsonEqual(this.state().asides, other.state().asides)
    );
  }

  /**
   * Whether this value's unsaved records, appended to log `lineage` of `changes` records,
   * give this value. @param {number} lineage @param {number} changes
   */
  continues(lineage, changes) {
    const unsaved = this.#outbox.length;
    if (this.lineage === lineage && this.revision - unsaved === changes) return true;
    return this.lineage === Lineage.EMPTY && this.revision === unsaved && changes === 0;
  }

  // ---------------------------------------------------------------- sync

  /**
   * Fold `record` (from a log or the hub) verbatim: not put in the outbox; one revision.
   * @throws {ApplyError | DecodeError} the record does not fit (or does not decode); nothing
   *   changed.
   */
  apply(record) {
    const read = readRecord(record);
    this.#fold(read.change, read.change.type);
    this.revision += 1;
  }

  /**
   * Fold `record` as an edit made here: it goes into the outbox (a rebase replays this way).
   * @throws {ApplyError | DecodeError}
   */
  replay(record) {
    this.#replayRead(readRecord(record));
  }

  /** `replay` of a record already read. */
  #replayRead(read) {
    if (this.#beforeEdit !== null) {
      const hook = this.#beforeEdit;
      this.#beforeEdit = null;
      hook();
    }
    this.#fold(read.change, read.change.type);
    this.revision += 1;
    this.#outbox.push(read);
    if (this.#listener !== null) this.#listener();
  }

  /** Call `listener` after each record this value makes (not after `apply`); `null` removes. */
  onEdit(listener) {
    this.#listener = listener;
  }

  /**
   * Call `hook` once, right before the next record this value makes (or replays) is folded,
   * then forget it; `null` removes it. The session keeps what a placed batch was made on this
   * way (as `Conversation.before_edit` in Python).
   */
  beforeEdit(hook) {
    this.#beforeEdit = hook;
  }

  /** Take the unsaved records, to save them; the revision stays. */
  takeUnsaved() {
    const outbox = this.#outbox;
    this.#outbox = [];
    return outbox;
  }

  /** Put records taken with `takeUnsaved` back at the front of the outbox. */
  returnUnsaved(records) {
    this.#outbox = records.concat(this.#outbox);
  }

  /** Mark this value as holding the `changes` records of log `lineage`, then its unsaved ones. */
  continueLog(lineage, changes) {
    this.lineage = lineage;
    this.revision = changes + this.#outbox.length;
  }

  /**
   * Take everything a log holds from `fromLog`; this value's unsaved asides stay.
   * @param {Conversation} fromLog
   * @throws {ApplyError} `mismatch` while either value has unsaved records, or an unsaved
   *   aside's id is saved in `fromLog`.
   */
  reread(fromLog) {
    if (this.#outbox.length > 0 || fromLog.#outbox.length > 0) {
      throw new ApplyError('mismatch', 'cannot reread while records are unsaved');
    }
    const unsaved = new Map();
    for (const [id, aside] of this.#asides) if (!aside.saved) unsaved.set(id, aside);
    for (const id of unsaved.keys()) {
      if (fromLog.#asides.has(id)) {
        throw new ApplyError('mismatch', "an unsaved aside's id is saved in the log");
      }
    }
    this.#entries = fromLog.#entries.slice();
    this.#index = new Map(fromLog.#index);
    this.#freshUpto = fromLog.#freshUpto;
    this.#retired = new Set(fromLog.#retired);
    const asides = new Map();
    for (const [id, aside] of fromLog.#asides) if (aside.saved) asides.set(id, aside);
    for (const [id, aside] of unsaved) asides.set(id, aside);
    this.#asides = asides;
    this.#halt = fromLog.#halt;
    this.lineage = fromLog.lineage;
    this.revision = fromLog.revision;
  }

  // ---------------------------------------------------------------- edits

  /** @param {ChangeRecord['change']} change @param {any} by */
  #record(change, by) {
    this.#replayRead(this.#made(change, by));
  }

  /**
   * The record of an edit made here now, read, and measured against `recordLimit`.
   * @param {ChangeRecord['change']} change @param {any} by
   * @throws {UsageError} `too_large`: the record is over the limit; nothing changed.
   */
  #made(change, by) {
    const read = readRecord({ change, by: by ?? null, at: null });
    const limit = this.#recordLimit;
    if (limit !== null) {
      const size = utf8Length(JSON.stringify(read));
      if (size > limit) {
        throw new UsageError(
          'too_large',
          `this edit's record is ${grouped(size)} bytes, over the record limit of ` +
            `${grouped(limit)} bytes (a replica's maxFrame less its push header); nothing ` +
            'was changed',
        );
      }
    }
    return read;
  }

  /** @param {string | null | undefined} wanted @param {Set<string>} taken */
  #freshId(wanted, taken) {
    if (
      wanted != null &&
      !taken.has(wanted) &&
      !this.#index.has(wanted) &&
      !this.#retired.has(wanted) &&
      isMessageId(wanted)
    ) {
      return wanted;
    }
    return this.ids.messageId();
  }

  /** @param {any[]} items */
  #pushed(items) {
    const entries = [];
    const taken = new Set();
    if (this.#halt === 'stopped') {
      entries.push({
        message: { role: 'user', content: [{ type: 'text', text: STOPPED }] },
        id: this.ids.messageId(),
        author: Author.rig(),
        source_id: null,
      });
    }
    for (const item of items) {
      const entry = asEntry(item);
      const id = this.#freshId(entry.id, taken);
      taken.add(id);
      entries.push(id === entry.id ? entry : { ...entry, id });
    }
    return entries;
  }

  /**
   * Push an entry or a message (after a STOPPED note when the user stopped the last request);
   * the halt is cleared. Returns the entry's id.
   */
  push(item) {
    const entries = this.#pushed([item]);
    this.#record({ type: 'push', entries }, entries[entries.length - 1].author);
    return /** @type {string} */ (entries[entries.length - 1].id);
  }

  /** Push each item as its own entry, in one record; returns their ids. */
  extend(items) {
    const list = Array.from(items);
    if (list.length === 0) return [];
    const entries = this.#pushed(list);
    this.#record({ type: 'push', entries }, entries[entries.length - 1].author);
    return entries.slice(entries.length - list.length).map((entry) => entry.id);
  }

  /**
   * Replace entries `start..stop` (clamped) with `items`, as made by `by` (Python's `splice`;
   * `restore: true` also takes back retired ids). Returns `{removed, kept, restored, added}`.
   */
  splice(start, stop, items, by = null, { restore = false } = {}) {
    const length = this.#entries.length;
    const clamp = (at) => Math.min(Math.max(at < 0 ? at + length : at, 0), length);
    start = clamp(start);
    stop = Math.max(start, clamp(stop));
    const old = this.#entries.slice(start, stop);
    const inRange = new Map(old.map((entry) => [entry.id, entry]));
    const taken = new Set();
    const done = { removed: [], kept: [], restored: [], added: [] };
    const fresh = [];
    for (const item of items) {
      let entry = asEntry(item);
      let id = entry.id;
      let author = entry.author;
      if (id != null && !taken.has(id) && inRange.has(id)) {
        if (!jsonEqual(entry.message, inRange.get(id).message)) author = by;
        done.kept.push(id);
      } else if (restore && id != null && !taken.has(id) && this.#retired.has(id)) {
        done.restored.push(id);
      } else {
        id = this.ids.messageId();
        author = entry.author ?? by;
        done.added.push(id);
      }
      taken.add(id);
      if (id !== entry.id || author !== entry.author) entry = { ...entry, id, author };
      fresh.push(entry);
    }
    if (start === stop && fresh.length === 0) return done;
    const removed = old.map((entry) => entry.id);
    done.removed.push(...removed.filter((id) => !taken.has(id)));
    this.#record({ type: 'splice', start, stop, removed, entries: fresh }, by);
    return done;
  }

  /** Leave the user's last message unanswered; whether it was halted now. @param {'stopped' | 'kept'} halt */
  halt(halt) {
    if (!HALTS.has(halt)) throw new UsageError('bad_halt', `unknown halt ${halt}`);
    if (!this.awaitsModel()) return false;
    this.#record({ type: 'halt', halt }, null);
    return true;
  }

  /** Clear the halt; whether the last message a model reads is the user's. */
  resume() {
    if (this.#halt !== null) this.#record({ type: 'halt', halt: null }, null);
    const end = this.#readEnd();
    return end > 0 && this.#entries[end - 1].message.role === 'user';
  }

  /** Replace the whole value with `state` (or another conversation's), in one record. */
  reset(to, by = null) {
    const state = to instanceof Conversation ? to.state() : to;
    this.#record({ type: 'reset', state }, by);
  }

  /** Put `aside` after the asides already put; returns its new id (unsaved: not recorded). */
  addAside(aside) {
    const id = this.ids.asideId();
    this.#putAside(id, aside);
    return id;
  }

  /** Replace aside `id` in its place; whether there was one. */
  replaceAside(id, aside) {
    if (!this.#asides.has(id)) return false;
    this.#putAside(id, aside);
    return true;
  }

  /** Remove aside `id` and return it, or `null`. */
  removeAside(id) {
    const aside = this.#asides.get(id);
    if (aside === undefined) return null;
    if (aside.saved) this.#record({ type: 'aside', id, aside: null }, aside.author);
    else this.#asides.delete(id);
    return aside;
  }

  /**
   * Put back unsaved aside `id`, taken out with `removeAside` (no record: the log never had
   * it). For `rebase`, which sets such an aside apart over a reread.
   */
  restoreUnsavedAside(id, aside) {
    if (aside.saved || this.#asides.has(id)) {
      throw new UsageError('bad_aside', 'restoreUnsavedAside takes an unsaved aside not held');
    }
    this.#asides.set(id, aside);
  }

  #putAside(id, given) {
    const aside = readAside({ saved: true, ...given }, 'aside');
    const old = this.#asides.get(id);
    if (aside.saved) {
      const record = this.#made({ type: 'aside', id, aside }, aside.author); // before any move
      if (old !== undefined && !old.saved) this.#asides.delete(id); // the log puts it at the end
      this.#replayRead(record);
      return;
    }
    if (old !== undefined && old.saved) {
      const order = Array.from(this.#asides.keys());
      this.#record({ type: 'aside', id, aside: null }, aside.author);
      this.#asides.set(id, aside);
      this.#asides = new Map(order.map((key) => [key, this.#asides.get(key)]));
    } else {
      this.#asides.set(id, aside);
    }
  }

  // ---------------------------------------------------------------- the fold

  /** Check `change` completely, then apply it; throws `ApplyError` changing nothing. */
  #fold(change, type) {
    switch (type) {
      case 'push':
        return this.#foldPush(change.entries);
      case 'splice':
        return this.#foldSplice(change.start, change.stop, change.removed, change.entries);
      case 'halt':
        this.#halt = change.halt;
        return undefined;
      case 'aside':
        return this.#foldAside(change.id, change.aside);
      case 'reset':
        return this.#foldReset(change.state);
      default:
        throw new ApplyError('unknown_change', `unknown change ${type}`);
    }
  }

  /** @param {Entry[]} entries @param {Set<string> | null} removed @param {boolean} allowRetired */
  #checkNew(entries, removed, allowRetired) {
    for (const entry of entries) {
      if (!isMessageId(entry.id)) {
        throw new ApplyError('bad_id', `entry id ${JSON.stringify(entry.id)} is not a message id`);
      }
    }
    if (entries.length > 1) {
      const ids = entries.map((entry) => /** @type {string} */ (entry.id));
      const again = repeatedId(ids);
      if (again !== null) throw new ApplyError('repeated', `entry id ${again} appears twice`);
    }
    for (const entry of entries) {
      const id = /** @type {string} */ (entry.id);
      if (this.#index.has(id) && (removed === null || !removed.has(id))) {
        throw new ApplyError('held', `entry id ${id} is already held`);
      }
      if (!allowRetired && this.#retired.has(id)) {
        throw new ApplyError('retired', `entry id ${id} was taken out and cannot be pushed`);
      }
    }
  }

  /** @param {Entry[]} entries */
  #foldPush(entries) {
    this.#checkNew(entries, null, false);
    const held = this.#entries;
    const length = held.length;
    for (let k = 0; k < entries.length; k += 1) {
      this.#index.set(/** @type {string} */ (entries[k].id), length + k);
      held.push(entries[k]);
    }
    if (this.#freshUpto === length) this.#freshUpto = held.length;
    this.#halt = null;
  }

  #foldSplice(start, stop, removed, entries) {
    const held = this.#entries;
    if (!(start >= 0 && start <= stop && stop <= held.length)) {
      throw new ApplyError(
        'range',
        `range ${start}:${stop} is outside a conversation of ${held.length}`,
      );
    }
    let same = removed.length === stop - start;
    for (let k = 0; same && k < removed.length; k += 1) same = held[start + k].id === removed[k];
    if (!same)
      throw new ApplyError('removed', `the ids at ${start}:${stop} are not the ones removed`);
    const removedSet = new Set(removed);
    this.#checkNew(entries, removedSet, true);
    const put = new Set(entries.map((entry) => entry.id));
    const reachesEnd = stop === held.length;
    const index = this.#index;
    for (const id of removed) index.delete(id);
    for (let k = 0; k < entries.length; k += 1)
      index.set(/** @type {string} */ (entries[k].id), start + k);
    // Not `splice(start, n, ...entries)`: a spread of some 120,000 arguments throws
    // RangeError (a splice of that many entries fits a frame), halfway through this fold.
    this.#entries = held.slice(0, start).concat(entries, held.slice(stop));
    if (entries.length !== stop - start)
      this.#freshUpto = Math.min(this.#freshUpto, start + entries.length);
    for (const id of removed) if (!put.has(id)) this.#retired.add(id);
    for (const id of put) this.#retired.delete(/** @type {string} */ (id));
    if (reachesEnd) this.#halt = null;
  }

  /** Where entry `id` is, refreshing positions a splice left stale (O(1) amortised). */
  #position(id) {
    const at = this.#index.get(id);
    if (at === undefined) return null;
    const held = this.#entries;
    if (at < held.length && held[at].id === id) return at;
    for (let k = this.#freshUpto; k < held.length; k += 1)
      this.#index.set(/** @type {string} */ (held[k].id), k);
    this.#freshUpto = held.length;
    return /** @type {number} */ (this.#index.get(id));
  }

  #foldAside(id, aside) {
    if (!isAsideId(id))
      throw new ApplyError('bad_id', `aside id ${JSON.stringify(id)} is not an aside id`);
    const old = this.#asides.get(id);
    if (aside === null) {
      if (old === undefined || !old.saved)
        throw new ApplyError('no_aside', `aside ${id} is not here to remove`);
      this.#asides.delete(id);
      return;
    }
    if (!aside.saved)
      throw new ApplyError('unsaved', `aside ${id} is unsaved and cannot be recorded`);
    this.#asides.set(id, aside);
  }

  /** @param {ConversationState} state (read: defaults filled) */
  #foldReset(state) {
    const entries = state.entries;
    for (const entry of entries) {
      if (!isMessageId(entry.id)) {
        throw new ApplyError('bad_id', `entry id ${JSON.stringify(entry.id)} is not a message id`);
      }
    }
    const index = new Map();
    for (let k = 0; k < entries.length; k += 1) index.set(/** @type {string} */ (entries[k].id), k);
    if (index.size !== entries.length) {
      const again = repeatedId(entries.map((entry) => /** @type {string} */ (entry.id)));
      throw new ApplyError('repeated', `entry id ${again} appears twice`);
    }
    const retired = new Set(state.retired);
    for (const id of retired) {
      if (index.has(id))
        throw new ApplyError('retired', 'a held entry id is also listed as retired');
    }
    const asides = new Map();
    for (const { id, ...aside } of state.asides) {
      if (!isAsideId(id) || asides.has(id) || !aside.saved) {
        throw new ApplyError(
          'bad_id',
          `aside ${JSON.stringify(id)} is malformed, repeated or unsaved`,
        );
      }
      asides.set(id, aside);
    }
    for (const [id, aside] of this.#asides)
      if (!aside.saved && !asides.has(id)) asides.set(id, aside);
    this.#entries = entries.slice();
    this.#index = index;
    this.#freshUpto = entries.length;
    this.#retired = retired;
    this.#asides = asides;
    this.#halt = state.halt;
  }
}

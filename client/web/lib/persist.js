// @ts-check
// The browser outbox: a replica's confirmed value, pending records and seq in IndexedDB.
import { Conversation } from './conversation.js';
import { ConvsyncError, Refused, UsageError } from './errors.js';
import { conflict } from './rebase.js';

/**
 * How this works (SPEC §14, `{persist: 'indexeddb'}`). One IndexedDB database per outbox
 * (by default named after the replica's url: hub and conversation), held by one replica at a
 * time through a Web Lock of the same name. It keeps what a tab needs to resume after a
 * reload or a crash, the same parts as the Python outbox:
 *
 *   meta      'outbox'   {layout, client, url, seq, lineage, revision, inflight}: `revision`
 *                        is the confirmed value's, `inflight` {seq, count} or null
 *             'snapshot' {revision, state}   the confirmed value at `snapshot.revision` (JSON)
 *   confirmed key n      a record of the log, n = 1, 2, ...: the confirmed value is the
 *                        snapshot with these folded (rewritten into the snapshot every
 *                        COMPACT_AT records, or at once when a `state` replaced the value)
 *   pending   key k      a record made here and not acknowledged, in the order made; the first
 *                        `meta.inflight.count` are the batch in flight, sent as `meta.inflight.seq`
 *
 * Records are kept as their JSON text (what goes on the wire). `meta.layout` is LAYOUT: an
 * outbox of another layout is refused (`outbox_layout`) and left as it is.
 *
 * When: every change of the session is noted (`changed()`) and written in one transaction
 * from a microtask, so an edit's record is handed to IndexedDB before anything else runs in
 * the tab (no event, no socket frame, no unload comes between). A batch is sent only once the
 * transaction holding it with its seq has committed (`strict` durability): a batch the hub
 * may hold is never sent again under another seq, and the hub's client mark makes its resend
 * idempotent. Each write holds a consistent pair (the confirmed value and the pending records
 * made on it), so a resume is a replay, and the catch-up then rebases it as usual.
 */

/** The layout of what is kept; bumped when it changes. */
export const LAYOUT = 1;
/** Outboxes of one name a `shared: true` origin's tabs take, one each (`Outbox.openAny`). */
export const SHARED_OUTBOXES = 16;
/** Records folded after the snapshot before it is rewritten. */
export const COMPACT_AT = 256;
const STORES = ['meta', 'confirmed', 'pending'];

/** @typedef {import('./conversation.js').ChangeRecord} ChangeRecord */
/** @typedef {import('./session.js').ReplicaSession} ReplicaSession */
/**
 * @typedef {{client: string, seq: number, lineage: number, revision: number, state: any,
 *   confirmed: ChangeRecord[], inflight: {seq: number, records: ChangeRecord[]} | null,
 *   pending: ChangeRecord[], keys: number[]}} Kept what an outbox holds, read back
 * (`keys`: the pending store's keys, the batch's first)
 */

/** @param {IDBRequest} request @returns {Promise<any>} */
function requested(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/** @param {IDBTransaction} tx @returns {Promise<void>} */
function committed(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject(tx.error ?? new Error('transaction aborted'));
  });
}

/**
 * Web Locks for a realm without them (Node): exclusive within this realm only, which is all a
 * single process has. Takes `ifAvailable` and `signal` as `navigator.locks` does.
 */
export class RealmLocks {
  /** @type {Map<string, Array<() => void>>} name → the waiters; the first holds it */
  #queues = new Map();

  /**
   * @param {string} name @param {{ifAvailable?: boolean, signal?: AbortSignal}} options
   * @param {(lock: {name: string} | null) => any} callback
   */
  request(name, options, callback) {
    const queue = this.#queues.get(name) ?? [];
    this.#queues.set(name, queue);
    if (options.ifAvailable && queue.length > 0) return Promise.resolve(callback(null));
    return new Promise((resolve, reject) => {
      const grant = () => {
        options.signal?.removeEventListener('abort', abort);
        Promise.resolve()
          .then(() => callback({ name }))
          .then(resolve, reject)
          .finally(() => {
            queue.shift();
            if (queue.length > 0) queue[0]();
            else this.#queues.delete(name);
          });
      };
      const abort = () => {
        const at = queue.indexOf(grant);
        if (at > 0) queue.splice(at, 1);
        reject(options.signal?.reason ?? new Error('aborted'));
      };
      options.signal?.addEventListener('abort', abort, { once: true });
      queue.push(grant);
      if (queue.length === 1) grant();
    });
  }
}

const realmLocks = new RealmLocks();

/**
 * The Web Locks to use: `locks` if given, else the browser's, else one table for this realm
 * (the outboxes' and the shared tabs' locks alike).
 * @param {any} [locks]
 */
export function locksOf(locks) {
  return locks ?? globalThis.navigator?.locks ?? realmLocks;
}

/**
 * Hold lock `name` (Web Locks) until the returned `release` is called; waits up to `wait` ms
 * for it, then resolves null (another holds it).
 * @param {any} locks @param {string} name @param {number} wait
 * @returns {Promise<(() => void) | null>}
 */
export function holdLock(locks, name, wait) {
  /** @type {() => void} */
  let release = () => {};
  const held = new Promise((resolve) => {
    release = () => resolve(undefined);
  });
  return new Promise((resolve) => {
    // A timer of our own, not `AbortSignal.timeout`: Node does not wait for that one.
    const abort = new AbortController();
    const timer = wait > 0 ? setTimeout(() => abort.abort(), wait) : null;
    const options =
      wait > 0 ? { mode: 'exclusive', signal: abort.signal } : { ifAvailable: true };
    locks
      .request(name, options, (/** @type {any} */ lock) => {
        if (timer !== null) clearTimeout(timer);
        if (lock === null) {
          resolve(null);
          return undefined;
        }
        resolve(release);
        return held;
      })
      .catch(() => resolve(null)); // the wait ran out
  });
}

/**
 * One IndexedDB outbox, held (by its Web Lock) until `close()`.
 */
export class Outbox {
  /**
   * @param {string} name @param {IDBDatabase} db @param {() => void} release
   * @param {IDBFactory} indexedDB
   */
  constructor(name, db, release, indexedDB) {
    this.name = name;
    this.db = db;
    this.release = release;
    this.indexedDB = indexedDB;
    this.closed = false;
  }

  /**
   * Take the outbox `name`: its lock (waiting up to `lockWait` ms), then its database.
   * @param {string} name
   * @param {{indexedDB?: IDBFactory, locks?: any, lockWait?: number}} [options]
   * @throws {Refused} `outbox_in_use`: another tab or replica holds it.
   * @throws {UsageError} `no_indexeddb`.
   */
  static async open(name, options = {}) {
    const indexedDB = options.indexedDB ?? globalThis.indexedDB;
    if (indexedDB == null) {
      throw new UsageError('no_indexeddb', 'no IndexedDB here: pass options.indexedDB');
    }
    const locks = locksOf(options.locks);
    const release = await holdLock(locks, `convsync-outbox:${name}`, options.lockWait ?? 3000);
    if (release === null) {
      throw new Refused('outbox_in_use', `the outbox "${name}" is held by another tab or replica`);
    }
    try {
      const request = indexedDB.open(name, 1);
      request.onupgradeneeded = () => {
        for (const store of STORES) request.result.createObjectStore(store);
      };
      const db = await requested(request);
      return new Outbox(name, db, release, indexedDB);
    } catch (error) {
      release();
      throw new UsageError('outbox_unreadable', `the outbox "${name}" cannot be opened: ${error}`);
    }
  }

  /**
   * Take one of the outboxes `name`, `name#2`, ... `name#SHARED_OUTBOXES` (`shared: true`,
   * where each tab is a replica of its own): the one this tab held before a reload first
   * (waiting up to `lockWait` ms for its old document to let go; the tab's sessionStorage
   * remembers which), else the first free one. After every tab closed, the tabs opened next
   * take them in order and resume their pending edits.
   * @param {string} name
   * @param {{indexedDB?: IDBFactory, locks?: any, lockWait?: number, sessionStorage?: any}} [options]
   * @throws {Refused} `outbox_in_use`: every one is held.
   */
  static async openAny(name, options = {}) {
    const storage = options.sessionStorage ?? globalThis.sessionStorage ?? null;
    const key = `convsync-outbox-slot:${name}`;
    const named = (/** @type {number} */ k) => (k === 1 ? name : `${name}#${k}`);
    const mine = Number(storage?.getItem(key) ?? NaN);
    const slots = Array.from({ length: SHARED_OUTBOXES }, (_, at) => at + 1);
    const order = Number.isInteger(mine) && slots.includes(mine) ? [mine] : [];
    for (const slot of [...order, ...slots.filter((k) => k !== mine)]) {
      try {
        const wait = slot === mine ? options.lockWait : 0;
        const outbox = await Outbox.open(named(slot), { ...options, lockWait: wait });
        storage?.setItem(key, String(slot));
        return outbox;
      } catch (error) {
        if (!(error instanceof Refused)) throw error;
      }
    }
    throw new Refused(
      'outbox_in_use',
      `all ${SHARED_OUTBOXES} outboxes "${name}" (#2, #3, ...) are held by other tabs`,
    );
  }

  /**
   * What the outbox holds, or null when it is new.
   * @returns {Promise<Kept | null>}
   * @throws {UsageError} `outbox_layout` (another layout), `outbox_corrupt`.
   */
  async load() {
    const tx = this.db.transaction(STORES, 'readonly');
    const meta = tx.objectStore('meta');
    const [outbox, snapshot, confirmed, pending, keys] = await Promise.all([
      requested(meta.get('outbox')),
      requested(meta.get('snapshot')),
      requested(tx.objectStore('confirmed').getAll()),
      requested(tx.objectStore('pending').getAll()),
      requested(tx.objectStore('pending').getAllKeys()),
    ]);
    if (outbox === undefined) return null;
    if (outbox === null || typeof outbox !== 'object' || outbox.layout !== LAYOUT) {
      throw new UsageError(
        'outbox_layout',
        `the outbox "${this.name}" has layout ${JSON.stringify(outbox?.layout)}, this replica reads ${LAYOUT}`,
      );
    }
    try {
      const records = pending.map((/** @type {string} */ text) => JSON.parse(text));
      const count = outbox.inflight === null ? 0 : outbox.inflight.count;
      const fits =
        typeof outbox.client === 'string' &&
        Number.isInteger(outbox.seq) &&
        Number.isInteger(outbox.revision) &&
        count <= records.length &&
        snapshot !== undefined;
      if (!fits) throw new Error('its meta or snapshot is missing or malformed');
      return {
        client: outbox.client,
        seq: outbox.seq,
        lineage: outbox.lineage,
        revision: outbox.revision,
        state: JSON.parse(snapshot.state),
        confirmed: confirmed.map((/** @type {string} */ text) => JSON.parse(text)),
        inflight:
          outbox.inflight === null
            ? null
            : { seq: outbox.inflight.seq, records: records.slice(0, count) },
        pending: records.slice(count),
        keys,
      };
    } catch (error) {
      throw new UsageError('outbox_corrupt', `the outbox "${this.name}" is not readable: ${error}`);
    }
  }

  /**
   * Start one transaction that makes these changes; resolves once it committed.
   * @param {{meta: any, snapshot?: any, confirmed?: {clear: boolean, from: number, texts: string[]},
   *   pending: {drop: number[], from: number, texts: string[], clear: boolean}}} change
   * @param {boolean} strict wait for the disk (a batch about to be sent)
   */
  write(change, strict) {
    const tx = this.db.transaction(
      STORES,
      'readwrite',
      /** @type {any} */ ({ durability: strict ? 'strict' : 'default' }),
    );
    const done = committed(tx);
    const meta = tx.objectStore('meta');
    meta.put(change.meta, 'outbox');
    if (change.snapshot !== undefined) meta.put(change.snapshot, 'snapshot');
    if (change.confirmed !== undefined) {
      const store = tx.objectStore('confirmed');
      if (change.confirmed.clear) store.clear();
      change.confirmed.texts.forEach((text, at) => store.put(text, change.confirmed?.from + at));
    }
    const pending = tx.objectStore('pending');
    if (change.pending.clear) pending.clear();
    else if (change.pending.drop.length > 0) {
      const [low, high] = [change.pending.drop[0], change.pending.drop.at(-1)];
      pending.delete(IDBKeyRange.bound(low, high));
    }
    change.pending.texts.forEach((text, at) => pending.put(text, change.pending.from + at));
    /** @type {any} */ (tx).commit?.();
    return done;
  }

  /** Empty it (the conversation was deleted): nothing is kept, nothing goes. */
  clear() {
    const tx = this.db.transaction(STORES, 'readwrite');
    for (const store of STORES) tx.objectStore(store).clear();
    return committed(tx);
  }

  /** Let it go: the database closes and another tab may take the lock. */
  close() {
    if (this.closed) return;
    this.closed = true;
    this.db.close();
    this.release();
  }
}

/**
 * Keeps a replica session in an `Outbox`: `resume` puts what was kept back into the session,
 * `changed()` notes that the session moved (written from a microtask), `sending()` writes the
 * batch in flight and calls back once it is on disk.
 */
export class Keeper {
  /** @param {Outbox} outbox @param {ReplicaSession} session @param {string} url */
  constructor(outbox, session, url) {
    this.outbox = outbox;
    this.session = session;
    this.url = url;
    /** The pending records as written, oldest first, and their keys. */
    /** @type {ChangeRecord[]} */ this.keptPending = [];
    /** @type {number[]} */ this.keys = [];
    this.nextKey = 1;
    /** How many records the confirmed store holds past the snapshot. */
    this.tail = 0;
    /** @type {any} */ this.keptMeta = null;
    /** Records folded into `confirmed` since the last write; null: a state replaced it. */
    /** @type {ChangeRecord[] | null} */ this.folded = [];
    this.due = false;
    this.stopped = false; // cleared: nothing more is written
    /** @type {Promise<void>} */ this.written = Promise.resolve();
    /** @type {((error: unknown) => void) | null} */ this.onError = null;
  }

  /** Fold hooks on the session's log: what goes into `confirmed` is written as it goes. */
  #watchLog() {
    const log = this.session.log;
    const fold = log.fold.bind(log);
    const foldHeld = log.foldHeld.bind(log);
    const replace = log.replace.bind(log);
    log.fold = (records) => {
      fold(records);
      this.#folded(records);
    };
    log.foldHeld = () => {
      const held = log.held;
      const count = foldHeld();
      this.#folded(held.slice(0, count));
      return count;
    };
    log.replace = (value) => {
      replace(value);
      this.folded = null;
      this.changed();
    };
  }

  /** @param {ChangeRecord[]} records */
  #folded(records) {
    if (this.folded !== null) this.folded.push(...records);
    this.changed();
  }

  /**
   * Put what `kept` holds into the session (before its first hello): the confirmed value,
   * the seq, the batch in flight and the pending records. Edits made on the empty value
   * before the outbox was read are replayed after them; any that no longer fit are conflicts.
   * @param {Kept | null} kept @returns {any[]} conflict events
   */
  resume(kept) {
    const session = this.session;
    if (kept === null) {
      this.keptMeta = null;
      this.folded = null; // write the whole value, once
      this.#watchLog();
      this.changed();
      return [];
    }
    const confirmed = Conversation.fromState(kept.state);
    for (const record of kept.confirmed) confirmed.apply(record);
    confirmed.continueLog(kept.lineage, kept.revision);
    const local = confirmed.copy();
    const inflight = kept.inflight;
    if (inflight !== null) {
      for (const record of inflight.records) local.replay(record);
      local.takeUnsaved();
    }
    for (const record of kept.pending) local.replay(record);
    const resumed = local.unsaved();
    const early = session.local.takeUnsaved(); // the first change to the session
    const conflicts = [];
    for (const record of early) {
      try {
        local.replay(record);
      } catch (error) {
        if (!(error instanceof ConvsyncError)) throw error;
        conflicts.push(conflict(record, 'not_resumed', error.message));
      }
    }
    session.client = kept.client;
    session.log.replace(confirmed);
    session.local = local;
    session.maxFrame = session.maxFrame; // the record limit, on the new value
    session.seq = kept.seq;
    session.inflight =
      inflight === null
        ? null
        : { seq: inflight.seq, records: inflight.records, doomed: false, landed: null, base: null };
    // What the outbox holds now, as the session's records (the early edits are not in it).
    this.keptPending = [...(inflight?.records ?? []), ...resumed];
    this.keys = kept.keys.slice();
    this.nextKey = (kept.keys.at(-1) ?? 0) + 1;
    this.tail = kept.confirmed.length;
    this.folded = [];
    this.keptMeta = this.#meta();
    this.#watchLog();
    if (early.length > 0) this.changed();
    return conflicts;
  }

  /** The batch the hub may hold: sent as `seq`, not yet acknowledged (null: none). */
  #inflight() {
    const batch = this.session.inflight;
    return batch !== null && !batch.doomed && batch.landed === null ? batch : null;
  }

  #meta() {
    const session = this.session;
    const batch = this.#inflight();
    return {
      layout: LAYOUT,
      client: session.client,
      url: this.url,
      seq: session.seq,
      lineage: session.confirmed.lineage,
      revision: session.confirmed.revision,
      inflight: batch === null ? null : { seq: batch.seq, count: batch.records.length },
    };
  }

  /** The session moved: write what changed, from a microtask (once for a run of changes). */
  changed() {
    if (this.due || this.stopped || this.outbox.closed) return;
    this.due = true;
    queueMicrotask(() => {
      if (this.due) this.#write(false);
    });
  }

  /**
   * Write the batch now in flight with its seq; `send` is called once it is on disk (or at
   * once if the write failed: the batch goes as it would without an outbox).
   * @param {() => void} send
   */
  sending(send) {
    this.#write(true).then(send, (error) => {
      this.onError?.(error);
      send();
    });
  }

  /** @param {boolean} strict @returns {Promise<void>} */
  #write(strict) {
    this.due = false;
    if (this.stopped || this.outbox.closed) return Promise.resolve();
    const session = this.session;
    const batch = this.#inflight();
    const pending = [...(batch?.records ?? []), ...session.local.unsaved()];
    /** @type {any} */
    const change = { meta: this.#meta(), pending: this.#pendingChange(pending) };
    const deferred = session.phase === 'catching_up' && this.keptMeta !== null;
    if (deferred) {
      // The pending records are rebased on what arrives only once caught up: until then the
      // confirmed value stays as written (what they apply to), and what folded waits.
      change.meta = { ...change.meta, lineage: this.keptMeta.lineage, revision: this.keptMeta.revision };
    } else if (this.folded === null || this.tail + this.folded.length > COMPACT_AT) {
      const state = JSON.stringify(session.confirmed.state());
      change.snapshot = { revision: session.confirmed.revision, state };
      change.confirmed = { clear: true, from: 1, texts: [] };
      this.tail = 0;
    } else if (this.folded.length > 0) {
      const texts = this.folded.map((record) => JSON.stringify(record));
      change.confirmed = { clear: false, from: this.tail + 1, texts };
      this.tail += texts.length;
    }
    if (!deferred) this.folded = [];
    if (
      !strict &&
      change.snapshot === undefined &&
      change.confirmed === undefined &&
      change.pending.texts.length === 0 &&
      change.pending.drop.length === 0 &&
      !change.pending.clear &&
      JSON.stringify(change.meta) === JSON.stringify(this.keptMeta)
    ) {
      return this.written;
    }
    this.keptMeta = change.meta;
    const done = this.outbox.write(change, strict);
    done.catch((error) => this.onError?.(error));
    this.written = done.catch(() => {});
    return done;
  }

  /**
   * How the pending store goes from what it holds to `pending`: records acknowledged drop
   * off the front and new ones go on the end; anything else (a rebase made them anew)
   * rewrites it. @param {ChangeRecord[]} pending
   */
  #pendingChange(pending) {
    const kept = this.keptPending;
    let drop = 0;
    while (drop < kept.length && kept[drop] !== pending[0]) drop += 1;
    let same = 0;
    while (drop + same < kept.length && kept[drop + same] === pending[same]) same += 1;
    if (drop + same < kept.length || (drop > 0 && pending.length > 0 && same === 0)) {
      // not a suffix-and-append of what is kept: write it anew
      this.keptPending = pending;
      this.keys = pending.map((_, at) => this.nextKey + at);
      const from = this.nextKey;
      this.nextKey += pending.length;
      return { clear: true, drop: [], from, texts: pending.map((r) => JSON.stringify(r)) };
    }
    const dropped = this.keys.slice(0, drop);
    const fresh = pending.slice(same);
    const from = this.nextKey;
    this.nextKey += fresh.length;
    this.keptPending = pending;
    this.keys = this.keys.slice(drop).concat(fresh.map((_, at) => from + at));
    return { clear: false, drop: dropped, from, texts: fresh.map((r) => JSON.stringify(r)) };
  }

  /** Resolves once every change so far is written (an edit's record is on its way at once). */
  saved() {
    if (this.due) this.#write(false);
    return this.written;
  }

  /** Empty the outbox and let it go (the conversation was deleted); nothing more is kept. */
  async clear() {
    this.stopped = true;
    await this.written;
    if (this.outbox.closed) return;
    await this.outbox.clear();
    this.outbox.close();
  }

  /** Written, then let go (the replica closed). */
  async close() {
    if (this.due) this.#write(false);
    await this.written;
    this.outbox.close();
  }
}

/**
 * The `persist` option of `connect`, checked: null without one.
 * @param {any} options @returns {{name: string | null, indexedDB?: IDBFactory, locks?: any,
 *   lockWait?: number} | null}
 */
export function persistOption(options) {
  const persist = options.persist;
  if (persist === undefined || persist === null || persist === false) return null;
  if (persist !== 'indexeddb') {
    throw new UsageError('bad_option', `persist must be 'indexeddb' (got ${JSON.stringify(persist)})`);
  }
  if (options.outbox !== undefined && (typeof options.outbox !== 'string' || options.outbox === '')) {
    throw new UsageError('bad_option', 'outbox must be a non-empty name');
  }
  if (options.shared === true && options.client !== undefined) {
    // Each tab takes an outbox of its own, and with it the client id it keeps: one id given
    // to every tab would make them replace one another at the hub.
    throw new UsageError(
      'bad_option',
      'with shared and persist each tab keeps a client id of its own: do not pass client',
    );
  }
  return {
    name: options.outbox ?? null,
    indexedDB: options.indexedDB,
    locks: options.locks,
    lockWait: options.lockWait,
    shared: options.shared === true, // each tab a replica (and an outbox) of its own
  };
}

/**
 * Take the outbox for `session` (of the replica at `url`) and resume what it keeps.
 * @param {ReplicaSession} session @param {string} url
 * @param {NonNullable<ReturnType<typeof persistOption>>} options
 * @param {string | null} client the client id the caller asked for, if any
 * @returns {Promise<{keeper: Keeper, conflicts: any[]}>}
 * @throws {Refused} `outbox_in_use`. @throws {UsageError} `outbox_client`, `outbox_layout`,
 *   `outbox_corrupt`: nothing was changed.
 */
export async function openKeeper(session, url, options, client) {
  const wanted = options.name ?? `convsync:${url}`;
  const outbox = options.shared
    ? await Outbox.openAny(wanted, options)
    : await Outbox.open(wanted, options);
  const name = outbox.name;
  try {
    const kept = await outbox.load();
    if (kept !== null && client !== null && kept.client !== client) {
      throw new UsageError(
        'outbox_client',
        `the outbox "${name}" belongs to client ${JSON.stringify(kept.client)}, not ${JSON.stringify(client)}`,
      );
    }
    const keeper = new Keeper(outbox, session, url);
    let conflicts;
    try {
      conflicts = keeper.resume(kept);
    } catch (error) {
      if (!(error instanceof ConvsyncError)) throw error;
      throw new UsageError('outbox_corrupt', `the outbox "${name}" does not replay: ${error.message}`);
    }
    return { keeper, conflicts };
  } catch (error) {
    outbox.close();
    throw error;
  }
}

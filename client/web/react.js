// @ts-check
/**
 * React bindings for the JavaScript replica (SPEC §14): `useReplica`, `useConversation`,
 * `useDrafts`, `usePresence`, `useApprovals` and `useConnection`. React is a peer dependency
 * of this module alone (`convsync.js` never imports it); no build step: a page maps `react` with
 * an import map (docs/react.md).
 *
 * How this works.
 * - `useReplica(url, id, options)` keeps one `Replica` per `(url, id)` in a registry with a
 *   reference count. The replica is made during the render (no socket yet) and started by the
 *   first effect that holds it; the last effect to let go closes it after `grace` ms, so
 *   StrictMode's mount, unmount and mount again (or a quick remount) keep the one connection.
 * - Each replica gets one `View` (a WeakMap), subscribed to the replica's events while some
 *   component listens. An event marks the part it touches stale (the conversation, one draft,
 *   the presence, the connection) and tells only that part's listeners, once per microtask: a
 *   rebase that replays many records, or a burst of tokens, is one notification.
 * - A snapshot is rebuilt lazily, in `getSnapshot`, and shares structure with the one before:
 *   an entry, draft, presence item or approval equal to its previous value is the previous
 *   object, and a list in which nothing changed is the previous list. So `useSyncExternalStore`
 *   sees a new value only when something changed, and a `memo` component given an entry
 *   renders only when that entry did. Tokens streaming into a draft rebuild only that draft.
 * Snapshots and the lists in them are frozen. Entries are the conversation's own values (the
 * fold never changes an entry in place; an edit replaces it), shared, not copied: read-only.
 */
import * as React from 'react';

import { Replica, UsageError, approvals as approvalsOf, jsonEqual, people } from './convsync.js';

/**
 * @typedef {import('./lib/replica.js').ConnectOptions & {grace?: number}} ReplicaOptions
 */

/** How long a replica nobody holds stays open, in case it is mounted again (ms). */
export const GRACE_MS = 1000;

const EMPTY = Object.freeze([]);

// ------------------------------------------------------------------ the registry

/**
 * @typedef {{replica: Replica, refs: number, started: boolean, timer: any, grace: number,
 *   setTimer: (fn: () => void, ms: number) => any, clearTimer: (handle: any) => void}} Held
 */

/** @type {Map<string, Held>} the replicas `useReplica` holds, by `(url, id)` */
const registry = new Map();

/** @param {string} url @param {string} id */
function keyOf(url, id) {
  return JSON.stringify([url.replace(/\/+$/, ''), id]);
}

/** The held replica of `key`, made (not started) if there is none or it was closed. */
function heldFor(key, url, id, options) {
  const held = registry.get(key);
  if (held !== undefined && !held.replica.closing) return held;
  const { grace = GRACE_MS, ...rest } = options;
  if (!(typeof grace === 'number' && grace >= 0 && grace < Infinity)) {
    throw new UsageError(
      'bad_option',
      `grace must be a number of milliseconds, at least 0 (got ${grace})`,
    );
  }
  // Not `connect`, which starts at once: an effect starts it (a render may be dropped).
  const replica = new Replica(url, id, { live: true, ...rest });
  /** @type {Held} */
  const made = {
    replica,
    refs: 0,
    started: false,
    timer: null,
    grace,
    setTimer: rest.setTimeout ?? ((fn, ms) => setTimeout(fn, ms)),
    clearTimer: rest.clearTimeout ?? ((handle) => clearTimeout(handle)),
  };
  registry.set(key, made);
  return made;
}

/** @param {Held} held */
function hold(held) {
  held.refs += 1;
  if (held.timer !== null) {
    held.clearTimer(held.timer);
    held.timer = null;
  }
  if (!held.started) {
    held.started = true;
    void held.replica.start();
  }
}

/** @param {string} key @param {Held} held */
function letGo(key, held) {
  held.refs -= 1;
  if (held.refs > 0 || held.timer !== null) return;
  held.timer = held.setTimer(() => {
    held.timer = null;
    if (held.refs > 0) return;
    if (registry.get(key) === held) registry.delete(key);
    held.replica.close();
  }, held.grace);
}

/**
 * The live replica of conversation `id` on the hub at `url`, shared by every component that
 * asks for the same `(url, id)`: the first to mount opens it, the last to unmount closes it
 * `options.grace` ms later (default 1000) unless one mounts again meanwhile. StrictMode's
 * double mount opens one replica. `options` are `connect`'s (`live` defaults to true here, for
 * drafts and presence), read when the replica is made: later renders' options are not used.
 * @param {string} url @param {string} id
 * @param {ReplicaOptions} [options]
 * @returns {Replica}
 */
export function useReplica(url, id, options = {}) {
  const key = keyOf(url, id);
  const held = heldFor(key, url, id, options);
  const [, rerender] = React.useReducer((n) => n + 1, 0);
  React.useEffect(() => {
    let mine = registry.get(key) === held ? held : null;
    if (mine === null) {
      // Closed between this render and its commit (a slow commit after the grace): render
      // again, which makes a fresh replica; hold this one meanwhile so it is never leaked.
      mine = heldFor(key, url, id, options);
      rerender();
    }
    hold(mine);
    const holding = mine;
    return () => letGo(key, holding);
    // `options` are read once, when the replica is made.
  }, [key, held]);
  return held.replica;
}

// ------------------------------------------------------------------ the view of one replica

/**
 * The parts of a view, each with its own listeners and its own snapshot (`approvals` is
 * stale whenever `conversation` is: both are read off the conversation).
 * @typedef {'conversation' | 'approvals' | 'drafts' | 'presence' | 'connection'} Part
 */

/** @param {any} value */
function frozenCopy(value) {
  return Object.freeze({ ...value });
}

/**
 * The snapshots of one replica and who listens to them (see "How this works").
 */
class View {
  /** @param {Replica} replica */
  constructor(replica) {
    this.replica = replica;
    /** @type {Record<Part, Set<() => void>>} */
    this.listeners = {
      conversation: new Set(),
      approvals: new Set(),
      drafts: new Set(),
      presence: new Set(),
      connection: new Set(),
    };
    /** @type {Set<Part>} parts whose snapshot must be rebuilt */
    this.stale = new Set(/** @type {Part[]} */ (Object.keys(this.listeners)));
    /** @type {Set<string> | null} drafts to rebuild (null: every one) */
    this.staleDrafts = null;
    /** @type {Set<Part>} parts whose listeners are owed a call */
    this.owed = new Set();
    this.scheduled = false;
    /** @type {(() => void)[]} */
    this.unsubscribe = [];
    this.conversation = Object.freeze({
      entries: EMPTY,
      halt: /** @type {string | null} */ (null),
      revision: 0,
      pending: 0,
    });
    /** @type {readonly any[]} */ this.approvals = EMPTY;
    /** @type {Map<string, any>} */ this.draftById = new Map();
    /** @type {readonly any[]} */ this.drafts = EMPTY;
    /** @type {readonly any[]} */ this.presence = EMPTY;
    this.connection = Object.freeze({ state: '', failure: /** @type {string | null} */ (null) });
  }

  /** @param {Part} part @param {() => void} listener */
  subscribe(part, listener) {
    if (this.unsubscribe.length === 0) this.#listen();
    this.listeners[part].add(listener);
    return () => {
      this.listeners[part].delete(listener);
      if (Object.values(this.listeners).every((set) => set.size === 0)) {
        for (const stop of this.unsubscribe.splice(0)) stop();
      }
    };
  }

  #listen() {
    // Nothing was heard while nobody listened: every part may have changed.
    for (const part of /** @type {Part[]} */ (Object.keys(this.listeners))) this.stale.add(part);
    this.staleDrafts = null;
    const replica = this.replica;
    // An ack may come with no event: `progress` (after every message) sees the count move.
    const acked = () => {
      const shown = this.conversation;
      if (replica.pending !== shown.pending || replica.revision !== shown.revision) {
        this.#touch('conversation');
      }
    };
    replica.progress.add(acked);
    this.unsubscribe.push(
      () => replica.progress.delete(acked),
      replica.on('*', (event) => this.#heard(event)),
      replica.on('edited', () => this.#touch('conversation')),
      replica.on('state', () => this.#touch('connection')),
      replica.on('refused', () => this.#touch('connection')),
    );
  }

  /** @param {any} event */
  #heard(event) {
    switch (event.type) {
      case 'draft':
      case 'draft_end':
        if (this.staleDrafts !== null) this.staleDrafts.add(event.id);
        this.#touch('drafts');
        return;
      case 'presence':
        this.#touch('presence');
        return;
      case 'disconnected':
        this.#touch('connection');
        return;
      case 'connected':
      case 'reset':
        this.staleDrafts = null;
        this.#touch('drafts');
        this.#touch('presence');
        this.#touch('connection');
        this.#touch('conversation');
        return;
      default:
        // applied, rebased, conflict, queued, approvals, and any event a newer replica adds
        this.#touch('conversation');
    }
  }

  /** @param {Part} part */
  #touch(part) {
    this.stale.add(part);
    this.owed.add(part);
    if (part === 'conversation') {
      this.stale.add('approvals');
      this.owed.add('approvals');
    }
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      const owed = Array.from(this.owed);
      this.owed.clear();
      for (const part of owed) for (const listener of Array.from(this.listeners[part])) listener();
    });
  }

  // ---------------------------------------------------------------- snapshots

  conversationSnapshot() {
    if (!this.stale.delete('conversation')) return this.conversation;
    const replica = this.replica;
    const before = this.conversation;
    const entries = shared(before.entries, replica.conversation.entries(), (e) => e.id);
    const halt = replica.conversation.halted();
    const revision = replica.revision;
    const pending = replica.pending;
    if (
      entries === before.entries &&
      halt === before.halt &&
      revision === before.revision &&
      pending === before.pending
    ) {
      return before;
    }
    this.conversation = Object.freeze({ entries, halt, revision, pending });
    return this.conversation;
  }

  approvalsSnapshot() {
    if (!this.stale.delete('approvals')) return this.approvals;
    const replica = this.replica;
    const items = approvalsOf(replica.conversation).map(([id, approval]) =>
      frozenCopy({ id, ...approval, mayDecide: replica.mayDecideOn(approval) }),
    );
    this.approvals = shared(this.approvals, items, (item) => item.id);
    return this.approvals;
  }

  draftsSnapshot() {
    if (!this.stale.delete('drafts')) return this.drafts;
    const only = this.staleDrafts;
    this.staleDrafts = new Set();
    const live = this.replica.drafts;
    /** @type {Map<string, any>} */
    const byId = new Map();
    const list = [];
    for (const [id, draft] of live) {
      let made = this.draftById.get(id);
      if (made === undefined || only === null || only.has(id)) {
        // A token changes a part's length: compare the text only when no length moved (a
        // snapshot of the drafts after a reconnect sends them all again).
        if (made === undefined || !jsonEqual(made.lengths, draft.lengths)) {
          made = freezeDraft(draft);
        } else {
          const fresh = freezeDraft(draft);
          if (!jsonEqual(made, fresh)) made = fresh;
        }
      }
      byId.set(id, made);
      list.push(made);
    }
    this.draftById = byId;
    this.drafts = sameList(this.drafts, list) ? this.drafts : Object.freeze(list);
    return this.drafts;
  }

  presenceSnapshot() {
    if (!this.stale.delete('presence')) return this.presence;
    const items = Array.from(this.replica.presence, ([connection, item]) =>
      frozenCopy({ ...item, connection }),
    );
    this.presence = shared(this.presence, items, (item) => item.connection);
    return this.presence;
  }

  connectionSnapshot() {
    if (!this.stale.delete('connection')) return this.connection;
    const state = this.replica.state;
    const failure = this.replica.failure;
    if (state !== this.connection.state || failure !== this.connection.failure) {
      this.connection = Object.freeze({ state, failure });
    }
    return this.connection;
  }
}

/** A draft's frozen copy (its parts, names and lengths frozen too). */
function freezeDraft(draft) {
  return Object.freeze({
    ...draft,
    parts: Object.freeze({ ...draft.parts }),
    names: Object.freeze({ ...draft.names }),
    lengths: Object.freeze({ ...draft.lengths }),
  });
}

/** @param {readonly any[]} a @param {readonly any[]} b */
function sameList(a, b) {
  if (a.length !== b.length) return false;
  for (let k = 0; k < a.length; k += 1) if (a[k] !== b[k]) return false;
  return true;
}

/**
 * `next` with each item equal to an item of `before` (same key, equal JSON) replaced by that
 * item, frozen; `before` itself when every item is the one it had in the same place.
 * @param {readonly any[]} before @param {any[]} next @param {(item: any) => any} keyOf
 */
function shared(before, next, keyOf) {
  let same = before.length === next.length;
  /** @type {Map<any, any> | null} */
  let byKey = null;
  for (let k = 0; k < next.length; k += 1) {
    const item = next[k];
    if (k < before.length && before[k] === item) continue;
    if (byKey === null) byKey = new Map(before.map((old) => [keyOf(old), old]));
    const old = byKey.get(keyOf(item));
    if (old !== undefined && (old === item || jsonEqual(old, item))) next[k] = old;
    if (same && next[k] !== before[k]) same = false;
  }
  return same ? before : Object.freeze(next);
}

/** @type {WeakMap<Replica, View>} */
const views = new WeakMap();

/** @param {Replica} replica */
function viewOf(replica) {
  let view = views.get(replica);
  if (view === undefined) views.set(replica, (view = new View(replica)));
  return view;
}

/**
 * One part of a replica's view over `useSyncExternalStore`; `empty` without a replica.
 * @param {Replica | null | undefined} replica @param {Part} part
 * @param {(view: View) => any} read @param {any} empty
 */
function usePart(replica, part, read, empty) {
  const view = replica == null ? null : viewOf(replica);
  const subscribe = React.useCallback(
    (/** @type {() => void} */ listener) => (view === null ? () => {} : view.subscribe(part, listener)),
    [view, part],
  );
  const snapshot = () => (view === null ? empty : read(view));
  return React.useSyncExternalStore(subscribe, snapshot, snapshot);
}

const NO_CONVERSATION = Object.freeze({
  entries: EMPTY,
  halt: null,
  revision: 0,
  pending: 0,
});
const NO_CONNECTION = Object.freeze({ state: 'closed', failure: null });

/**
 * The conversation as it is here (pending edits included): `{entries, halt, revision,
 * pending}` (`pending`: edits not acknowledged yet), frozen; a new value only when one of them changed, and an unchanged
 * entry is the same object as before (give it to a `memo` component).
 * @param {Replica | null | undefined} replica
 */
export function useConversation(replica) {
  return usePart(replica, 'conversation', (view) => view.conversationSnapshot(), NO_CONVERSATION);
}

/**
 * The open drafts (messages streaming, with `live`), in the order they opened: frozen copies;
 * a token appended to one draft makes a new object of that draft only.
 * @param {Replica | null | undefined} replica
 */
export function useDrafts(replica) {
  return usePart(replica, 'drafts', (view) => view.draftsSnapshot(), EMPTY);
}

/**
 * The live connections (with `live`), each the hub's presence item with its `connection`
 * key; an unchanged item keeps its identity.
 * @param {Replica | null | undefined} replica
 */
export function usePresence(replica) {
  return usePart(replica, 'presence', (view) => view.presenceSnapshot(), EMPTY);
}

/**
 * The people connected (with `live`): one item per shared socket (`shared: true`, the tabs of
 * one browser) and per session on a socket of its own, each with `connections`, the sessions
 * it stands for (`people` of `convsync.js`). A new list when presence changes.
 * @param {Replica | null | undefined} replica
 */
export function usePeople(replica) {
  const presence = usePresence(replica);
  return React.useMemo(
    () =>
      Object.freeze(
        people(presence).map((person) =>
          Object.freeze({ ...person, connections: Object.freeze(person.connections) }),
        ),
      ),
    [presence],
  );
}

/**
 * Every approval and question, in the order asked: `{id, ...approval, mayDecide}` (`id` the
 * aside's, for `replica.decide(id, ...)`); an unchanged approval keeps its identity.
 * @param {Replica | null | undefined} replica
 */
export function useApprovals(replica) {
  return usePart(replica, 'approvals', (view) => view.approvalsSnapshot(), EMPTY);
}

/**
 * The connection's state (`connecting`, `connected`, `disconnected`, `closed`) and why the
 * last connection ended (`failure`, null while connected).
 * @param {Replica | null | undefined} replica
 */
export function useConnection(replica) {
  return usePart(replica, 'connection', (view) => view.connectionSnapshot(), NO_CONNECTION);
}

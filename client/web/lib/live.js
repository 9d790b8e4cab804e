// @ts-check
// Drafts and presence as a live session keeps them (SPEC §7; `client/live.py`).
import { isObject } from './records.js';
import { codePoints, sliceCodePoints } from './text.js';

/**
 * @typedef {{id: string, role: string, principal: string | null, client: string | null,
 *   author: AuthorValue | null, after: string | null, parts: Record<string, string>,
 *   names: Record<string, string | null>, lengths: Record<string, number>, since: number | null}} Draft
 */

/** `draft_end` statuses that refuse one op of the producer's and end nothing. */
const NOT_AN_END = new Set(['gap', 'unknown', 'refused']);

/** @param {any} value @returns {value is string} */
export function isText(value) {
  return typeof value === 'string';
}

/** A draft from a `drafts` item, or null when it has no usable id. @returns {Draft | null} */
function readDraft(item) {
  if (!isObject(item) || !isText(item.id)) return null;
  /** @type {Draft} */
  const draft = {
    id: item.id,
    role: isText(item.role) ? item.role : 'assistant',
    principal: isText(item.principal) ? item.principal : null,
    client: isText(item.client) ? item.client : null,
    author: isObject(item.author) ? /** @type {any} */ (item.author) : null,
    after: isText(item.after) ? item.after : null,
    parts: {},
    names: {},
    lengths: {},
    since: typeof item.since === 'number' ? item.since : null,
  };
  if (isObject(item.parts)) {
    for (const [part, text] of Object.entries(item.parts)) {
      if (!isText(text)) continue;
      draft.parts[part] = text;
      draft.lengths[part] = codePoints(text);
    }
  }
  if (isObject(item.names)) {
    for (const [part, name] of Object.entries(item.names)) {
      if (isText(name)) draft.names[part] = name;
    }
  }
  return draft;
}

/**
 * Apply one `append` to a draft: `offset` counts the code points the part had before `text`;
 * text the draft already has is skipped (a resend), a gap is not applied (the next `drafts`
 * snapshot brings the part whole). Returns whether the draft changed.
 * @param {Draft} draft
 */
export function appendToDraft(draft, part, offset, text, name = null) {
  if (!isText(part) || !isText(text) || !Number.isInteger(offset) || offset < 0) return false;
  const have = draft.lengths[part] ?? 0;
  if (offset > have) return false;
  const added = sliceCodePoints(text, have - offset);
  if (isText(name) && draft.names[part] === undefined) draft.names[part] = name;
  if (added === '') {
    if (draft.parts[part] !== undefined) return false; // a resend: nothing new
    draft.parts[part] = ''; // a part opened empty (a tool call's name comes first)
    draft.lengths[part] = 0;
    return true;
  }
  draft.parts[part] = (draft.parts[part] ?? '') + added;
  draft.lengths[part] = have + codePoints(added);
  return true;
}

/** @param {ReplicaSession} session @param {any} message @returns {any[]} */
export function receiveLive(session, message) {
  const drafts = session.drafts;
  switch (message.type) {
    case 'drafts': {
      /** @type {any[]} */
      const events = [];
      if (session.draftsFresh) {
        // The first chunk after a catch-up replaces what we had.
        session.draftsFresh = false;
        const incoming = new Set(
          Array.isArray(message.drafts) ? message.drafts.map((d) => d?.id) : [],
        );
        for (const id of Array.from(drafts.keys())) {
          if (!incoming.has(id)) {
            drafts.delete(id);
            events.push({ type: 'draft_end', id, status: 'gone' });
          }
        }
      }
      for (const item of Array.isArray(message.drafts) ? message.drafts : []) {
        const draft = readDraft(item);
        if (draft === null || session.confirmed.holds(draft.id)) continue;
        drafts.set(draft.id, draft);
        events.push({ type: 'draft', id: draft.id });
      }
      return events;
    }
    case 'draft': {
      // Defaulted fields may be left out on the wire (`part` "text", `offset` 0, `text` "").
      if (!isText(message.id) || session.confirmed.holds(message.id)) return [];
      if (message.op === 'open') {
        const opened = readDraft({
          ...(isObject(message.info) ? message.info : {}),
          id: message.id,
        });
        if (opened === null) return [];
        const had = drafts.get(opened.id);
        if (had !== undefined && Object.keys(had.parts).length > 0) return []; // keep the text
        drafts.set(opened.id, opened);
        return [{ type: 'draft', id: opened.id }];
      }
      if (message.op !== undefined && message.op !== 'append') return [];
      let draft = drafts.get(message.id);
      let added = false;
      if (draft === undefined) {
        draft = /** @type {Draft} */ (readDraft(message));
        added = true;
      }
      const changed = appendToDraft(
        draft,
        message.part ?? 'text',
        message.offset ?? 0,
        message.text ?? '',
        message.name ?? null,
      );
      if (added && !changed) return []; // a gap on a draft we never saw: wait for a snapshot
      if (added) drafts.set(draft.id, draft);
      return changed ? [{ type: 'draft', id: draft.id }] : [];
    }
    case 'draft_end': {
      // `gap`, `unknown` and `refused` answer the producer's own op: the draft goes on.
      if (NOT_AN_END.has(message.status)) return [];
      if (!isText(message.id) || !drafts.delete(message.id)) return [];
      const status = isText(message.status) ? message.status : 'ended';
      return [{ type: 'draft_end', id: message.id, status }];
    }
    case 'presence': {
      const before = new Set(session.presence.keys());
      session.presence.clear();
      const joined = [];
      for (const item of Array.isArray(message.connections) ? message.connections : []) {
        if (!isObject(item) || item.connection === undefined) continue;
        const key = String(item.connection);
        session.presence.set(key, item);
        if (!before.delete(key)) joined.push(key);
      }
      return [{ type: 'presence', joined, left: [...before], changed: [] }];
    }
    case 'presence_diff': {
      const joined = [];
      const changed = [];
      const left = [];
      for (const item of Array.isArray(message.joined) ? message.joined : []) {
        if (!isObject(item) || item.connection === undefined) continue;
        session.presence.set(String(item.connection), item);
        joined.push(String(item.connection));
      }
      for (const item of Array.isArray(message.changed) ? message.changed : []) {
        if (!isObject(item) || item.connection === undefined) continue;
        const key = String(item.connection);
        // The whole entry (a cleared status is omitted from it): replace, never merge.
        session.presence.set(key, item);
        changed.push(key);
      }
      for (const connection of Array.isArray(message.left) ? message.left : []) {
        if (session.presence.delete(String(connection))) left.push(String(connection));
      }
      return [{ type: 'presence', joined, left, changed }];
    }
    default:
      return [];
  }
}

/** Drafts whose id the log now holds end `committed` (the record replaces the draft). */
export function sweepDrafts(session) {
  const events = [];
  for (const id of Array.from(session.drafts.keys())) {
    if (session.confirmed.holds(id) || session.local.holds(id)) {
      session.drafts.delete(id);
      events.push({ type: 'draft_end', id, status: 'committed' });
    }
  }
  return events;
}

/**
 * The people in `presence` (a replica's `presence` map, connection → item): one item per
 * shared socket (the tabs of one browser, `shared: true`, SPEC §14) and one per session on a
 * socket of its own. Each is the item of its first session (by connection id), with
 * `connections`, the ids of every session it stands for, and the first status any of them set.
 * @param {Map<string, any> | Iterable<any>} presence the map, or its items (`usePresence`)
 * @returns {any[]}
 */
export function people(presence) {
  /** @type {Map<string, any>} */
  const groups = new Map();
  const items = presence instanceof Map ? presence.values() : presence;
  const sessions = [...items].sort((a, b) => order(a.connection, b.connection));
  for (const item of sessions) {
    const key = Number.isInteger(item.socket) ? `socket ${item.socket}` : `one ${item.connection}`;
    const group = groups.get(key);
    if (group === undefined) {
      groups.set(key, { ...item, connections: [item.connection] });
      continue;
    }
    group.connections.push(item.connection);
    if (group.status == null && item.status != null) {
      group.status = item.status;
      group.detail = item.detail;
    }
  }
  return [...groups.values()];
}

/**
 * Connection ids in the hub's order: numbers, or their strings (the presence map's keys,
 * which `usePresence` items carry), by value; any other id after them, by its text.
 */
function order(a, b) {
  const [x, y] = [Number(a), Number(b)];
  const [xn, yn] = [Number.isFinite(x), Number.isFinite(y)];
  if (xn && yn) return x - y;
  if (xn !== yn) return xn ? -1 : 1;
  return String(a).localeCompare(String(b));
}

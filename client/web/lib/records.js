// @ts-check
// Reading a change record: what msgspec's decoder does for Python (`sync/codec.py`).
import { DecodeError } from './errors.js';

// What msgspec's typed decoder does for Python: check the shape, fill the defaults. Message
// parts are checked only as far as their container (the hub's decoder checked them fully).

export const HALTS = new Set(['stopped', 'kept']);
const AUTHOR_KINDS = new Set(['user', 'agent', 'plugin', 'rig']);
const ROLES = new Set(['system', 'user', 'assistant']);

/** @param {unknown} value @returns {value is any} */
export function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** @param {unknown} value */
function isOptionalString(value) {
  return value === undefined || value === null || typeof value === 'string';
}

/** @param {string} what */
export function malformed(what) {
  return new DecodeError(what);
}

/** @param {any} author @param {string} where @returns {AuthorValue} */
function readAuthor(author, where) {
  if (!isObject(author) || !AUTHOR_KINDS.has(author.kind)) throw malformed(`${where}: bad author`);
  const { name, request, title } = author;
  if (!isOptionalString(name) || !isOptionalString(request) || !isOptionalString(title)) {
    throw malformed(`${where}: bad author field`);
  }
  if (name !== undefined && request !== undefined && title !== undefined) return author;
  return { ...author, name: name ?? null, request: request ?? null, title: title ?? null };
}

/** @param {any} message @param {string} where @returns {MessageValue} */
export function readMessage(message, where) {
  if (!isObject(message) || !ROLES.has(message.role)) throw malformed(`${where}: bad message`);
  if (message.role === 'system') {
    if (typeof message.content !== 'string') throw malformed(`${where}: bad system content`);
    return message;
  }
  if (!Array.isArray(message.content)) throw malformed(`${where}: content is not a list`);
  if (message.role !== 'assistant') return message;
  const content = readAssistantParts(message.content);
  if (
    content !== message.content ||
    message.stop === undefined ||
    message.origin === undefined ||
    message.usage === undefined
  ) {
    return {
      ...message,
      content,
      stop: message.stop ?? null,
      origin: message.origin ?? null,
      usage: message.usage ?? null,
    };
  }
  return message;
}

// The provider fields (§11) a log written before them lacks: null, as Python's defaults.
const PART_DEFAULTS = {
  reasoning: { redacted: false, signature: null, data: null, provider_data: null },
  tool_call: { arguments: {}, provider_data: null },
};

/** @param {any[]} parts */
function readAssistantParts(parts) {
  let copy = null;
  for (let at = 0; at < parts.length; at += 1) {
    const part = parts[at];
    const defaults = isObject(part) ? PART_DEFAULTS[part.type] : undefined;
    if (defaults === undefined) continue;
    if (Object.keys(defaults).every((key) => part[key] !== undefined)) continue;
    copy ??= parts.slice();
    copy[at] = { ...defaults, ...part };
    for (const key of Object.keys(defaults)) copy[at][key] ??= defaults[key];
  }
  return copy ?? parts;
}

/** @param {any} entry @param {string} where @returns {Entry} */
export function readEntry(entry, where) {
  if (!isObject(entry)) throw malformed(`${where}: an entry is not an object`);
  const message = readMessage(entry.message, where);
  const { id, author, source_id: sourceId } = entry;
  if (!isOptionalString(id) || !isOptionalString(sourceId)) throw malformed(`${where}: bad entry`);
  const who = author === undefined || author === null ? null : readAuthor(author, where);
  if (message === entry.message && id !== undefined && who === author && sourceId !== undefined) {
    return entry;
  }
  return { ...entry, message, id: id ?? null, author: who, source_id: sourceId ?? null };
}

/** @param {any} entries @param {string} where */
function readEntries(entries, where) {
  if (!Array.isArray(entries)) throw malformed(`${where}: entries is not a list`);
  let copy = null;
  for (let at = 0; at < entries.length; at += 1) {
    const read = readEntry(entries[at], where);
    if (read !== entries[at]) {
      copy ??= entries.slice();
      copy[at] = read;
    }
  }
  return copy ?? entries;
}

/** @param {any} aside @param {string} where @returns {AsideValue} */
export function readAside(aside, where) {
  if (!isObject(aside) || typeof aside.kind !== 'string') throw malformed(`${where}: bad aside`);
  if (!('after' in aside) || !isOptionalString(aside.after) || !('value' in aside)) {
    throw malformed(`${where}: aside field missing`);
  }
  if (aside.saved !== undefined && typeof aside.saved !== 'boolean') {
    throw malformed(`${where}: bad aside saved`);
  }
  const author = readAuthor(aside.author, where);
  return {
    kind: aside.kind,
    after: aside.after,
    author,
    value: aside.value,
    saved: aside.saved ?? true,
  };
}

/** @param {any} halt */
function isHalt(halt) {
  return halt === null || HALTS.has(halt);
}

/** @param {any} state @param {string} where @returns {ConversationState} */
export function readState(state, where) {
  if (!isObject(state)) throw malformed(`${where}: the state is not an object`);
  const entries = state.entries === undefined ? [] : readEntries(state.entries, where);
  const asides = [];
  if (state.asides !== undefined) {
    if (!Array.isArray(state.asides)) throw malformed(`${where}: asides is not a list`);
    for (const saved of state.asides) {
      if (!isObject(saved) || typeof saved.id !== 'string') throw malformed(`${where}: bad aside`);
      asides.push({ id: saved.id, ...readAside(saved, where) });
    }
  }
  const halt = state.halt === undefined ? null : state.halt;
  if (!isHalt(halt)) throw malformed(`${where}: bad halt`);
  const retired = state.retired === undefined ? [] : state.retired;
  if (!Array.isArray(retired) || !retired.every((id) => typeof id === 'string')) {
    throw malformed(`${where}: retired is not a list of ids`);
  }
  return { entries, asides, halt, retired };
}

/**
 * Check a change record's shape and fill its defaults, as Python's decoder does.
 * @param {any} record
 * @returns {ChangeRecord}
 * @throws {DecodeError} reason `malformed`
 */
export function readRecord(record) {
  if (!isObject(record) || !isObject(record.change)) throw malformed('a record needs a change');
  const { change, by, at } = record;
  if (!(by === undefined || by === null || isObject(by))) throw malformed('bad by');
  if (!(at === undefined || at === null || Number.isInteger(at))) throw malformed('bad at');
  const author = by === undefined || by === null ? null : readAuthor(by, 'by');
  let read;
  switch (change.type) {
    case 'push': {
      const entries = readEntries(change.entries, 'push');
      read = entries === change.entries ? change : { type: 'push', entries };
      break;
    }
    case 'splice': {
      const { start, stop, removed } = change;
      if (!Number.isInteger(start) || !Number.isInteger(stop)) throw malformed('splice: bad range');
      if (!Array.isArray(removed) || !removed.every((id) => typeof id === 'string')) {
        throw malformed('splice: removed is not a list of ids');
      }
      const entries = readEntries(change.entries, 'splice');
      read =
        entries === change.entries ? change : { type: 'splice', start, stop, removed, entries };
      break;
    }
    case 'halt':
      if (!('halt' in change) || !isHalt(change.halt)) throw malformed('halt: bad halt');
      read = change;
      break;
    case 'aside':
      if (typeof change.id !== 'string' || !('aside' in change))
        throw malformed('aside: bad change');
      read = {
        type: 'aside',
        id: change.id,
        aside: change.aside === null ? null : readAside(change.aside, 'aside'),
      };
      break;
    case 'reset':
      read = { type: 'reset', state: readState(change.state, 'reset') };
      break;
    default:
      throw malformed(`unknown change type ${JSON.stringify(change.type)}`);
  }
  if (read === change && author === by && at !== undefined) return record;
  return { ...record, change: read, by: author, at: at ?? null };
}

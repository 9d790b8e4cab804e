// @ts-check
/**
 * convsync for browsers and Node: the conversation model, rebase, the replica session and a
 * websocket shell, in one dependency-free ES module (no build step).
 *
 * How this works. It is the JavaScript twin of the Python packages, rule for rule:
 * - `Conversation` folds change records exactly as `sync/conversation.py` does: a record is
 *   read (its shape checked, defaults filled, like msgspec's decoder), then checked against
 *   every fit rule, and only then applied; a misfit throws `ApplyError` with the same `reason`
 *   as Python and changes nothing.
 * - `rebase` replays pending records by intent, as `sync/rebase.py`.
 * - `ReplicaSession` is `client/session.py`: frames in, frames and events out, no socket.
 * - `connect` is the thin shell: a `WebSocket`, reconnects with capped exponential backoff and
 *   full jitter, and the refusal rule of SPEC §5 (codes that mean "refused for good" are never
 *   retried).
 * The vectors in `tests/vectors/` (generated from the Python model) are the shared spec; both
 * languages run them.
 *
 * Offsets into text (drafts) count Unicode code points: use `codePoints(text)`, never
 * `text.length`.
 *
 * Use:
 *   import { connect, Message } from './convsync.js';
 *   const replica = connect('ws://127.0.0.1:8765', 'demo', { getToken: () => token });
 *   replica.on('state', ({ state }) => show(state));       // connecting, connected, ...
 *   replica.on('*', (event) => render(replica.conversation)); // applied, rebased, conflict...
 *   await replica.ready;
 *   replica.conversation.push(Message.user('hello'));       // pushed by itself
 *   await replica.flush();                                   // acknowledged by the hub
 */

export const SUBPROTOCOL = 'convsync.v1';

/** The default frame limit in bytes (Python's `sync.frames.MAX_FRAME`): 16 MiB, so one record
 * may carry a screenshot of a few MiB as base64. */
export const MAX_FRAME = 16 << 20;

/** The bytes a push of several records is filled to (`FRAME_FILL`); a larger record goes alone,
 * up to the frame limit. */
const FRAME_FILL = 1 << 20;

/** Bytes of a `push` frame around its records (`PUSH_OVERHEAD`). */
const PUSH_OVERHEAD = 128;

/** The feature a session lists: it takes a placed push's records as its batch (SPEC 2.4.6). */
const HUB_REBASE = 'hub_rebase';
/** The longest delay a timer takes (2^31 - 1 ms, 24.8 days); a longer one fires at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;
const DRAFTS = 'drafts';
const PRESENCE = 'presence';

// ------------------------------------------------------------------ errors

/** Base of every convsync error: a machine-readable `reason` and a short message. */
export class ConvsyncError extends Error {
  /** @param {string} reason @param {string} message */
  constructor(reason, message) {
    super(`${reason}: ${message}`);
    this.name = new.target.name;
    /** @type {string} */
    this.reason = reason;
    /** @type {string} */
    this.detail = message;
  }
}

/** A change record does not fit the conversation; the conversation is unchanged. */
export class ApplyError extends ConvsyncError {}

/** A peer sent something the protocol does not allow. `fromHub`: the hub said so itself. */
export class ProtocolError extends ConvsyncError {
  /** @param {string} reason @param {string} message @param {boolean} [fromHub] */
  constructor(reason, message, fromHub = false) {
    super(reason, message);
    /** @type {boolean} */
    this.fromHub = fromHub;
  }
}

/** A value that does not decode to the wire type expected (reason `malformed`). */
export class DecodeError extends ProtocolError {
  /** @param {string} message */
  constructor(message) {
    super('malformed', message);
  }
}

/** The calling code misused the API; nothing was changed. */
export class UsageError extends ConvsyncError {}

/** The hub refused this replica for good (SPEC §5): never retried. `code` is the error code. */
export class Refused extends ConvsyncError {
  /** @param {string} code @param {string} detail @param {number | null} [closeCode] */
  constructor(code, detail, closeCode = null) {
    super(code, detail);
    this.code = code;
    /** @type {number | null} */
    this.closeCode = closeCode;
  }
}

// ------------------------------------------------------------------ code points

/** The number of Unicode code points in `text` (what draft offsets count). */
export function codePoints(text) {
  let count = 0;
  // eslint-disable-next-line no-unused-vars
  for (const _ of text) count += 1;
  return count;
}

/** `text` from code point `start` on (`start` counts code points, not UTF-16 units). */
export function sliceCodePoints(text, start) {
  return Array.from(text).slice(start).join('');
}

// ------------------------------------------------------------------ ids and lineages

const UUID7_HEX = '[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}';
const MESSAGE_ID = new RegExp(`^msg_${UUID7_HEX}$`);
const ASIDE_ID = new RegExp(`^aside_${UUID7_HEX}$`);

/** Whether `value` is a well-formed message id (`msg_` + UUIDv7 hex). */
export function isMessageId(value) {
  return typeof value === 'string' && MESSAGE_ID.test(value);
}

/** Whether `value` is a well-formed aside id (`aside_` + UUIDv7 hex). */
export function isAsideId(value) {
  return typeof value === 'string' && ASIDE_ID.test(value);
}

/** The millisecond timestamp a message or aside id carries. */
export function madeMs(id) {
  const hex = id.slice(id.indexOf('_') + 1);
  return parseInt(hex.slice(0, 12), 16);
}

const RAND_BITS = 74n;
const RAND_MASK = (1n << RAND_BITS) - 1n;
const MASK_48 = (1n << 48n) - 1n;
const MASK_62 = (1n << 62n) - 1n;

/** @param {(bytes: Uint8Array) => Uint8Array} fill */
function defaultRandom(fill) {
  return () => {
    const bytes = fill(new Uint8Array(10));
    let value = 0n;
    for (const byte of bytes) value = (value << 8n) | BigInt(byte);
    return value & RAND_MASK;
  };
}

/**
 * Mints UUIDv7-based ids that rise strictly for this minter: within one millisecond it counts
 * the 74 random bits up instead of drawing new ones (as `sync/ids.py`).
 */
export class IdMinter {
  /**
   * @param {{clock?: () => number, random?: () => bigint}} [options]
   *   `clock`: ms since the epoch; `random`: 74 random bits (defaults: `crypto.getRandomValues`).
   */
  constructor(options = {}) {
    this.clock = options.clock ?? (() => Date.now());
    this.random =
      options.random ?? defaultRandom((bytes) => globalThis.crypto.getRandomValues(bytes));
    this.lastMs = -1;
    this.lastRand = 0n;
  }

  /** @param {number | null} at */
  #next(at) {
    if (at !== null && at !== undefined) return format(at, this.random());
    let ms = this.clock();
    let rand;
    if (ms > this.lastMs) {
      rand = this.random() >> 1n; // headroom for counting up within this millisecond
    } else {
      ms = this.lastMs;
      rand = this.lastRand + 1n;
      if (rand > RAND_MASK) {
        ms += 1;
        rand = this.random() >> 1n;
      }
    }
    this.lastMs = ms;
    this.lastRand = rand;
    return format(ms, rand);
  }

  /** A new message id, made now or at `at` ms. @param {number | null} [at] */
  messageId(at = null) {
    return 'msg_' + this.#next(at);
  }

  /** A new aside id, made now or at `at` ms. @param {number | null} [at] */
  asideId(at = null) {
    return 'aside_' + this.#next(at);
  }
}

/** @param {number} ms @param {bigint} rand */
function format(ms, rand) {
  const value =
    ((BigInt(ms) & MASK_48) << 80n) |
    (7n << 76n) |
    ((rand >> 62n) << 64n) |
    (2n << 62n) |
    (rand & MASK_62);
  return value.toString(16).padStart(32, '0');
}

/** The minter every `Conversation` uses unless given its own. */
export const defaultMinter = new IdMinter();

/** Lineages: which saved log a value continues (plain ints, JSON-safe). */
export const Lineage = Object.freeze({
  EMPTY: 0,
  DETACHED: Number.MAX_SAFE_INTEGER,
  /** A random lineage strictly between `EMPTY` and `DETACHED`. */
  fresh() {
    for (;;) {
      const bytes = globalThis.crypto.getRandomValues(new Uint8Array(7));
      let value = 0;
      for (const byte of bytes) value = value * 256 + byte;
      value %= 2 ** 53;
      if (value > 0 && value < Number.MAX_SAFE_INTEGER) return value;
    }
  },
});

// ------------------------------------------------------------------ messages and authors

export const STOPPED = 'STOPPED';

/** Message constructors, as `sync.Message`. */
export const Message = Object.freeze({
  /** @param {string} text */
  system: (text) => ({ role: 'system', content: text }),
  /** @param {string} text */
  user: (text) => ({ role: 'user', content: [{ type: 'text', text }] }),
  /** @param {string} text @param {any} [stop] */
  assistant: (text, stop = null) => ({
    role: 'assistant',
    content: [{ type: 'text', text }],
    stop,
    origin: null,
    usage: null,
  }),
  /** @param {string} callId @param {string} name @param {string} text @param {boolean} [isError] */
  toolResult: (callId, name, text, isError = false) => ({
    role: 'user',
    content: [
      {
        type: 'tool_result',
        call_id: callId,
        name,
        content: [{ type: 'text', text }],
        is_error: isError,
      },
    ],
  }),
});

/** Author constructors, as `sync.Author`. */
export const Author = Object.freeze({
  /** @param {string | null} [title] */
  user: (title = null) => ({ kind: 'user', name: null, request: null, title }),
  /** @param {string} name @param {string | null} [request] */
  agent: (name, request = null) => ({ kind: 'agent', name, request, title: null }),
  /** @param {string} name */
  plugin: (name) => ({ kind: 'plugin', name, request: null, title: null }),
  rig: () => ({ kind: 'rig', name: null, request: null, title: null }),
});

/** @param {any} author */
function isRig(author) {
  return (
    author != null &&
    author.kind === 'rig' &&
    author.name == null &&
    author.request == null &&
    author.title == null
  );
}

/** Whether a message is an assistant reply cut short (its stop is `error` or `aborted`). */
export function isFailedReply(message) {
  const reason = message.role === 'assistant' && message.stop ? message.stop.reason : null;
  return reason === 'error' || reason === 'aborted';
}

/** Whether `entry` is the STOPPED note: a user message of only `Text("STOPPED")`, by the rig. */
export function isStopMarker(entry) {
  const content = entry.message.content;
  return (
    isRig(entry.author) &&
    entry.message.role === 'user' &&
    content.length === 1 &&
    content[0].type === 'text' &&
    content[0].text === STOPPED
  );
}

// ------------------------------------------------------------------ reading records
// What msgspec's typed decoder does for Python: check the shape, fill the defaults. Message
// parts are checked only as far as their container (the hub's decoder checked them fully).

const HALTS = new Set(['stopped', 'kept']);
const AUTHOR_KINDS = new Set(['user', 'agent', 'plugin', 'rig']);
const ROLES = new Set(['system', 'user', 'assistant']);

/** @param {unknown} value @returns {value is any} */
function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** @param {unknown} value */
function isOptionalString(value) {
  return value === undefined || value === null || typeof value === 'string';
}

/** @param {string} what */
function malformed(what) {
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
function readMessage(message, where) {
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
function readEntry(entry, where) {
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
function readAside(aside, where) {
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
function readState(state, where) {
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

// ------------------------------------------------------------------ Conversation

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
 * @typedef {{client?: string, getToken?: () => (string | null | Promise<string | null>),
 *   conversation?: Conversation, WebSocket?: any, maxFrame?: number, backoff?: number,
 *   maxBackoff?: number, random?: () => number, setTimeout?: (fn: () => void, ms: number) => any,
 *   clearTimeout?: (handle: any) => void, live?: boolean, keepalive?: number | null
 * }} ConnectOptions
 * `keepalive` (ms, default 10000; null: none): a hub that stops answering is noticed within it.
 * A browser cannot send websocket pings, so the replica sends `ping` messages (to a hub whose
 * welcome lists the `ping` feature) every `keepalive / 2` and gives the socket up when nothing
 * comes back within `keepalive / 2`.
 * @typedef {'connecting' | 'connected' | 'disconnected' | 'closed'} ConnectionState
 * `connecting` until the first welcome; `connected`; `disconnected` once a connection is lost
 * or an attempt failed, for as long as the replica retries (failed attempts change nothing:
 * one `state` event per change); `closed` after `close()` or a refusal.
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

// ------------------------------------------------------------------ merge

/*
 * Three-way merge of text, messages, entries and asides: the twin of `sync/merge.py`, rule for
 * rule (SPEC 16). Read that module's docstring for how it works; in short: each side's changes
 * are hunks over the base's code points (common prefix and suffix cut, Myers' O(ND) diff on the
 * middle, one hunk for the whole middle past a budget); hunks of both sides that touch
 * (overlap, or an insertion inside or at an end of the other's range) merge only when both
 * made the same text, else the merge is a conflict (`null`).
 *
 * Every index counts code points, never UTF-16 units: texts are split with `Array.from`, so an
 * astral character is one element here as it is one `str` index in Python. The vectors in
 * `tests/vectors/merge.json` pin both languages. (In this file, not a module of its own:
 * convsync.js imports nothing.)
 */

/** @typedef {[number, number, string]} Hunk `base[start:stop]` (code points) became `text`. */

const DIFF_BUDGET = 1 << 20;

/** The most edit steps the middle's diff tries. @param {number} n @param {number} m */
function diffBudget(n, m) {
  return Math.max(64, Math.floor(DIFF_BUDGET / (n + m)));
}

/**
 * The hunks that make `base` into `other`, in base order.
 * @param {string} base @param {string} other @returns {Hunk[]}
 */
export function diff(base, other) {
  if (base === other) return [];
  return diffPoints(Array.from(base), Array.from(other));
}

/** @param {string[]} a @param {string[]} b @returns {Hunk[]} */
function diffPoints(a, b) {
  const n = a.length;
  const m = b.length;
  let head = 0;
  while (head < n && head < m && a[head] === b[head]) head += 1;
  let tail = 0;
  while (tail < n - head && tail < m - head && a[n - 1 - tail] === b[m - 1 - tail]) tail += 1;
  const x = a.slice(head, n - tail);
  const y = b.slice(head, m - tail);
  if (x.length === 0 || y.length === 0) return leftmost(a, [[head, n - tail, y.join('')]]);
  return leftmost(
    a,
    myersHunks(x, y).map(([s, e, t]) => [head + s, head + e, t]),
  );
}

/**
 * Each pure insertion or deletion slid to the leftmost place giving the same text, short of
 * the hunk before it (as Python's `_leftmost`: two sides' edits at one point meet there).
 * @param {string[]} base @param {Hunk[]} hs @returns {Hunk[]}
 */
function leftmost(base, hs) {
  /** @type {Hunk[]} */
  const out = [];
  let floor = 0;
  for (let [start, stop, text] of hs) {
    if (start === stop) {
      let points = Array.from(text);
      while (start > floor && base[start - 1] === points[points.length - 1]) {
        points = [base[start - 1], ...points.slice(0, -1)];
        start -= 1;
      }
      text = points.join('');
      stop = start;
    } else if (text === '') {
      while (start > floor && base[start - 1] === base[stop - 1]) {
        start -= 1;
        stop -= 1;
      }
    }
    out.push([start, stop, text]);
    floor = stop + 1;
  }
  return out;
}

/**
 * Myers' greedy forward search, ties to a deletion first, as Python's `_myers`.
 * @param {string[]} a @param {string[]} b @returns {Hunk[]}
 */
function myersHunks(a, b) {
  const n = a.length;
  const m = b.length;
  const limit = Math.min(n + m, diffBudget(n, m));
  const offset = limit + 1;
  const v = new Array(2 * limit + 3).fill(0);
  /** @type {number[][]} */
  const trace = [];
  for (let d = 0; d <= limit; d += 1) {
    trace.push(v.slice(offset - d - 1, offset + d + 2));
    for (let k = -d; k <= d; k += 2) {
      let x =
        k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1])
          ? v[offset + k + 1]
          : v[offset + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x += 1;
        y += 1;
      }
      v[offset + k] = x;
      if (x >= n && y >= m) return hunksBetween(a, b, myersMatches(trace, n, m));
    }
  }
  return [[0, n, b.join('')]];
}

/** @param {number[][]} trace @param {number} n @param {number} m @returns {[number, number][]} */
function myersMatches(trace, n, m) {
  /** @type {[number, number][]} */
  const matched = [];
  let x = n;
  let y = m;
  for (let d = trace.length - 1; d >= 0; d -= 1) {
    const v = trace[d];
    const k = x - y;
    const prevK = k === -d || (k !== d && v[k - 1 + d + 1] < v[k + 1 + d + 1]) ? k + 1 : k - 1;
    const prevX = d > 0 ? v[prevK + d + 1] : 0;
    const prevY = d > 0 ? prevX - prevK : 0;
    while (x > prevX && y > prevY) {
      x -= 1;
      y -= 1;
      matched.push([x, y]);
    }
    x = prevX;
    y = prevY;
  }
  return matched.reverse();
}

/** @param {string[]} a @param {string[]} b @param {[number, number][]} matched @returns {Hunk[]} */
function hunksBetween(a, b, matched) {
  /** @type {Hunk[]} */
  const out = [];
  let px = 0;
  let py = 0;
  for (const [x, y] of [...matched, [a.length, b.length]]) {
    if (x > px || y > py) out.push([px, x, b.slice(py, y).join('')]);
    px = x + 1;
    py = y + 1;
  }
  return out;
}

/** @param {Hunk} h @param {number} lo @param {number} hi */
function hunkTouches(h, lo, hi) {
  if (h[0] < hi && lo < h[1]) return true;
  return (h[0] === h[1] || lo === hi) && h[0] <= hi && lo <= h[1];
}

/** @param {string[]} base @param {number} lo @param {number} hi @param {Hunk[]} hs */
function applyHunks(base, lo, hi, hs) {
  let out = '';
  let at = lo;
  for (const [start, stop, text] of hs) {
    out += base.slice(at, start).join('') + text;
    at = stop;
  }
  return out + base.slice(at, hi).join('');
}

/**
 * `base` with the changes of both `ours` and `theirs`, or `null` on a conflict. Symmetric.
 * @param {string} base @param {string} ours @param {string} theirs @returns {string | null}
 */
export function mergeText(base, ours, theirs) {
  if (ours === theirs || theirs === base) return ours;
  if (ours === base) return theirs;
  const points = Array.from(base);
  const sides = [diffPoints(points, Array.from(ours)), diffPoints(points, Array.from(theirs))];
  const at = [0, 0];
  let out = '';
  let done = 0;
  while (at[0] < sides[0].length || at[1] < sides[1].length) {
    const first =
      at[1] >= sides[1].length ||
      (at[0] < sides[0].length && sides[0][at[0]][0] <= sides[1][at[1]][0])
        ? 0
        : 1;
    const seed = sides[first][at[first]];
    at[first] += 1;
    /** @type {[Hunk[], Hunk[]]} */
    const group = [[], []];
    group[first].push(seed);
    let lo = seed[0];
    let hi = seed[1];
    let grown = true;
    while (grown) {
      grown = false;
      for (const side of [0, 1]) {
        const hs = sides[side];
        while (at[side] < hs.length && hunkTouches(hs[at[side]], lo, hi)) {
          const h = hs[at[side]];
          group[side].push(h);
          lo = Math.min(lo, h[0]);
          hi = Math.max(hi, h[1]);
          at[side] += 1;
          grown = true;
        }
      }
    }
    out += points.slice(done, lo).join('');
    if (group[0].length > 0 && group[1].length > 0) {
      const mine = applyHunks(points, lo, hi, group[0]);
      if (mine !== applyHunks(points, lo, hi, group[1])) return null;
      out += mine;
    } else {
      out += applyHunks(points, lo, hi, group[0].length > 0 ? group[0] : group[1]);
    }
    done = hi;
  }
  return out + points.slice(done).join('');
}

/** Deep equality of JSON values (undefined fields count as absent). */
function mergeSame(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, i) => mergeSame(item, b[i]));
  }
  if (Array.isArray(b)) return false;
  const keys = Object.keys(a).filter((k) => a[k] !== undefined);
  if (keys.length !== Object.keys(b).filter((k) => b[k] !== undefined).length) return false;
  return keys.every((key) => mergeSame(a[key], b[key]));
}

const MISSING = Symbol('missing');

class Clash extends Error {}

/** The side that changed, or a clash. */
function mergePick(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  throw new Clash();
}

/** @param {string} base @param {string} ours @param {string} theirs */
function mergeTextOrClash(base, ours, theirs) {
  const merged = mergeText(base, ours, theirs);
  if (merged === null) throw new Clash();
  return merged;
}

/** A tool call's arguments merged as their compact JSON text. */
function mergeArguments(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  const [b, o, t] = [base, ours, theirs].map((value) => JSON.stringify(value));
  const merged = mergeTextOrClash(b, o, t);
  let value;
  try {
    value = JSON.parse(merged);
  } catch {
    throw new Clash();
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Clash();
  return value;
}

function mergePart(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  if (!(base.type === ours.type && ours.type === theirs.type)) throw new Clash();
  if (base.type === 'text') {
    return { ...ours, text: mergeTextOrClash(base.text, ours.text, theirs.text) };
  }
  if (base.type === 'tool_call') {
    return {
      type: 'tool_call',
      id: mergePick(base.id, ours.id, theirs.id),
      name: mergePick(base.name, ours.name, theirs.name),
      arguments: mergeArguments(base.arguments, ours.arguments, theirs.arguments),
      provider_data: mergePick(base.provider_data, ours.provider_data, theirs.provider_data),
    };
  }
  throw new Clash();
}

function mergeMessageOrClash(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  if (!(base.role === ours.role && ours.role === theirs.role)) throw new Clash();
  if (base.role === 'system') {
    return { ...ours, content: mergeTextOrClash(base.content, ours.content, theirs.content) };
  }
  const n = base.content.length;
  if (ours.content.length !== n || theirs.content.length !== n) throw new Clash();
  const content = base.content.map((/** @type {any} */ b, /** @type {number} */ i) =>
    mergePart(b, ours.content[i], theirs.content[i]),
  );
  if (base.role === 'user') return { ...ours, content };
  return {
    ...ours,
    content,
    stop: mergePick(base.stop, ours.stop, theirs.stop),
    origin: mergePick(base.origin, ours.origin, theirs.origin),
    usage: mergePick(base.usage, ours.usage, theirs.usage),
  };
}

/**
 * `base` with the changes of both sides, part by part, or `null` on a conflict.
 * @param {any} base @param {any} ours @param {any} theirs @returns {any}
 */
export function mergeMessage(base, ours, theirs) {
  try {
    return mergeMessageOrClash(base, ours, theirs);
  } catch (error) {
    if (error instanceof Clash) return null;
    throw error;
  }
}

/** The pending side's when it changed it, else the log's. */
function mergeNewer(base, log, pending) {
  return mergeSame(pending, base) ? log : pending;
}

/**
 * The entry `pending` (an edit of `base`) becomes on a log that made `base` into `log`, or
 * `null` when the messages conflict (as Python's `merge_entry`).
 * @param {any} base @param {any} log @param {any} pending @returns {any}
 */
export function mergeEntry(base, log, pending) {
  const merged = mergeMessage(base.message, log.message, pending.message);
  if (merged === null) return null;
  return {
    message: merged,
    id: pending.id,
    author: mergeNewer(base.author, log.author, pending.author),
    source_id: mergeNewer(base.source_id, log.source_id, pending.source_id),
  };
}

function isNoteValue(value) {
  return (
    typeof value === 'object' &&
    value !== null &&
    !Array.isArray(value) &&
    typeof value.text === 'string'
  );
}

function mergeNote(base, log, pending) {
  if (![base, log, pending].every(isNoteValue)) return mergePick(base, log, pending);
  /** @type {Record<string, any>} */
  const merged = {};
  const keys = [...Object.keys(log), ...Object.keys(pending).filter((k) => !(k in log))];
  const has = (/** @type {any} */ value, /** @type {string} */ key) =>
    Object.hasOwn(value, key) ? value[key] : MISSING;
  for (const key of keys) {
    const values = [has(base, key), has(log, key), has(pending, key)];
    const value =
      key === 'text' ? mergeTextOrClash(values[0], values[1], values[2]) : mergePick(...values);
    if (value !== MISSING) merged[key] = value;
  }
  return merged;
}

/**
 * The aside `pending` (a replacement of `base`) becomes on a log that made `base` into `log`,
 * or `null` on a conflict (as Python's `merge_aside`).
 * @param {any} base @param {any} log @param {any} pending @returns {any}
 */
export function mergeAside(base, log, pending) {
  try {
    const kind = mergePick(base.kind, log.kind, pending.kind);
    const value =
      kind === 'note' && base.kind === 'note'
        ? mergeNote(base.value, log.value, pending.value)
        : mergePick(base.value, log.value, pending.value);
    return {
      kind,
      after: mergePick(base.after, log.after, pending.after),
      author: mergeNewer(base.author, log.author, pending.author),
      value,
      saved: mergePick(base.saved, log.saved, pending.saved),
    };
  } catch (error) {
    if (error instanceof Clash) return null;
    throw error;
  }
}

// ------------------------------------------------------------------ rebase

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
function conflict(record, reason, detail, theirs = null, ours = null) {
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

// ------------------------------------------------------------------ the replica session

/** `n` with thousands separated by commas, as Python's `f"{n:,}"`. @param {number} n */
function grouped(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** @param {string} text */
function utf8Length(text) {
  let bytes = 0;
  for (let i = 0; i < text.length; i += 1) {
    const code = text.charCodeAt(i);
    if (code < 0x80) bytes += 1;
    else if (code < 0x800) bytes += 2;
    else if (code >= 0xd800 && code < 0xdc00 && i + 1 < text.length) {
      bytes += 4;
      i += 1;
    } else bytes += 3;
  }
  return bytes;
}

/** @param {any} message @param {string[]} fields */
function needInts(message, fields) {
  for (const field of fields) {
    if (!Number.isInteger(message[field])) {
      throw new DecodeError(`${message.type}: ${field} is not an integer`);
    }
  }
}

/**
 * One replica of one conversation across any number of connections: messages from the hub
 * in, frames and events out, no socket (as `client/session.py`).
 *
 * `confirmed` is the log's value at the last revision seen; `local` is what the application
 * edits (`confirmed` plus pending records: the batch in flight, then `local`'s outbox).
 */
/**
 * At most `rate` messages a second on average, with bursts of up to `burst` (sync/budget.py);
 * times in seconds. The bucket starts full; `take` spends a token if there is one.
 */
class TokenBucket {
  constructor(rate, burst) {
    this.rate = rate;
    this.burst = burst;
    this.tokens = burst;
    this.last = -Infinity;
  }

  #refill(now) {
    if (this.last === -Infinity) this.last = now;
    if (now > this.last) {
      this.tokens = Math.min(this.burst, this.tokens + (now - this.last) * this.rate);
      this.last = now;
    }
  }

  take(now) {
    this.#refill(now);
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  readyAt(now) {
    this.#refill(now);
    const missing = 1 - this.tokens;
    return missing <= 0 ? now : now + missing / this.rate;
  }
}

/**
 * The bucket a replica paces its pushes by within the hub's push budget `[rate, burst]`: a
 * tenth slower and half the burst (sync/budget.py `pace`); null for no budget or one no
 * bucket can hold.
 * @param {unknown} budget
 * @returns {TokenBucket | null}
 */
function pacerFor(budget) {
  if (!Array.isArray(budget) || budget.length !== 2) return null;
  const rate = Number(budget[0]) * 0.9;
  const burst = Math.max(1, Number(budget[1]) / 2);
  if (!(rate > 0 && rate < Infinity && burst >= 1 && burst < Infinity)) return null;
  return new TokenBucket(rate, burst);
}

/** Milliseconds on a monotonic clock where there is one. */
function monotonicMs() {
  return globalThis.performance?.now?.() ?? Date.now();
}

// ---------------------------------------------------------------- steering (SPEC §10)

/** A model call is under way: value `{turn, at}`. */
export const STEP_KIND = 'rig.step';
/** User input waiting for the step to end: value the entry. */
export const QUEUED_KIND = 'rig.queued';
/** The user asked the turn to stop: value `{turn, at}`. */
export const STOP_KIND = 'rig.stop';

/**
 * What a replica does with a push rejected for each reason (`sync.errors.REJECTS`): replay it
 * once the records it missed arrive, report its records as conflicts, or queue its user text.
 * @type {Readonly<Record<string, 'replay' | 'final' | 'queue'>>}
 */
export const REJECTS = Object.freeze({
  behind: 'replay',
  lineage: 'replay',
  invalid: 'final',
  forbidden: 'final',
  queued: 'queue',
  superseded: 'final',
  turn_ended: 'final',
  pinned: 'final',
  decided: 'final',
  asked: 'final',
  forged: 'final',
  bad_answer: 'final',
});

/** The rule for a reject `reason`; final when unknown (a newer hub). @param {string} reason */
export function rejectRule(reason) {
  return Object.hasOwn(REJECTS, reason) ? REJECTS[reason] : 'final';
}

/** Whether `entry` is the user's own message (a user message holding no tool result, and not
 * the STOPPED note, which a worker's answer after a stop carries and which never waits). */
export function isUserText(entry) {
  const message = entry.message;
  return (
    message.role === 'user' &&
    !message.content.some((part) => part.type === 'tool_result') &&
    !isStopMarker(entry)
  );
}

/** The id of the queued aside holding entry `entryId`. @param {string} entryId */
export function queuedId(entryId) {
  return 'aside_' + entryId.slice('msg_'.length);
}

/** The id of the entry queued aside `asideId` holds. @param {string} asideId */
export function queuedEntryId(asideId) {
  return 'msg_' + asideId.slice('aside_'.length);
}

/**
 * The rebase rule for a push refused `queued` (`sync.steer.queue_records`): each entry of the
 * user's own text a push brings becomes a `rig.queued` aside put, in order, drawn after
 * `after`; the other entries of that push stay a push before them; other records stay.
 * Null when no record pushes user text.
 * @param {ChangeRecord[]} records @param {string | null} after @returns {ChangeRecord[] | null}
 */
export function queueRecords(records, after) {
  if (!records.some((r) => r.change.type === 'push' && r.change.entries.some(isUserText))) {
    return null;
  }
  const replayed = [];
  for (const record of records) {
    const change = record.change;
    if (change.type !== 'push') {
      replayed.push(record);
      continue;
    }
    // A STOPPED note pushed before the user's text goes: the landing puts one itself while
    // the halt stands (a note alone must never land mid-step).
    const typed = change.entries.some(isUserText);
    const rest = change.entries.filter(
      (entry) => !isUserText(entry) && !(typed && isStopMarker(entry)),
    );
    if (rest.length > 0) {
      replayed.push(
        rest.length === change.entries.length
          ? record
          : { ...record, change: { type: 'push', entries: rest } },
      );
    }
    for (const entry of change.entries) {
      if (!isUserText(entry)) continue;
      const author = entry.author ?? Author.user();
      const value = {
        message: entry.message,
        id: entry.id,
        author: entry.author ?? null,
        source_id: entry.source_id ?? null,
      };
      const aside = { kind: QUEUED_KIND, after, author, value, saved: true };
      replayed.push({
        change: { type: 'aside', id: queuedId(entry.id), aside },
        by: author,
        at: record.at ?? null,
      });
    }
  }
  return replayed;
}

/**
 * Whether the last assistant message a model reads has a call nothing answers yet, read from
 * the end back to it (as `sync.steer.step_pending`). @param {Conversation} conversation
 */
export function stepPending(conversation) {
  /** @type {Map<string, number>} */
  const answered = new Map();
  for (let at = conversation.length - 1; at >= 0; at -= 1) {
    const message = /** @type {Entry} */ (conversation.entry(at)).message;
    if (message.role === 'user') {
      const results = message.content.filter((part) => part.type === 'tool_result');
      if (results.length !== message.content.length) return false;
      for (const result of results)
        answered.set(result.call_id, (answered.get(result.call_id) ?? 0) + 1);
    } else if (message.role === 'assistant') {
      if (isFailedReply(message)) return false;
      for (const part of message.content) {
        if (part.type !== 'tool_call') continue;
        const left = answered.get(part.id) ?? 0;
        if (left === 0) return true;
        answered.set(part.id, left - 1);
      }
      return false;
    }
  }
  return false;
}

/**
 * Whether `conversation` is mid-step (SPEC §10): a `rig.step` marker stands, or the last
 * assistant message a model reads has pending calls. @param {Conversation} conversation
 */
export function midStep(conversation) {
  if (conversation.asides().some(([, aside]) => aside.kind === STEP_KIND)) return true;
  return stepPending(conversation);
}

/**
 * Ask the running turn to stop (SPEC §10), as `Replica.stop` in Python: while a turn record
 * is open or `conversation` is mid-step, put a stop request (`rig.stop`, value `{turn, at}`);
 * otherwise halt the user's last request `stopped`. Whether anything was asked. The request's
 * author names `sub`, who the hub knows this connection as (`welcome.sub`; the hub checks it).
 * @param {Conversation} conversation @param {number} [now] @param {string} [sub]
 */
export function stop(conversation, now = Date.now(), sub = 'anonymous') {
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  const openTurn = last !== null && last.end === null ? last.index : null;
  if (openTurn === null && !midStep(conversation)) return conversation.halt('stopped');
  if (conversation.asides().some(([, aside]) => aside.kind === STOP_KIND)) return true;
  const after = conversation.length > 0 ? conversation.id(conversation.length - 1) : null;
  const value = { turn: openTurn, at: now };
  const author = { kind: 'user', name: sub, request: null, title: null };
  conversation.addAside({ kind: STOP_KIND, after, author, value, saved: true });
  return true;
}

// ---------------------------------------------------------------- approvals (SPEC §12)

/** An approval or a question a worker asks a person: value an approval (`sync.approvals`). */
export const APPROVAL_KIND = 'rig.approval';
/** The tools a UI runs (frontend tools): value `{tools: [name, ...]}`. */
export const TOOLS_KIND = 'rig.tools';
const APPROVAL_STATES = new Set(['open', 'approved', 'denied', 'answered', 'cancelled']);
const DECISIONS = new Set(['approved', 'denied', 'answered']);
const MAX_REASON = 2000;

const isStringOrNull = (/** @type {any} */ v) => v == null || typeof v === 'string';

/**
 * The approval an aside holds, with every field (as `sync.approvals.approval_of`); null when
 * it is not a `rig.approval` or is malformed.
 * @param {any} aside
 */
export function approvalOf(aside) {
  if (aside === null || aside === undefined || aside.kind !== APPROVAL_KIND) return null;
  const v = aside.value;
  if (!isObject(v) || !Number.isInteger(v.turn) || typeof v.key !== 'string') return null;
  if (typeof v.asked_by !== 'string' || !isStringOrNull(v.asked_client)) return null;
  const state = v.state ?? 'open';
  if (!APPROVAL_STATES.has(state)) return null;
  for (const name of ['call', 'prompt', 'reason', 'decided_by']) {
    if (!isStringOrNull(v[name])) return null;
  }
  if (v.decided_at != null && !Number.isInteger(v.decided_at)) return null;
  return {
    turn: v.turn,
    key: v.key,
    call: v.call ?? null,
    prompt: v.prompt ?? null,
    schema: v.schema ?? null,
    state,
    answer: v.answer ?? null,
    reason: v.reason ?? null,
    asked_by: v.asked_by,
    asked_client: v.asked_client ?? null,
    decided_by: v.decided_by ?? null,
    decided_at: v.decided_at ?? null,
  };
}

/** Every well-formed approval of `conversation`, `[asideId, approval]`, in the order put. */
export function approvals(conversation) {
  const found = [];
  for (const [id, aside] of conversation.asides()) {
    const approval = approvalOf(aside);
    if (approval !== null) found.push([id, approval]);
  }
  return found;
}

/** The approval keyed `(turn, key)`, `[asideId, approval]`, or null. */
export function findApproval(conversation, turn, key) {
  return approvals(conversation).find(([, a]) => a.turn === turn && a.key === key) ?? null;
}

/**
 * Ask in the open turn (an edit: one aside put), or find the approval asked already for
 * `(turn, key)` (as `sync.approvals.ask`). Returns `{id, approval, made}`.
 * @param {Conversation} conversation
 * @param {{key: string, askedBy: string, askedClient: string, call?: string | null,
 *   prompt?: string | null, schema?: any}} options
 */
export function ask(conversation, options) {
  const { key, askedBy, askedClient, call = null, prompt = null, schema = null } = options;
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  if (last === null || last.end !== null) {
    throw new UsageError('no_turn', 'ask in an open turn: open a turn record first');
  }
  const found = findApproval(conversation, last.index, key);
  if (found !== null) return { id: found[0], approval: found[1], made: false };
  if (typeof key !== 'string' || key.length === 0 || codePoints(key) > 256) {
    throw new UsageError('bad_key', "an approval's key is 1 to 256 characters");
  }
  if (schema !== null) {
    const problem = schemaProblem(schema);
    if (problem !== null) throw new UsageError('bad_schema', `schema: ${problem}`);
  }
  let after = null;
  for (let at = conversation.length - 1; at >= 0 && call !== null; at -= 1) {
    const message = /** @type {any} */ (conversation.entry(at)).message;
    if (message.role === 'assistant' && message.content.some((p) => p.type === 'tool_call' && p.id === call)) {
      after = conversation.id(at);
      break;
    }
  }
  if (after === null && conversation.length > 0) after = conversation.id(conversation.length - 1);
  const value = {
    turn: last.index,
    key,
    call,
    prompt,
    schema,
    state: 'open',
    answer: null,
    reason: null,
    asked_by: askedBy,
    asked_client: askedClient,
    decided_by: null,
    decided_at: null,
  };
  const id = conversation.addAside({ kind: APPROVAL_KIND, after, author: Author.rig(), value, saved: true });
  return { id, approval: value, made: true };
}

/**
 * Whether `record` puts an approval in a decided state (`is_decision` in Python).
 * @param {ChangeRecord} record
 */
function isDecision(record) {
  const change = record.change;
  if (change.type !== 'aside' || change.aside == null || change.aside.kind !== APPROVAL_KIND) {
    return false;
  }
  const value = change.aside.value;
  return value !== null && typeof value === 'object' && DECISIONS.has(value.state);
}

/**
 * Decide approval `id` (an edit: the aside replaced), as `sync.approvals.decide`: denied,
 * answered (a question given an answer or a schema) or approved. Returns the decided approval.
 * Throws `UsageError` `no_approval`, `decided` (not open here any more: nothing changes) or
 * `bad_answer` (the schema refuses the answer).
 * @param {Conversation} conversation @param {string} id
 * @param {{approve?: boolean, answer?: any, reason?: string | null, decidedBy: string,
 *   at?: number}} options
 */
export function decide(conversation, id, options) {
  const { approve = true, reason = null, decidedBy, at = Date.now() } = options;
  let answer = options.answer ?? null;
  const aside = conversation.aside(id);
  const approval = approvalOf(aside);
  if (aside === null || approval === null) throw new UsageError('no_approval', `${id} is not an approval here`);
  if (approval.state !== 'open') {
    throw new UsageError('decided', `approval ${JSON.stringify(approval.key)} is ${approval.state} already`);
  }
  let state = 'approved';
  if (!approve) {
    state = 'denied';
    answer = null;
  } else if (approval.call === null && (answer !== null || approval.schema !== null)) {
    state = 'answered';
  }
  if (state !== 'denied' && approval.schema !== null) {
    const problem = answerProblem(approval.schema, answer);
    if (problem !== null) throw new UsageError('bad_answer', problem);
  }
  if (reason !== null && codePoints(reason) > MAX_REASON) {
    throw new UsageError('bad_reason', `a reason is at most ${MAX_REASON} characters`);
  }
  const value = { ...approval, state, answer, reason, decided_by: decidedBy, decided_at: at };
  conversation.replaceAside(id, { kind: APPROVAL_KIND, after: aside.after, author: Author.user(), value, saved: true });
  return value;
}

/**
 * The rebase rule (SPEC §12, `sync.approvals.decided_meanwhile`): whether a pending put of an
 * approval, made on `then`, meets the log's `held` decided meanwhile.
 */
export function decidedMeanwhile(then, held, pending) {
  if (pending === null || pending.kind !== APPROVAL_KIND || held === null || jsonEqual(held, pending)) {
    return false;
  }
  const logged = approvalOf(held);
  if (logged === null || logged.state === 'open') return false;
  const base = approvalOf(then);
  return base === null || base.state !== logged.state || !jsonEqual(base, logged);
}

const SCHEMA_KEYWORDS = new Set([
  'type', 'enum', 'const', 'properties', 'required', 'additionalProperties', 'items',
  'minItems', 'maxItems', 'minLength', 'maxLength', 'minimum', 'maximum',
  'exclusiveMinimum', 'exclusiveMaximum',
]);
const SCHEMA_ANNOTATIONS = new Set([
  'title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'deprecated',
]);
const SCHEMA_TYPES = ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object'];
const SCHEMA_DEPTH = 16;

const isNumber = (/** @type {any} */ v) => typeof v === 'number' && Number.isFinite(v);

/**
 * Why `schema` is not in the JSON Schema subset an approval may use, or null (as Python's
 * `sync.approvals.schema_problem`, pinned by `tests/vectors/approvals.json`).
 */
export function schemaProblem(schema, depth = 0) {
  if (typeof schema === 'boolean') return null;
  if (!isObject(schema)) return 'a schema is an object or a boolean';
  if (depth > SCHEMA_DEPTH) return `nested deeper than ${SCHEMA_DEPTH}`;
  for (const [word, value] of Object.entries(schema)) {
    if (SCHEMA_ANNOTATIONS.has(word)) continue;
    if (!SCHEMA_KEYWORDS.has(word)) return `unsupported keyword ${pyRepr(word)}`;
    if (word === 'type') {
      const types = Array.isArray(value) ? value : [value];
      if (types.length === 0 || !types.every((t) => typeof t === 'string' && SCHEMA_TYPES.includes(t))) {
        return `type names one or more of ${SCHEMA_TYPES.join(', ')}`;
      }
    } else if (word === 'enum') {
      if (!Array.isArray(value) || value.length === 0) return 'enum is a non-empty array';
    } else if (word === 'properties') {
      if (!isObject(value)) return 'properties is an object of schemas';
      for (const sub of Object.values(value)) {
        const problem = schemaProblem(sub, depth + 1);
        if (problem !== null) return problem;
      }
    } else if (word === 'required') {
      if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
        return 'required is an array of names';
      }
    } else if (word === 'additionalProperties' || word === 'items') {
      const problem = schemaProblem(value, depth + 1);
      if (problem !== null) return problem;
    } else if (['minItems', 'maxItems', 'minLength', 'maxLength'].includes(word)) {
      if (!Number.isInteger(value) || value < 0) return `${word} is a non-negative integer`;
    } else if (!isNumber(value)) return `${word} is a number`;
  }
  return null;
}

/** A value as Python's `repr` shows a string (`'a'`), for messages both replicas share. */
function pyRepr(text) {
  return text.includes("'") && !text.includes('"') ? `"${text}"` : `'${text.replaceAll("'", "\\'")}'`;
}

/** JSON text as Python's `msgspec.json.encode` writes it (no spaces; `1.0` for a float). */
function show(value) {
  return JSON.stringify(value);
}

function isType(value, name) {
  switch (name) {
    case 'null':
      return value === null;
    case 'boolean':
      return typeof value === 'boolean';
    case 'integer':
      return Number.isInteger(value);
    case 'number':
      return isNumber(value);
    case 'string':
      return typeof value === 'string';
    case 'array':
      return Array.isArray(value);
    case 'object':
      return isObject(value);
    default:
      return false;
  }
}

/**
 * Why `value` does not match `schema` (the subset), or null; the message says where
 * (`answer.name`, `answer[2]`) and what was expected, as Python's `answer_problem`.
 */
export function answerProblem(schema, value, path = 'answer', depth = 0) {
  if (schema === true) return null;
  if (schema === false || !isObject(schema)) return `${path}: no value is allowed here`;
  if (depth > SCHEMA_DEPTH) return `${path}: nested deeper than ${SCHEMA_DEPTH}`;
  if ('type' in schema) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => isType(value, t))) return `${path}: expected ${types.join(' or ')}`;
  }
  if ('const' in schema && !jsonEqual(value, schema.const)) return `${path}: expected ${show(schema.const)}`;
  if ('enum' in schema && !schema.enum.some((v) => jsonEqual(value, v))) {
    return `${path}: expected one of ${schema.enum.map(show).join(', ')}`;
  }
  if (typeof value === 'string') {
    const length = codePoints(value);
    if ('minLength' in schema && length < schema.minLength) return `${path}: at least ${schema.minLength} characters`;
    if ('maxLength' in schema && length > schema.maxLength) return `${path}: at most ${schema.maxLength} characters`;
  }
  if (isNumber(value)) {
    if ('minimum' in schema && value < schema.minimum) return `${path}: at least ${show(schema.minimum)}`;
    if ('maximum' in schema && value > schema.maximum) return `${path}: at most ${show(schema.maximum)}`;
    if ('exclusiveMinimum' in schema && value <= schema.exclusiveMinimum) {
      return `${path}: more than ${show(schema.exclusiveMinimum)}`;
    }
    if ('exclusiveMaximum' in schema && value >= schema.exclusiveMaximum) {
      return `${path}: less than ${show(schema.exclusiveMaximum)}`;
    }
  }
  if (Array.isArray(value)) {
    if ('minItems' in schema && value.length < schema.minItems) return `${path}: at least ${schema.minItems} items`;
    if ('maxItems' in schema && value.length > schema.maxItems) return `${path}: at most ${schema.maxItems} items`;
    if ('items' in schema) {
      for (let at = 0; at < value.length; at += 1) {
        const problem = answerProblem(schema.items, value[at], `${path}[${at}]`, depth + 1);
        if (problem !== null) return problem;
      }
    }
  }
  if (isObject(value)) {
    for (const name of schema.required ?? []) {
      if (!Object.hasOwn(value, name)) return `${path}: ${pyRepr(name)} is required`;
    }
    const properties = schema.properties ?? {};
    const extra = 'additionalProperties' in schema ? schema.additionalProperties : true;
    for (const [name, item] of Object.entries(value)) {
      const own = Object.hasOwn(properties, name);
      const sub = own ? properties[name] : extra;
      const problem = answerProblem(sub, item, `${path}.${name}`, depth + 1);
      if (problem !== null) return !own && sub === false ? `${path}: ${pyRepr(name)} is not allowed` : problem;
    }
  }
  return null;
}

/** The first result answering call `callId` after the last entry holding it, or null. */
export function resultOf(conversation, callId) {
  let at = conversation.length - 1;
  for (; at >= 0; at -= 1) {
    const message = /** @type {any} */ (conversation.entry(at)).message;
    if (
      message.role === 'assistant' &&
      message.content.some((p) => p.type === 'tool_call' && p.id === callId)
    )
      break;
  }
  if (at < 0) return null;
  for (let later = at + 1; later < conversation.length; later += 1) {
    const message = /** @type {any} */ (conversation.entry(later)).message;
    if (message.role !== 'user') continue;
    const found = message.content.find((p) => p.type === 'tool_result' && p.call_id === callId);
    if (found !== undefined) return found;
  }
  return null;
}

/** `approval_asked` / `approval_decided` events for the approvals `records` put. */
function approvalEvents(records) {
  const events = [];
  for (const record of records) {
    const change = record.change;
    if (change.type !== 'aside' || change.aside === null || change.aside.kind !== APPROVAL_KIND) continue;
    const approval = approvalOf(change.aside);
    if (approval === null) continue;
    const type = approval.state === 'open' ? 'approval_asked' : 'approval_decided';
    events.push({ type, id: change.id, approval });
  }
  return events;
}

export class ReplicaSession {
  #maxFrame = MAX_FRAME;

  /**
   * @param {string} client this replica's client id (push seqs rise under it)
   * @param {{local?: Conversation, maxFrame?: number, maxBatch?: number, seq?: number, live?: boolean}} [options]
   *   `live`: ask for drafts and presence (SPEC §7) and keep them in `drafts` and `presence`.
   */
  constructor(client, options = {}) {
    const local = options.local ?? new Conversation();
    if (local.revision !== local.unsaved().length) {
      throw new UsageError('saved_value', 'a replica starts from a value with no saved records');
    }
    this.client = client;
    this.local = local;
    this.confirmed = new Conversation();
    this.seq = options.seq ?? 0;
    this.maxFrame = options.maxFrame ?? MAX_FRAME;
    this.maxBatch = options.maxBatch ?? 1000;
    /** @type {{seq: number, records: ChangeRecord[], doomed: boolean, landed: ChangeRecord[] | null, base: Conversation | null} | null} */
    this.inflight = null;
    /** Log records that overtook the batch in flight (held until its ack or reject). */
    /** @type {ChangeRecord[]} */
    this.held = [];
    /** @type {ChangeRecord[]} */
    this.landed = [];
    /** @type {any} */
    this.welcome = null;
    /** Who the hub knows this connection as (`welcome.sub`; `anonymous` without auth). */
    this.sub = 'anonymous';
    /** The latest welcome, kept over a disconnect (who this replica is: `sub`, `scopes`). */
    /** @type {any} */
    this.lastWelcome = null;
    /** Pushes are paced within the hub's push budget (`welcome.limits.push`), once welcomed. */
    /** @type {TokenBucket | null} */
    this.pacer = null;
    /** When `nextPush(now)` held a push back to stay within the budget: when to call it again. */
    /** @type {number | null} */
    this.pacedUntil = null;
    this.catchingUp = false;
    /** @type {Conversation | null} */
    this.beforeCatchUp = null;
    this.rebaseDue = false; // rebase `local` at the end of the catch-up, moved or not
    // The revision the last ack said this replica will hold: a queue the hub landed with the
    // push follows its ack (SPEC §10); no push goes until those records are in.
    this.owed = 0;
    /** @type {any} */
    this.partial = null;
    /** @type {Entry[]} */
    this.partialEntries = [];
    this.live = options.live === true;
    /** Open drafts by id (live only): the hub's view, as it streams. @type {Map<string, Draft>} */
    this.drafts = new Map();
    /** Live connections by connection id (live only). @type {Map<string, any>} */
    this.presence = new Map();
    this.draftsFresh = false;
  }

  /**
   * The largest frame this session sends, in bytes; setting it also sets `local.recordLimit`
   * to what one push can carry (`maxFrame - 128`), so an edit too large to push throws at the
   * call that makes it.
   */
  get maxFrame() {
    return this.#maxFrame;
  }

  set maxFrame(maxFrame) {
    if (!(Number.isInteger(maxFrame) && maxFrame > PUSH_OVERHEAD)) {
      throw new UsageError(
        'bad_setting',
        `maxFrame must be more than ${PUSH_OVERHEAD} bytes, got ${JSON.stringify(maxFrame)}`,
      );
    }
    this.#maxFrame = maxFrame;
    this.local.recordLimit = maxFrame - PUSH_OVERHEAD;
  }

  /** Records made here that the hub has not acknowledged yet. */
  get pending() {
    const inflight = this.inflight;
    const sent = inflight !== null && !inflight.doomed ? inflight.records.length : 0;
    return sent + this.local.unsaved().length;
  }

  /** Welcomed and caught up: pushes can go. */
  get ready() {
    return (
      this.welcome !== null && !this.catchingUp && this.confirmed.revision >= this.owed
    );
  }

  /** Caught up with nothing pending and nothing in flight. */
  get settled() {
    return this.ready && this.inflight === null && this.local.unsaved().length === 0;
  }

  /** The first message of a new connection; forgets the previous connection's state. */
  hello(token = null) {
    this.welcome = null;
    this.catchingUp = false;
    this.partial = null;
    this.partialEntries = [];
    this.held = []; // the hub sends them again in the catch-up
    this.owed = 0; // the catch-up brings them
    return {
      type: 'hello',
      client: this.client,
      lineage: this.confirmed.lineage,
      revision: this.confirmed.revision,
      token,
      features: this.live ? [HUB_REBASE, DRAFTS, PRESENCE] : [HUB_REBASE],
    };
  }

  /**
   * The next push frame (JSON text) if one may go now, and records refused locally. An edit
   * too large to push throws when it is made (`local.recordLimit`); a record that still
   * outgrows a push here (made before the session measured `local`, or re-targeted by a
   * rebase) is taken out of `local` and reported `too_large`. A push of several records is
   * filled to 1 MiB at most; a larger record goes alone, up to `maxFrame`. Given `now`
   * (milliseconds, any monotonic clock), pushes are paced within the hub's budget: one that
   * would go over it is held back (`pacedUntil` says until when) and the records made
   * meanwhile go out together.
   * @param {number | null} [now]
   * @returns {{frame: string | null, conflicts: Conflict[]}}
   */
  nextPush(now = null) {
    this.pacedUntil = null;
    if (!this.ready || this.inflight !== null || this.local.unsaved().length === 0) {
      return { frame: null, conflicts: [] };
    }
    if (this.pacer !== null && now !== null && !this.pacer.take(now / 1000)) {
      this.pacedUntil = this.pacer.readyAt(now / 1000) * 1000;
      return { frame: null, conflicts: [] };
    }
    const records = this.local.unsaved();
    const budget = this.maxFrame - PUSH_OVERHEAD;
    const fill = Math.min(this.maxFrame, FRAME_FILL) - PUSH_OVERHEAD;
    const encoded = [];
    let size = 0;
    for (let at = 0; at < records.length; at += 1) {
      if (encoded.length === this.maxBatch) break;
      const data = JSON.stringify(records[at]);
      const bytes = utf8Length(data);
      if (at === 0 && bytes > budget) return this.#refuse(at, bytes, budget);
      if (at > 0 && size + bytes + 1 > fill) break; // the next push takes it
      encoded.push(data);
      size += bytes + 1;
    }
    const taken = this.local.takeUnsaved();
    this.local.returnUnsaved(taken.slice(encoded.length));
    this.seq += 1;
    this.inflight = {
      seq: this.seq,
      records: taken.slice(0, encoded.length),
      doomed: false,
      landed: null,
      base: null,
    };
    const frame =
      `{"type":"push","seq":${this.seq},"lineage":${this.confirmed.lineage},` +
      `"revision":${this.confirmed.revision},"records":[${encoded.join(',')}]}`;
    return { frame, conflicts: [] };
  }

  #refuse(at, size, budget) {
    const records = this.local.takeUnsaved();
    const detail =
      `record of ${grouped(size)} bytes is ${grouped(size - budget)} bytes over the ` +
      `${grouped(budget)} a push can carry (maxFrame ${grouped(this.maxFrame)})`;
    const conflicts = [conflict(records[at], 'too_large', detail)];
    const keep = records.slice(0, at).concat(records.slice(at + 1));
    conflicts.push(...rebase(this.local, this.confirmed, keep, this.confirmed));
    const next = this.nextPush();
    return { frame: next.frame, conflicts: conflicts.concat(next.conflicts) };
  }

  /**
   * Handle one decoded message from the hub; returns the events for the application. Message
   * types this version does not know are ignored.
   * @throws {ProtocolError} the message breaks the protocol; drop the connection.
   */
  receive(message) {
    const events = this.#receive(message);
    if (this.live && this.drafts.size > 0 && events.length > 0) events.push(...sweepDrafts(this));
    return events;
  }

  /** @param {any} message @returns {any[]} */
  #receive(message) {
    if (!isObject(message)) throw new DecodeError('a hub message is not an object');
    switch (message.type) {
      case 'welcome':
        needInts(message, ['lineage', 'revision', 'acked']);
        if (typeof message.sub === 'string') this.sub = message.sub;
        return this.#onWelcome(message);
      case 'records':
        needInts(message, ['from']);
        if (!Array.isArray(message.records)) throw new DecodeError('records: not a list');
        return [...this.#onRecords(message), ...approvalEvents(message.records)];
      case 'state':
        needInts(message, ['lineage', 'revision']);
        return this.#onState(message);
      case 'entries':
        if (!Array.isArray(message.entries)) throw new DecodeError('entries: not a list');
        return this.#onEntries(message);
      case 'ack':
        needInts(message, ['seq', 'from', 'revision']);
        return this.#onAck(message);
      case 'reject':
        needInts(message, ['seq', 'lineage', 'revision']);
        return this.#onReject(message);
      case 'drafts':
      case 'draft':
      case 'draft_end':
      case 'presence':
      case 'presence_diff':
        return this.live ? receiveLive(this, message) : [];
      case 'error':
        throw new ProtocolError(
          String(message.code),
          `the hub closed the session: ${message.detail}`,
          true,
        );
      default:
        return []; // a newer hub's message: not ours to understand
    }
  }

  /**
   * The connection is gone; the session waits for the next `hello()`. A `disconnected` event
   * only when a welcomed connection ended: events mark changes of state (one `disconnected`
   * after each `connected`), not every failed attempt to reconnect.
   */
  disconnected(reason) {
    const welcomed = this.welcome !== null;
    this.welcome = null;
    /** @type {any[]} */
    const events = welcomed ? [{ type: 'disconnected', reason }] : [];
    if (this.live) {
      // Drafts and presence are live facts of a connection: the next one sends them afresh.
      for (const id of this.drafts.keys()) events.push({ type: 'draft_end', id, status: 'lost' });
      this.drafts.clear();
      if (this.presence.size > 0) {
        events.push({ type: 'presence', joined: [], left: [...this.presence.keys()], changed: [] });
        this.presence.clear();
      }
    }
    return events;
  }

  #onWelcome(welcome) {
    if (this.welcome !== null) throw new ProtocolError('unexpected', 'a second welcome');
    this.welcome = welcome;
    this.lastWelcome = welcome; // kept over a disconnect: who this replica is
    this.pacer = pacerFor(welcome.limits?.push);
    this.draftsFresh = true;
    this.seq = Math.max(this.seq, welcome.acked);
    const batch = this.inflight;
    this.inflight = null;
    if (batch !== null) {
      if (batch.seq <= welcome.acked && batch.landed !== null) {
        // Placed by the hub, its ack lost: `confirmed` holds it as it landed, `local` as
        // sent. What was made on top is replayed from the batch's base, as the ack would;
        // with nothing on top, `local` is that base. Either way `local` is rebased.
        this.local.beforeEdit(null);
        if (this.beforeCatchUp === null)
          this.beforeCatchUp = batch.base !== null ? batch.base : this.local.copy();
        this.rebaseDue = true;
      } else if (batch.seq <= welcome.acked) {
        this.landed = batch.records; // they come in the catch-up
      } else if (!batch.doomed) this.local.returnUnsaved(batch.records);
    }
    const confirmed = this.confirmed;
    if (confirmed.lineage === Lineage.EMPTY && confirmed.revision === 0) {
      confirmed.continueLog(welcome.lineage, 0); // a value begun here continues any log
    }
    this.catchingUp = true;
    if (this.beforeCatchUp === null) this.beforeCatchUp = confirmed.copy();
    return [
      { type: 'connected', lineage: welcome.lineage, revision: welcome.revision },
      ...this.#maybeCaughtUp(),
    ];
  }

  #maybeCaughtUp() {
    const welcome = this.welcome;
    const confirmed = this.confirmed;
    if (
      this.partial !== null ||
      !(confirmed.lineage === welcome.lineage && confirmed.revision >= welcome.revision)
    ) {
      return [];
    }
    this.catchingUp = false;
    let base = this.beforeCatchUp;
    this.beforeCatchUp = null;
    const landed = this.landed;
    this.landed = [];
    base = base !== null ? folded(base, landed) : null;
    const unmoved =
      base !== null && base.lineage === confirmed.lineage && base.revision === confirmed.revision;
    const due = this.rebaseDue;
    this.rebaseDue = false;
    if (unmoved && landed.length === 0 && this.local.unsaved().length === 0 && !due) return [];
    return this.#rebaseLocal(base);
  }

  /** @param {Conversation | null} base */
  #rebaseLocal(base) {
    const pending = this.local.takeUnsaved();
    const conflicts = rebase(this.local, this.confirmed, pending, base);
    /** @type {any[]} */
    const events = conflicts.slice();
    if (pending.length > 0) {
      events.push({
        type: 'rebased',
        replayed: pending.length - conflicts.length,
        revision: this.confirmed.revision,
      });
    }
    return events;
  }

  #onRecords(message) {
    if (this.welcome === null) throw new ProtocolError('unexpected', 'records before welcome');
    const confirmed = this.confirmed;
    const revision = confirmed.revision + this.held.length;
    const skip = revision - message.from;
    if (skip < 0) throw new ProtocolError('gap', `records from ${message.from}, at ${revision}`);
    const records = message.records.slice(skip);
    if (records.length === 0) return [];
    if (this.catchingUp) {
      foldAll(confirmed, records);
      return [
        { type: 'applied', count: records.length, revision: confirmed.revision },
        ...this.#maybeCaughtUp(),
      ];
    }
    const inflight = this.inflight;
    if (inflight === null && this.local.unsaved().length === 0) {
      foldAll(confirmed, records);
      for (const record of records) this.local.apply(record);
      return [{ type: 'applied', count: records.length, revision: confirmed.revision }];
    }
    if (inflight !== null && !inflight.doomed) {
      const origin = message.origin;
      if (isObject(origin) && origin.client === this.client && origin.seq === inflight.seq) {
        // The hub placed our stale batch (SPEC 2.4.6): these records are it, as it landed;
        // its ack follows. Fold what overtook it, then these.
        if (inflight.landed === null) {
          inflight.landed = [];
          // What is made on top of the batch as sent is replayed onto the batch as it
          // landed, from this base (pure insertions need it).
          if (this.local.unsaved().length > 0) {
            inflight.base = folded(confirmed.copy(), inflight.records);
          } else {
            // `local` is that base now: copy it before the next edit, if one comes before
            // the ack (a writer that awaits its flush makes none: no copy).
            this.local.beforeEdit(() => {
              if (this.inflight === inflight && inflight.base === null)
                inflight.base = this.local.copy();
            });
          }
        }
        const overtaken = this.#foldHeld();
        foldAll(confirmed, records);
        inflight.landed = inflight.landed.concat(records);
        return overtaken;
      }
      // The log moved under the batch in flight, which the hub may still place: hold these
      // records until its ack or reject says what became of it.
      this.held = this.held.concat(records);
      return [];
    }
    // The log moved under pending records: replay them on it.
    let base = null;
    const pending = this.local.takeUnsaved();
    if (needsBase(pending)) base = confirmed.copy();
    foldAll(confirmed, records);
    this.local.returnUnsaved(pending);
    return [
      { type: 'applied', count: records.length, revision: confirmed.revision },
      ...this.#rebaseLocal(base),
    ];
  }

  /** Fold the records that overtook the batch in flight into `confirmed`. */
  #foldHeld() {
    const held = this.held;
    this.held = [];
    if (held.length === 0) return [];
    foldAll(this.confirmed, held);
    return [{ type: 'applied', count: held.length, revision: this.confirmed.revision }];
  }

  #onState(message) {
    if (this.welcome === null) throw new ProtocolError('unexpected', 'state before welcome');
    this.partial = message;
    this.partialEntries = [];
    this.draftsFresh = true; // a drafts snapshot follows every state
    return message.more ? [] : this.#takeState();
  }

  #onEntries(message) {
    if (this.partial === null) throw new ProtocolError('unexpected', 'entries without a state');
    for (const entry of message.entries) this.partialEntries.push(entry);
    return message.more ? [] : this.#takeState();
  }

  #takeState() {
    const message = this.partial;
    this.partial = null;
    let state = message.state;
    if (this.partialEntries.length > 0) {
      state = { ...state, entries: (state.entries ?? []).concat(this.partialEntries) };
      this.partialEntries = [];
    }
    let confirmed;
    try {
      confirmed = Conversation.fromState(state);
    } catch (error) {
      if (!(error instanceof ConvsyncError)) throw error;
      throw new ProtocolError(
        'malformed',
        `the hub sent a state that is not valid: ${error.message}`,
      );
    }
    const holds = this.confirmed;
    if (
      !this.catchingUp &&
      this.held.length === 0 &&
      message.lineage === holds.lineage &&
      message.revision === holds.revision &&
      message.lineage !== Lineage.EMPTY &&
      message.lineage !== Lineage.DETACHED
    ) {
      // The state of the very log this replica holds (a hub answering an older push
      // `lineage` sends it once more): nothing moved, and a batch made on it since is still
      // good (as client/session.py does).
      return [];
    }
    confirmed.continueLog(message.lineage, message.revision);
    this.held = []; // the state holds them
    this.owed = 0; // a state holds whatever an ack said would follow, or replaces it
    const old = this.confirmed;
    this.confirmed = confirmed;
    const events = [{ type: 'reset', lineage: message.lineage, revision: message.revision }];
    if (this.catchingUp) return [...events, ...this.#maybeCaughtUp()];
    const inflight = this.inflight;
    if (inflight !== null && !inflight.doomed) {
      inflight.doomed = true;
      this.local.returnUnsaved(inflight.records);
    }
    return [...events, ...this.#rebaseLocal(old)];
  }

  #onAck(ack) {
    const batch = this.inflight;
    if (batch === null || batch.seq !== ack.seq) return []; // a resend's duplicate answer
    if (batch.doomed)
      throw new ProtocolError('unexpected', `ack of push ${ack.seq} after the log moved`);
    const confirmed = this.confirmed;
    const landed = batch.landed;
    if (landed !== null) {
      // Placed by the hub: `confirmed` holds it already, as it landed. Replay what was made on
      // top of the batch as sent onto the log as it is.
      if (ack.revision < confirmed.revision || ack.from !== confirmed.revision - landed.length) {
        throw new ProtocolError(
          'gap',
          `ack ${ack.from}..${ack.revision} for ${landed.length} placed records at ${confirmed.revision}`,
        );
      }
      this.inflight = null;
      this.owed = ack.revision;
      this.local.beforeEdit(null); // the base-keeping hook, if it is still armed
      return [
        { type: 'applied', count: landed.length, revision: confirmed.revision },
        ...this.#rebaseLocal(batch.base),
      ];
    }
    if (ack.from !== confirmed.revision || ack.revision < ack.from + batch.records.length) {
      throw new ProtocolError(
        'gap',
        `ack ${ack.from}..${ack.revision} for ${batch.records.length} records at ${confirmed.revision}`,
      );
    }
    this.inflight = null;
    this.owed = ack.revision; // more than the batch: a queue landed with it, and follows
    foldAll(confirmed, batch.records);
    return [];
  }

  #onReject(reject) {
    const confirmed = this.confirmed;
    if (reject.lineage === confirmed.lineage && reject.revision < confirmed.revision) {
      // The hub's log is behind this replica's (a stale hub): resending would spin. Drop the
      // connection; the next hello, ahead of the log, gets the log's state.
      throw new ProtocolError(
        'ahead',
        `the hub's log is at ${reject.revision}, this replica at ${confirmed.revision}`,
      );
    }
    const batch = this.inflight;
    if (batch === null || batch.seq !== reject.seq) return [];
    this.inflight = null;
    if (batch.doomed) return [];
    // What the batch (and what was made on top of it) was made on: `confirmed` before the
    // records that overtook it, copied only when needed.
    const rule = rejectRule(reject.reason);
    if (rule === 'queue') return this.#queue(batch.records);
    if (reject.reason === 'turn_ended') {
      const dropped = this.#dropLateStops(batch.records, reject);
      if (dropped !== null) return dropped;
    }
    if (reject.reason === 'decided') {
      const dropped = this.#dropRefused(batch.records, reject, isDecision);
      if (dropped !== null) return dropped;
    }
    const pending = batch.records.concat(this.local.unsaved());
    // `forbidden` (a token without `write`) is final like `invalid`: resending cannot help.
    const final = rule === 'final';
    const base = needsBase(pending) || final ? confirmed.copy() : null;
    const events = this.#foldHeld();
    if (!final) {
      // The hub could not place it: the records it missed came first (held, or on their way);
      // replay the batch and what followed it on the log.
      this.local.returnUnsaved(batch.records);
      if (events.length === 0) return [];
      return [...events, ...this.#rebaseLocal(base)];
    }
    for (const record of batch.records) {
      events.push(conflict(record, reject.reason, String(reject.detail ?? '')));
    }
    return [
      ...events,
      ...this.#rebaseLocal(folded(/** @type {Conversation} */ (base), batch.records)),
    ];
  }

  /**
   * The batch of user text `records` was refused `queued` (SPEC §10): replay it as
   * `rig.queued` asides (`queueRecords`) ahead of what was made on top, on the log as it is.
   * @param {ChangeRecord[]} records
   */
  /**
   * A batch refused `turn_ended` holding stop requests and other records (a stop pressed as
   * the turn ended, a message typed next): the stops are the conflict, the rest is replayed,
   * never lost with them (`_drop_late_stops` in Python). Null: final as a whole.
   * @param {ChangeRecord[]} records @param {any} reject
   */
  #dropLateStops(records, reject) {
    const isStop = (/** @type {ChangeRecord} */ record) =>
      record.change.type === 'aside' &&
      record.change.aside != null &&
      record.change.aside.kind === STOP_KIND;
    return this.#dropRefused(records, reject, isStop);
  }

  /**
   * A batch refused for what only its `refused` records can be refused for: those are the
   * conflict, the rest is replayed, never lost with them (`_drop_refused` in Python):
   * `turn_ended`'s late stops, `decided`'s decisions of an approval another decided first
   * (SPEC §12), so a message typed beside a losing click still lands. Null when every
   * record, or none, is such: final as a whole.
   * @param {ChangeRecord[]} records @param {any} reject
   * @param {(record: ChangeRecord) => boolean} refused
   */
  #dropRefused(records, reject, refused) {
    const dropped = records.filter(refused);
    if (dropped.length === 0 || dropped.length === records.length) return null;
    const rest = records.filter((record) => !refused(record));
    const before = this.confirmed.copy();
    const events = this.#foldHeld();
    for (const record of dropped) {
      events.push(conflict(record, reject.reason, String(reject.detail ?? '')));
    }
    this.local.returnUnsaved(rest);
    return [...events, ...this.#rebaseLocal(before)];
  }

  #queue(records) {
    // The base is `confirmed` before the records that overtook the batch: what it (and what
    // was made on top) was made on, so an edit there merges with what those records changed.
    const before = this.confirmed.copy();
    const events = this.#foldHeld();
    const confirmed = this.confirmed;
    const last = confirmed.length > 0 ? confirmed.id(confirmed.length - 1) : null;
    const queued = queueRecords(records, last);
    if (queued === null) {
      const detail = "refused queued, but not the user's own text";
      return [...events, ...records.map((record) => conflict(record, 'queued', detail))];
    }
    const pending = queued.concat(this.local.unsaved());
    const base = needsBase(pending) ? before : null;
    this.local.returnUnsaved(queued);
    const ids = queued
      .filter((r) => r.change.type === 'aside' && r.change.aside?.kind === QUEUED_KIND)
      .map((r) => /** @type {any} */ (r.change).id);
    return [...events, { type: 'queued', ids, mine: true }, ...this.#rebaseLocal(base)];
  }
}

/** @param {Conversation} conversation @param {ChangeRecord[]} records */
// ---------------------------------------------------------------- drafts and presence (SPEC §7)

/**
 * @typedef {{id: string, role: string, principal: string | null, client: string | null,
 *   author: AuthorValue | null, after: string | null, parts: Record<string, string>,
 *   names: Record<string, string | null>, lengths: Record<string, number>, since: number | null}} Draft
 */

/** `draft_end` statuses that refuse one op of the producer's and end nothing. */
const NOT_AN_END = new Set(['gap', 'unknown', 'refused']);

/** @param {any} value @returns {value is string} */
function isText(value) {
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
function receiveLive(session, message) {
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
function sweepDrafts(session) {
  const events = [];
  for (const id of Array.from(session.drafts.keys())) {
    if (session.confirmed.holds(id) || session.local.holds(id)) {
      session.drafts.delete(id);
      events.push({ type: 'draft_end', id, status: 'committed' });
    }
  }
  return events;
}

function foldAll(conversation, records) {
  try {
    for (const record of records) conversation.apply(record);
  } catch (error) {
    if (!(error instanceof ConvsyncError)) throw error;
    throw new ProtocolError('diverged', `a record from the hub does not fit: ${error.message}`);
  }
}

/** `base` with `records` applied, or null when they do not fit. */
function folded(base, records) {
  try {
    for (const record of records) base.apply(record);
  } catch (error) {
    if (error instanceof ConvsyncError) return null;
    throw error;
  }
  return base;
}

// ------------------------------------------------------------------ the socket shell

/**
 * The one table of error codes (SPEC §5, `sync/errors.py` `CODES`): the close code the hub
 * uses after `error {code}` and what a replica does then: `never` (refused for good),
 * `new_token` (retry only with a new token), `backoff`, or `at_once`.
 * @type {Readonly<Record<string, {close: number, retry: 'never' | 'new_token' | 'backoff' | 'at_once'}>>}
 */
export const CODES = Object.freeze({
  malformed_json: { close: 1008, retry: 'never' },
  unknown_type: { close: 1008, retry: 'never' },
  bad_message: { close: 1008, retry: 'never' },
  no_hello: { close: 1008, retry: 'never' },
  unexpected: { close: 1008, retry: 'never' },
  too_big: { close: 1009, retry: 'never' },
  bad_client: { close: 1008, retry: 'never' },
  bad_conversation_id: { close: 1008, retry: 'never' },
  unauthorized: { close: 4001, retry: 'new_token' },
  forbidden: { close: 4003, retry: 'never' },
  replaced: { close: 4009, retry: 'never' },
  deleted: { close: 4410, retry: 'never' }, // the conversation was deleted (SPEC §15)
  rate_limited: { close: 4008, retry: 'backoff' },
  lagging: { close: 4000, retry: 'at_once' },
  unavailable: { close: 1011, retry: 'backoff' },
  shutting_down: { close: 1001, retry: 'backoff' },
  internal: { close: 1011, retry: 'backoff' },
});

/** @type {Readonly<Record<number, string>>} the close codes that name one code alone */
const CODE_OF_CLOSE = Object.freeze({
  1009: 'too_big', // a bare close from the socket's own size limit: resending fails again
  4000: 'lagging',
  4001: 'unauthorized',
  4003: 'forbidden',
  4008: 'rate_limited',
  4009: 'replaced',
  4410: 'deleted',
});

/**
 * The retry rule for an error code; an unknown code (a newer hub) is retried with backoff.
 * @param {string} code @returns {'never' | 'new_token' | 'backoff' | 'at_once'}
 */
export function retryOf(code) {
  return Object.hasOwn(CODES, code) ? CODES[code].retry : 'backoff';
}

/** The close code the hub uses after `error {code}` (1011 for an unknown code). */
export function closeCodeOf(code) {
  return Object.hasOwn(CODES, code) ? CODES[code].close : 1011;
}

/**
 * The error code a close stands for: its reason when that is a known code (the hub closes
 * with the code as the reason), else the one code a close code names alone, else null.
 * @param {number | null} close @param {string} reason @returns {string | null}
 */
export function codeOfClose(close, reason) {
  if (Object.hasOwn(CODES, reason)) return reason;
  return close !== null && Object.hasOwn(CODE_OF_CLOSE, close) ? CODE_OF_CLOSE[close] : null;
}

/**
 * What to do after a connection ended: `'refused'` (never again), `'at_once'` or `'backoff'`.
 * `code` is the error code the hub sent (null if none came), `closeCode`/`closeReason` the
 * websocket close, `canRefreshToken`: a `getToken` hook can fetch a new token.
 * @param {string | null} code @param {number | null} closeCode @param {boolean} canRefreshToken
 * @param {string} [closeReason]
 * @returns {'refused' | 'at_once' | 'backoff'}
 */
export function retryRule(code, closeCode, canRefreshToken, closeReason = '') {
  const known = code ?? codeOfClose(closeCode, closeReason);
  if (known === null) return 'backoff'; // a network failure, or a close that says nothing
  const retry = retryOf(known);
  if (retry === 'never') return 'refused';
  if (retry === 'new_token') return canRefreshToken ? 'backoff' : 'refused';
  return retry;
}

/**
 * The delay before reconnect attempt `failures` (1, 2, ...): uniform in [0, cap) where the cap
 * doubles from `base` up to `max` (full jitter). @param {number} failures @param {number} base
 * @param {number} max @param {() => number} [random]
 */
export function backoffDelay(failures, base, max, random = Math.random) {
  const cap = Math.min(max, base * 2 ** Math.max(failures - 1, 0));
  return random() * cap;
}

/** The `keepalive` option (ms, default 10000; null: none), checked. */
function keepaliveOption(value) {
  const keepalive = value === undefined ? 10_000 : value;
  const inRange = typeof keepalive === 'number' && keepalive >= 100 && keepalive < Infinity;
  if (keepalive !== null && !inRange) {
    throw new UsageError(
      'bad_option',
      'keepalive must be null (no pings) or a number of milliseconds, at least 100 ' +
        `(got ${keepalive})`,
    );
  }
  return keepalive;
}

/**
 * Call `end(closeCode, reason)` once, when `ws` ends: at its `close`, or at an `error` that
 * no `close` may follow (Node's WebSocket on a refused connection fires `error` alone, and a
 * shell waiting for `close` would never retry). A browser's `close` after an `error` says
 * only 1006, so ending at the error loses nothing; the socket is closed to free it. Every
 * socket shell (replica, feed) ends through here: one reconnect path.
 * Returns a function that ends it now, with a reason (a keepalive that timed out).
 * @param {any} ws @param {(closeCode: number | null, reason: string) => void} end
 * @returns {(reason: string) => void}
 */
export function whenEnded(ws, end) {
  let ended = false;
  const once = (closeCode, reason) => {
    if (ended) return;
    ended = true;
    end(closeCode, reason);
  };
  ws.onclose = (event) => once(event?.code ?? null, event?.reason ?? '');
  const giveUp = (reason) => {
    once(null, reason);
    try {
      ws.close();
    } catch {
      // not open yet, or closing already
    }
  };
  ws.onerror = (event) => {
    const message = typeof event?.message === 'string' && event.message ? `: ${event.message}` : '';
    giveUp(`connection failed${message}`);
  };
  return giveUp;
}

/**
 * A live replica of one conversation over a websocket: the application edits `conversation`,
 * the replica pushes, applies, rebases and reconnects by itself.
 */
export class Replica {
  /**
   * @param {string} url the hub's base url (`ws://host:port`)
   * @param {string} conversationId
   * @param {ConnectOptions} [options]
   */
  constructor(url, conversationId, options = {}) {
    this.url = `${url.replace(/\/+$/, '')}/v1/conversations/${encodeURIComponent(conversationId)}`;
    this.conversationId = conversationId;
    const client = options.client ?? `web-${Lineage.fresh().toString(16)}`;
    this.session = new ReplicaSession(client, {
      local: options.conversation,
      maxFrame: options.maxFrame,
      live: options.live,
    });
    this.getToken = options.getToken ?? null;
    /** @type {string | null} */ this.lastToken = null; // sent in the last attempt
    /** @type {string | null} */ this.refusedToken = null; // the hub said `unauthorized` to it
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.WebSocket !== 'function') {
      throw new UsageError('no_websocket', 'no WebSocket here: pass options.WebSocket');
    }
    this.backoff = options.backoff ?? 50;
    this.maxBackoff = options.maxBackoff ?? 5000;
    this.random = options.random ?? Math.random;
    this.setTimer = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    /** @type {any} */
    this.paceTimer = null;
    this.clearTimer = options.clearTimeout ?? ((handle) => clearTimeout(handle));
    this.keepalive = keepaliveOption(options.keepalive);
    if (options.presence !== undefined && typeof options.presence !== 'boolean') {
      throw new UsageError('bad_option', `presence must be true or false (got ${options.presence})`);
    }
    /** Watching without presence (`presence: false`): counted by the hub, shown nowhere. */
    this.watch = options.presence === false;
    this.pingTimer = null; // the next ping is due
    this.pongTimer = null; // a ping waits for its answer
    /** @type {'connecting' | 'connected' | 'disconnected' | 'closed'} */
    this.state = 'disconnected';
    /** @type {Refused | null} */
    this.refused = null;
    /** Why the last connection or attempt ended; null while connected. @type {string | null} */
    this.failure = null;
    this.attempting = false; // a connection is being made or is up
    this.failures = 0;
    this.connects = 0;
    /** @type {Map<string, Set<(event: any) => void>>} */
    this.listeners = new Map();
    /** @type {any} */
    this.ws = null;
    this.timer = null;
    this.refreshTimer = null;
    this.closing = false;
    /** @type {Set<() => void>} called after every message handled and every state change */
    this.progress = new Set();
    this.session.local.onEdit(() => this.#pump());
    /** Resolves once the first catch-up is done; rejects with `Refused` if refused first. */
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => {}); // an application that never awaits it is not an error
  }

  /** The local value: edit it; it holds your pending edits. */
  get conversation() {
    return this.session.local;
  }

  get client() {
    return this.session.client;
  }

  /** Edits made here that the hub has not acknowledged yet. */
  get pending() {
    return this.session.pending;
  }

  /** The log's revision as last seen. */
  get revision() {
    return this.session.confirmed.revision;
  }

  /** Open drafts by id, as they stream (with `live: true`). */
  get drafts() {
    return this.session.drafts;
  }

  /** This connection's principal as `welcome` said (`anonymous` without auth). */
  get sub() {
    return this.session.lastWelcome?.sub ?? 'anonymous';
  }

  /** Every approval and question (SPEC §12), `[asideId, approval]`, in the order asked. */
  get approvals() {
    return approvals(this.session.local);
  }

  /**
   * Whether this token may decide approvals (the `approve` scope; a hub without auth lets
   * every socket decide, except on the approvals its own client asked).
   */
  get mayDecide() {
    const scopes = this.session.lastWelcome?.scopes;
    return !Array.isArray(scopes) || scopes.includes('approve');
  }

  /**
   * Whether this replica may decide approval `approval` (an approval value): its token may
   * decide, and it did not ask it (by principal with auth, by client id without).
   */
  mayDecideOn(approval) {
    if (!this.mayDecide || approval.state !== 'open') return false;
    const auth = Array.isArray(this.session.lastWelcome?.scopes);
    return auth ? approval.asked_by !== this.sub : approval.asked_client !== this.client;
  }

  /**
   * Ask a person and wait for the decision (SPEC §12), as Python's `Replica.ask`: about
   * tool call `call`, or a question with `key`, `prompt` and a JSON `schema`. Idempotent per
   * `(turn, key)`. Resolves with the decided (or cancelled) approval; rejects with
   * `UsageError` `not_asked` when the hub refused the ask.
   * @param {{call?: string | null, prompt?: string | null, schema?: any, key?: string}} options
   */
  ask(options = {}) {
    const key = options.key ?? options.call ?? null;
    if (key === null) throw new UsageError('bad_key', 'ask about a call, or give a question its key');
    const { approval } = ask(this.session.local, {
      key,
      call: options.call ?? null,
      prompt: options.prompt ?? null,
      schema: options.schema ?? null,
      askedBy: this.sub,
      askedClient: this.client,
    });
    const turn = approval.turn;
    return new Promise((resolve, reject) => {
      const check = () => {
        const found = findApproval(this.session.local, turn, key);
        if (found === null) {
          stopListening();
          reject(new UsageError('not_asked', 'the hub refused the ask (see the conflict)'));
        } else if (found[1].state !== 'open') {
          stopListening();
          resolve(found[1]);
        }
      };
      const stopListening = this.on('*', check);
      check();
    });
  }

  /**
   * Resolves with the result of tool call `callId` (a frontend tool's, pushed by a UI) once
   * one is in the conversation: the first after the call (strict pairing refuses a second).
   * @param {string} callId
   */
  result(callId) {
    return new Promise((resolve) => {
      const check = () => {
        const found = resultOf(this.session.local, callId);
        if (found !== null) {
          stopListening();
          resolve(found);
        }
      };
      const stopListening = this.on('*', check);
      check();
    });
  }

  /**
   * Decide approval `id` as this replica's principal (an edit, pushed like any other): see
   * `decide`. A `conflict` event with reason `decided` comes when someone decided first.
   * @param {string} id @param {{approve?: boolean, answer?: any, reason?: string | null}} [options]
   */
  decide(id, options = {}) {
    if (!this.mayDecide) throw new UsageError('forbidden', 'this token lacks the approve scope');
    return decide(this.session.local, id, { ...options, decidedBy: this.sub });
  }

  /** Live connections by connection id (with `live: true`). */
  get presence() {
    return this.session.presence;
  }

  /**
   * Listen to `type`: a session event (`connected`, `disconnected`, `applied`, `rebased`,
   * `reset`, `conflict`), `state` (`{state, code, reason}`), `refused` (a `Refused`), or `*`
   * (every session event). Returns a function that stops listening.
   */
  on(type, listener) {
    let set = this.listeners.get(type);
    if (set === undefined) this.listeners.set(type, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }

  #emit(type, event) {
    for (const key of [type, '*']) {
      if (key === '*' && (type === 'state' || type === 'refused')) continue;
      const set = this.listeners.get(key);
      if (set !== undefined) for (const listener of Array.from(set)) listener(event);
    }
  }

  #setState(state, code = null, reason = '') {
    if (this.state === state) return;
    this.state = state;
    this.#emit('state', { type: 'state', state, code, reason });
    this.#progressed();
  }

  #events(events) {
    for (const event of events) this.#emit(event.type, event);
  }

  /** Open the first connection (called by `connect`). */
  async start() {
    if (this.closing || this.attempting) return;
    this.attempting = true;
    // Only the first attempt is `connecting`; a retry leaves `disconnected` alone (a welcome
    // or a refusal is the next change of state).
    if (this.connects === 0 && this.failures === 0) this.#setState('connecting');
    let token = null;
    try {
      token = this.getToken !== null ? await this.getToken() : null;
    } catch (error) {
      this.#ended(null, null, `getToken failed: ${error}`);
      return;
    }
    if (this.closing) {
      this.#setState('closed');
      return;
    }
    if (this.refusedToken !== null && token === this.refusedToken) {
      // `getToken` gave back the very token the hub just refused (a page holding one token):
      // asking again would only be refused again, forever.
      this.attempting = false;
      this.#refuse('unauthorized', 'the hub refused this token and getToken gave it again', 4001);
      return;
    }
    this.lastToken = token;
    this.refusedToken = null;
    let ws;
    try {
      ws = new this.WebSocket(this.url, SUBPROTOCOL);
    } catch (error) {
      this.#ended(null, null, `${error}`);
      return;
    }
    this.ws = ws;
    let errorCode = null;
    let done = false;
    const finish = (closeCode, reason) => {
      if (done) return;
      done = true;
      if (this.ws === ws) this.ws = null;
      this.#ended(errorCode, closeCode, reason);
    };
    ws.onopen = () => {
      const hello = /** @type {any} */ (this.session.hello(token));
      if (this.getToken !== null)
        hello.features = [...hello.features, 'auth'];
      if (this.keepalive !== null) hello.features = [...hello.features, 'ping'];
      if (this.watch) hello.watch = true; // in no presence, not `online` (SPEC §17)
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (message) => {
      if (done) return;
      try {
        const data = typeof message.data === 'string' ? message.data : String(message.data);
        const decoded = JSON.parse(data);
        this.#heard(ws, decoded);
        this.#maybeRefresh(ws, decoded);
        const events = this.session.receive(decoded);
        if (events.length > 0 && events[0].type === 'connected') {
          this.failures = 0;
          this.failure = null;
          this.connects += 1;
          this.#setState('connected');
        }
        this.#events(events);
        if (this.session.ready) this.resolveReady(this);
        this.#pump();
        this.#progressed();
      } catch (error) {
        if (error instanceof ProtocolError && error.fromHub) errorCode = error.reason;
        else if (!(error instanceof ConvsyncError) && !(error instanceof SyntaxError)) throw error;
        const reason = error instanceof Error ? error.message : String(error);
        try {
          ws.close(error instanceof ProtocolError && error.fromHub ? 1000 : 4002, 'protocol error');
        } catch {
          // already closing
        }
        finish(null, reason);
      }
    };
    whenEnded(ws, finish);
  }

  /**
   * After a `welcome` or `auth_ok` that says when the token expires, fetch a new token with
   * `getToken` at 80% of that time and send it as `auth` (SPEC §6 live refresh).
   */
  #maybeRefresh(ws, message) {
    if (this.getToken === null || !isObject(message)) return;
    if (message.type !== 'welcome' && message.type !== 'auth_ok') return;
    const expiresIn = message.expires_in;
    if (typeof expiresIn !== 'number' || !Number.isFinite(expiresIn)) return;
    if (Array.isArray(message.features) && !message.features.includes('auth')) return;
    if (this.refreshTimer !== null) this.clearTimer(this.refreshTimer);
    const getToken = this.getToken;
    this.refreshTimer = this.setTimer(
      async () => {
        this.refreshTimer = null;
        if (this.ws !== ws || ws.readyState !== 1) return;
        try {
          const token = await getToken();
          if (this.ws === ws && ws.readyState === 1 && token)
            ws.send(JSON.stringify({ type: 'auth', token }));
        } catch {
          // the hub closes with `unauthorized` at expiry; the reconnect asks again
        }
      },
      // Timers take at most 2^31 - 1 ms (24.8 days): a longer delay fires at once, and each
      // `auth_ok` armed it again, an `auth` flood. A token living longer is refreshed later
      // than 80% of its life, at 24.8 days, which is still well before it ends.
      Math.min(MAX_TIMER_MS, Math.max(0, expiresIn * 800)),
    );
  }

  /**
   * Keepalive: after a welcome listing `ping`, ping every `keepalive / 2`; anything the hub
   * sends answers the ping in flight. A ping unanswered for `keepalive / 2` gives the socket
   * up at once: a frozen hub would not finish a closing handshake either.
   */
  #heard(ws, message) {
    if (this.keepalive === null || !isObject(message)) return;
    const features = message.type === 'welcome' ? message.features : null;
    const welcomed = Array.isArray(features) && features.includes('ping');
    if (!welcomed && this.pongTimer === null) return;
    if (this.pongTimer !== null) this.clearTimer(this.pongTimer);
    this.pongTimer = null;
    const half = this.keepalive / 2;
    this.pingTimer = this.setTimer(() => {
      this.pingTimer = null;
      if (this.ws !== ws || ws.readyState !== 1) return;
      ws.send('{"type":"ping"}');
      this.pongTimer = this.setTimer(() => {
        this.pongTimer = null;
        if (this.ws !== ws) return;
        ws.onmessage = () => {};
        ws.onclose = () => {};
        ws.onerror = () => {};
        try {
          ws.close(1000, 'keepalive');
        } catch {
          // already closing
        }
        this.ws = null;
        this.#ended(null, null, `keepalive timed out: a ping went unanswered for ${half / 1000}s`);
      }, half);
    }, half);
  }

  #stopKeepalive() {
    for (const timer of [this.pingTimer, this.pongTimer]) {
      if (timer !== null) this.clearTimer(timer);
    }
    this.pingTimer = null;
    this.pongTimer = null;
  }

  #pump() {
    const ws = this.ws;
    if (ws === null || ws.readyState !== 1) return;
    const { frame, conflicts } = this.session.nextPush(monotonicMs());
    this.#events(conflicts);
    if (frame !== null) {
      ws.send(frame);
    } else if (this.session.pacedUntil !== null && this.paceTimer === null) {
      // Within the hub's budget: push what gathered meanwhile once a token is there.
      this.paceTimer = this.setTimer(() => {
        this.paceTimer = null;
        this.#pump();
      }, Math.max(0, this.session.pacedUntil - monotonicMs()));
    }
  }

  #ended(code, closeCode, reason) {
    this.attempting = false;
    this.#stopKeepalive();
    if (this.refreshTimer !== null) {
      this.clearTimer(this.refreshTimer);
      this.refreshTimer = null;
    }
    if (this.paceTimer !== null) {
      this.clearTimer(this.paceTimer);
      this.paceTimer = null;
    }
    this.failure = reason || `closed ${closeCode ?? ''}`.trim();
    this.#events(this.session.disconnected(this.failure));
    if (this.closing) {
      this.#setState('closed', code, reason);
      return;
    }
    const rule = retryRule(code, closeCode, this.getToken !== null, reason);
    if (rule === 'refused') {
      this.#refuse(code ?? codeOfClose(closeCode, reason) ?? `close_${closeCode}`, reason, closeCode);
      return;
    }
    // Refused for its token: the next attempt asks `getToken` for another (see `start`).
    if ((code ?? codeOfClose(closeCode, reason)) === 'unauthorized') this.refusedToken = this.lastToken;
    this.#setState('disconnected', code, reason);
    this.failures += 1;
    const delay =
      rule === 'at_once'
        ? 0
        : backoffDelay(this.failures, this.backoff, this.maxBackoff, this.random);
    this.timer = this.setTimer(() => {
      this.timer = null;
      this.start();
    }, delay);
  }

  /** Stop for good, refused by the hub (`code`): `closed`, a `refused` event, `ready` rejects. */
  #refuse(code, reason, closeCode) {
    this.refused = new Refused(code, reason, closeCode);
    this.#setState('closed', this.refused.code, reason);
    this.#emit('refused', this.refused);
    this.rejectReady(this.refused);
  }

  /** Resolves once every edit made so far is acknowledged (waits across reconnects); rejects
   * when the replica is closed or refused first. */
  flush() {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.session.settled && this.ws !== null) {
          this.progress.delete(check);
          resolve(undefined);
        } else if (this.state === 'closed') {
          this.progress.delete(check);
          reject(this.refused ?? new UsageError('closed', 'the replica is closed'));
        }
      };
      this.progress.add(check);
      this.#pump();
      check();
    });
  }

  #progressed() {
    for (const check of Array.from(this.progress)) check();
  }

  /** Disconnect and stop reconnecting. Unacknowledged edits stay in `conversation.unsaved()`. */
  close() {
    this.closing = true;
    this.#stopKeepalive();
    if (this.timer !== null) {
      this.clearTimer(this.timer);
      this.timer = null;
    }
    const ws = this.ws;
    if (ws !== null) {
      try {
        ws.close(1000, '');
      } catch {
        // already closed
      }
    } else {
      this.#setState('closed');
    }
  }
}

/**
 * Connect a replica of `conversationId` on the hub at `url`; it starts at once.
 * @param {string} url @param {string} conversationId
 * @param {ConnectOptions} [options]
 */
export function connect(url, conversationId, options = {}) {
  const replica = new Replica(url, conversationId, options);
  void replica.start();
  return replica;
}

// ---------------------------------------------------------------- the summary feed (SPEC §8)

/**
 * The rows of `/v1/summary`: every conversation under `prefix` with its revision, last
 * message and who is online, kept up to date. It reconnects with backoff like a `Replica`;
 * each (re)connection's snapshot replaces the rows, so nothing is missed across a gap.
 * Events: `rows` (`{type, rows: Row[], snapshot: boolean}`: the rows that changed) and
 * `state` (as a `Replica`'s).
 */
export class SummaryFeed {
  /**
   * @param {string} url the hub's base url (`ws://host:port`)
   * @param {{prefix?: string, after?: string | null, limit?: number, getToken?: () => string | null | Promise<string | null>,
   *   WebSocket?: any, backoff?: number, maxBackoff?: number, random?: () => number}} [options]
   */
  constructor(url, options = {}) {
    this.url = `${url.replace(/\/+$/, '')}/v1/summary`;
    this.prefix = options.prefix ?? '';
    /** `id` (pages by `after`) or `updated` (the latest `limit` rows). */
    this.order = options.order ?? 'id';
    this.after = options.after ?? null;
    this.limit = options.limit ?? 100;
    this.getToken = options.getToken ?? null;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.backoff = options.backoff ?? 50;
    this.maxBackoff = options.maxBackoff ?? 5000;
    this.random = options.random ?? Math.random;
    this.keepalive = keepaliveOption(options.keepalive);
    /** Ends the current socket now (set per socket). @type {(reason: string) => void} */
    this.giveUp = () => {};
    /** @type {any} */
    this.pingTimer = null; // the next ping is due
    /** @type {any} */
    this.pongTimer = null; // a ping waits for its answer
    /** @type {Map<string, any>} */
    this.rows = new Map();
    this.more = false;
    /** @type {ConnectionState} */
    this.state = 'disconnected';
    this.failures = 0;
    this.attempts = 0; // connection attempts started
    this.closing = false;
    /** @type {any} */
    this.ws = null;
    /** @type {any} */
    this.timer = null;
    /** @type {Map<string, Set<(event: any) => void>>} */
    this.listeners = new Map();
  }

  /** @param {'rows' | 'state'} type @param {(event: any) => void} listener */
  on(type, listener) {
    let set = this.listeners.get(type);
    if (set === undefined) this.listeners.set(type, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }

  #emit(type, event) {
    const set = this.listeners.get(type);
    if (set !== undefined) for (const listener of Array.from(set)) listener(event);
  }

  #setState(state, code = null, reason = '') {
    if (this.state === state) return;
    this.state = state;
    this.#emit('state', { type: 'state', state, code, reason });
  }

  /** Take one message from the hub (exposed for tests); returns the rows it changed. */
  receive(message) {
    if (!isObject(message)) throw new DecodeError('a summary message is not an object');
    if (message.type === 'error') {
      throw new ProtocolError(String(message.code), `summary: ${message.detail}`, true);
    }
    if (message.type !== 'summary' && message.type !== 'summary_diff') return [];
    if (!Array.isArray(message.rows)) throw new DecodeError('summary: rows is not a list');
    const snapshot = message.type === 'summary';
    if (snapshot) {
      this.rows.clear();
      this.more = message.more === true;
    } else if (typeof message.more === 'boolean') {
      this.more = message.more;
    }
    const rows = message.rows.filter((row) => isObject(row) && isText(row.id));
    for (const row of rows) this.rows.set(row.id, row);
    // Rows that left the window (SPEC §17): the hub sends none of them any more.
    const left = Array.isArray(message.left) ? message.left.filter(isText) : [];
    for (const id of left) this.rows.delete(id);
    this.#emit('rows', { type: 'rows', rows, left, snapshot });
    return rows;
  }

  /** Open the feed (and keep it open until `close()`). */
  async start() {
    if (this.closing || this.ws !== null) return;
    // As for a Replica, only the first attempt is `connecting`: a retry leaves `disconnected`
    // alone until the hub answers, so a dashboard does not flicker between the two.
    if (this.attempts++ === 0) this.#setState('connecting');
    let token = null;
    try {
      token = this.getToken !== null ? await this.getToken() : null;
    } catch {
      token = null;
    }
    if (this.closing || this.ws !== null) return; // closed (or started) while it waited
    const ws = new this.WebSocket(this.url, SUBPROTOCOL);
    this.ws = ws;
    let code = null;
    ws.onopen = () => {
      const features = this.keepalive === null ? [] : ['ping'];
      ws.send(JSON.stringify({ type: 'hello', token, ...this.#page(), features }));
    };
    ws.onmessage = (event) => {
      try {
        const message = JSON.parse(String(event.data));
        this.#heard(ws, message);
        this.receive(message);
        this.failures = 0;
        this.#setState('connected');
      } catch (error) {
        if (error instanceof ProtocolError && error.fromHub) code = error.reason;
        try {
          ws.close(4002, 'protocol error');
        } catch {
          // already closing
        }
      }
    };
    this.giveUp = whenEnded(ws, (closeCode, reason) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.#stopKeepalive();
      if (this.closing) return this.#setState('closed');
      const rule = retryRule(code, closeCode, this.getToken !== null, reason);
      if (rule === 'refused') return this.#setState('closed', code, reason);
      this.#setState('disconnected', code, reason);
      this.failures += 1;
      const delay =
        rule === 'at_once'
          ? 0
          : backoffDelay(this.failures, this.backoff, this.maxBackoff, this.random);
      this.timer = setTimeout(() => {
        this.timer = null;
        void this.start();
      }, delay);
    });
  }

  #page() {
    const page = { prefix: this.prefix, order: this.order, after: this.after, limit: this.limit };
    if (this.order !== 'id') delete page.after;
    return page;
  }

  /**
   * Show another window on the same socket (a `window` message; its snapshot replaces the
   * rows). Fields not given keep their value; a reconnect asks for the new window.
   * @param {{prefix?: string, order?: 'id' | 'updated', after?: string | null, limit?: number}} page
   */
  window(page) {
    if (page.prefix !== undefined) this.prefix = page.prefix;
    if (page.order !== undefined) this.order = page.order;
    if (page.after !== undefined) this.after = page.after;
    if (page.limit !== undefined) this.limit = page.limit;
    const ws = this.ws;
    if (ws !== null && ws.readyState === 1 && this.state === 'connected') {
      ws.send(JSON.stringify({ type: 'window', ...this.#page() }));
    }
  }

  /**
   * Keepalive, as a `Replica`'s: after a snapshot listing `ping`, ping every `keepalive / 2`;
   * anything the hub sends answers the ping in flight; one unanswered for `keepalive / 2`
   * gives the socket up at once (a frozen hub would not finish a closing handshake either),
   * through the socket's one end path, so the feed reads `disconnected` and retries.
   */
  #heard(ws, message) {
    if (this.keepalive === null || !isObject(message)) return;
    const features = message.type === 'summary' ? message.features : null;
    const offered = Array.isArray(features) && features.includes('ping');
    if (!offered && this.pongTimer === null && this.pingTimer === null) return;
    this.#stopKeepalive();
    const half = this.keepalive / 2;
    this.pingTimer = setTimeout(() => {
      this.pingTimer = null;
      if (this.ws !== ws || ws.readyState !== 1) return;
      ws.send('{"type":"ping"}');
      this.pongTimer = setTimeout(() => {
        this.pongTimer = null;
        if (this.ws !== ws) return;
        ws.onmessage = () => {};
        this.giveUp(`keepalive timed out: a ping went unanswered for ${half / 1000}s`);
      }, half);
    }, half);
  }

  #stopKeepalive() {
    if (this.pingTimer !== null) clearTimeout(this.pingTimer);
    if (this.pongTimer !== null) clearTimeout(this.pongTimer);
    this.pingTimer = null;
    this.pongTimer = null;
  }

  /** Stop for good. */
  close() {
    this.closing = true;
    this.#stopKeepalive();
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.ws !== null) this.ws.close(1000, '');
    else this.#setState('closed');
  }
}

// @ts-check
// The phases of a replica session, as one table (`client/session.py`).

/**
 * The phases of a replica session's connection, as one table (h11's `_state.py`; the same
 * names as `client/session.py`): what each phase accepts from the hub, and the phase each
 * event of the connection leads to. A hub message of a type the session knows that its phase
 * does not accept is refused `unexpected` before anything changes (the shell drops the
 * connection); a type it does not know is ignored in every phase (a newer hub's message).
 *
 *   connecting   a `hello` went (or is to go), no welcome yet: the hub says who we are, or why not
 *   catching_up  welcomed; the log's records or its state come until the revision of the welcome
 *   live         caught up: pushes go, the log's records and acks come
 *   closed       the connection ended (`disconnected`); the next `hello()` begins another
 *
 * A session starts `connecting`. `hello()` goes to `connecting` from any phase (it forgets
 * the connection before), `welcome` to `catching_up` (then at once to `live` when the session
 * holds the welcome's revision already), the end of the catch-up to `live`, `disconnected()`
 * to `closed`. Within `catching_up` and `live` a `state` may come in chunks (`entries` follow
 * it): that is the handler's, not a phase.
 */

/** @typedef {'connecting' | 'catching_up' | 'live' | 'closed'} Phase */

/** What a welcomed session takes: the log, answers to its pushes, drafts and presence. */
const WELCOMED = Object.freeze([
  'records',
  'state',
  'entries',
  'ack',
  'reject',
  'drafts',
  'draft',
  'draft_end',
  'presence',
  'presence_diff',
  'error',
]);

/**
 * What each phase accepts (the hub message types) and the phases it may go to.
 * @type {Readonly<Record<Phase, {accepts: readonly string[], next: readonly Phase[]}>>}
 */
export const PHASES = Object.freeze({
  connecting: Object.freeze({
    accepts: Object.freeze(['welcome', 'error']),
    next: Object.freeze(/** @type {Phase[]} */ (['connecting', 'catching_up', 'closed'])),
  }),
  catching_up: Object.freeze({
    accepts: WELCOMED,
    next: Object.freeze(/** @type {Phase[]} */ (['live', 'connecting', 'closed'])),
  }),
  live: Object.freeze({
    accepts: WELCOMED,
    next: Object.freeze(/** @type {Phase[]} */ (['connecting', 'closed'])),
  }),
  closed: Object.freeze({
    accepts: Object.freeze([]),
    next: Object.freeze(/** @type {Phase[]} */ (['connecting'])),
  }),
});

/** Every hub message type a session knows (the others are ignored in every phase). */
export const KNOWN = new Set(['welcome', ...WELCOMED]);

/** Why `phase` refuses a message of `type`, as the detail of `unexpected` (keeping the words
 * the session always used). */
const WHY = Object.freeze({
  welcome: 'a second welcome',
  entries: 'entries without a state',
});

/**
 * Why a session in `phase` refuses a hub message of `type`, or null when it takes it.
 * @param {Phase} phase @param {unknown} type @returns {string | null}
 */
export function refusal(phase, type) {
  if (typeof type !== 'string' || !KNOWN.has(type) || PHASES[phase].accepts.includes(type)) {
    return null;
  }
  if (phase === 'closed') return `${type} after the connection ended (hello() first)`;
  return Object.hasOwn(WHY, type) ? WHY[type] : `${type} before welcome`;
}

/**
 * `phase` → `next`, checked against the table (a step not in it is a bug of the session).
 * @param {Phase} phase @param {Phase} next @returns {Phase}
 */
export function step(phase, next) {
  if (phase !== next && !PHASES[phase].next.includes(next)) {
    throw new Error(`convsync: no step of a session from ${phase} to ${next}`);
  }
  return next;
}

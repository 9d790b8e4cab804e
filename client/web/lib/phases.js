// @ts-check
// The phases of a replica session, as one table (`client/phases.py`).
import { ProtocolError, UsageError } from './errors.js';

/**
 * The phases of a replica session, as one table (h11's `_state.py`; the names and the steps of
 * `client/phases.py`): what each phase accepts from the hub, and the phase each call or step
 * leads to. A hub message of a type the session knows that its phase does not accept is
 * refused before anything changes (`unexpected`: the shell drops the connection); a type it
 * does not know is ignored in every phase (a newer hub's message).
 *
 *     connecting --welcome--> catching_up --caught_up--> live
 *         ^                        |                      |
 *         +------ hello / disconnected -------------------+
 *     any phase --release--> closed (for good)
 *
 *   connecting   `hello()` sent (or not yet), waiting for the hub's `welcome`
 *   catching_up  welcomed; records (or a state) up to the welcome's revision are coming in;
 *                `caught_up` is the session's own step once it holds that revision (at once,
 *                from the welcome, when it holds it already)
 *   live         caught up: pushes go; the log's records, acks and rejects come
 *   closed       `release()`: the replica stopped for good; only `disconnected()` and
 *                `release()` again are taken, and a hub message is the caller's mistake
 *
 * A session starts `connecting`. Within `catching_up` and `live` a `state` may come in chunks
 * (`entries` follow it): that is the handler's check, not a phase.
 */

/** @typedef {'connecting' | 'catching_up' | 'live' | 'closed'} Phase */
/** @typedef {'hello' | 'disconnected' | 'release' | 'caught_up'} Step the calls, and the
 * session's own step */

/** What the hub sends only once it has welcomed the connection. */
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
]);

/** What the hub may send at any time on a connection (a refusal). */
const ANY_TIME = Object.freeze(['error']);

/**
 * For each phase, the hub messages it accepts and the phase each call or step leads to.
 * @typedef {Readonly<Partial<Record<Step | 'welcome', Phase>>>} Steps
 * @type {Readonly<Record<Phase, {accepts: readonly string[], steps: Steps}>>}
 */
export const PHASES = Object.freeze({
  connecting: Object.freeze({
    accepts: Object.freeze(['welcome', ...ANY_TIME]),
    steps: Object.freeze({
      welcome: 'catching_up',
      hello: 'connecting',
      disconnected: 'connecting',
      release: 'closed',
    }),
  }),
  catching_up: Object.freeze({
    accepts: Object.freeze([...WELCOMED, ...ANY_TIME]),
    steps: Object.freeze({
      caught_up: 'live',
      hello: 'connecting',
      disconnected: 'connecting',
      release: 'closed',
    }),
  }),
  live: Object.freeze({
    accepts: Object.freeze([...WELCOMED, ...ANY_TIME]),
    steps: Object.freeze({ hello: 'connecting', disconnected: 'connecting', release: 'closed' }),
  }),
  closed: Object.freeze({
    accepts: Object.freeze([]),
    steps: Object.freeze({ disconnected: 'closed', release: 'closed' }),
  }),
});

/** Every hub message type a session knows (the others are ignored in every phase). */
export const KNOWN = new Set(['welcome', ...WELCOMED, ...ANY_TIME]);

/** `PHASES[phase].accepts` as sets: `receive` looks one up per message. */
const ACCEPTS = Object.fromEntries(
  Object.entries(PHASES).map(([phase, row]) => [phase, new Set(row.accepts)]),
);

/** The detail of `unexpected` for a type a welcomed session refuses (the session's words). */
const WHY = Object.freeze({
  welcome: 'a second welcome',
  entries: 'entries without a state',
});

/**
 * What a session in `phase` throws for a hub message of `type`, or null when it takes it: the
 * hub broke the protocol (`ProtocolError` `unexpected`), or, `closed`, the caller fed a
 * session it released (`UsageError` `closed`).
 * @param {Phase} phase @param {unknown} type @returns {Error | null}
 */
export function refusal(phase, type) {
  if (ACCEPTS[phase].has(type) || typeof type !== 'string' || !KNOWN.has(type)) {
    return null;
  }
  if (phase === 'closed') return new UsageError('closed', `${type} for a released replica session`);
  if (phase === 'connecting' || !Object.hasOwn(WHY, type)) {
    return new ProtocolError('unexpected', `${type} before welcome`);
  }
  return new ProtocolError('unexpected', WHY[type]);
}

/**
 * The phase `step` leads to from `phase`; a step the table does not list is refused.
 * @param {Phase} phase @param {Step | 'welcome'} step @returns {Phase}
 */
export function next(phase, step) {
  const after = PHASES[phase].steps[step];
  if (after === undefined) {
    throw new UsageError('closed', `${step} while the replica session is ${phase}`);
  }
  return after;
}

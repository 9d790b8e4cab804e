// @ts-check
// The one reconnect loop of the socket shells, and their connection states.
import { Emitter } from './emitter.js';
import { UsageError, codeOfClose, retryOf } from './errors.js';

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
export function keepaliveOption(value) {
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

// ------------------------------------------------------------------ connection states

/**
 * The connection states of a socket shell and the changes each may make (centrifuge-js's
 * `disconnected` / `connecting` / `connected`, and `closed`). Every change is a `state` event
 * `{state, code, reason}`: `code` is the error code that caused it (null for none).
 * `connecting` is the first attempt only: a retry leaves `disconnected` alone until the hub
 * answers (a welcome or a snapshot) or refuses, so a page does not flicker. `closed` by
 * `close()` is final (no attempt begins again); a shell closed by a refusal may be started
 * again (the viewer does, for another window), and its attempt connects or fails from there.
 * @type {Readonly<Record<ConnectionState, readonly ConnectionState[]>>}
 */
export const CONNECTION = Object.freeze({
  disconnected: Object.freeze(/** @type {const} */ (['connecting', 'connected', 'closed'])),
  connecting: Object.freeze(/** @type {const} */ (['connected', 'disconnected', 'closed'])),
  connected: Object.freeze(/** @type {const} */ (['disconnected', 'closed'])),
  closed: Object.freeze(/** @type {const} */ (['connected', 'disconnected'])),
});

/**
 * @typedef {'connecting' | 'connected' | 'disconnected' | 'closed'} ConnectionState
 * `connecting` until the first welcome; `connected`; `disconnected` once a connection is lost
 * or an attempt failed, for as long as the shell retries (failed attempts change nothing:
 * one `state` event per change); `closed` after `close()` or a refusal.
 */

/**
 * The one reconnect loop of the socket shells (`Replica`, `SummaryFeed`): the connection
 * state (changed only along `CONNECTION`, each change a `state` event on `emitter`), the
 * count of failures in a row, and the timer of the next attempt, after capped exponential
 * backoff with full jitter, or at once when the ending code says so (SPEC §5). The shell
 * opens sockets; this says when, and what the state is.
 */
export class Reconnect {
  /** @type {ConnectionState} */
  state = 'disconnected';
  failures = 0; // attempts failed since the last connection
  attempts = 0; // attempts begun
  /** @type {any} the timer of the next attempt */
  timer = null;

  /**
   * @param {import('./emitter.js').Emitter} emitter where `state` events go
   * @param {() => void} attempt begins the next attempt (the shell's `start`)
   * @param {{backoff?: number, maxBackoff?: number, random?: () => number,
   *   setTimeout?: (fn: () => void, ms: number) => any, clearTimeout?: (handle: any) => void,
   *   changed?: () => void}} [options] `changed`: called after each change of state
   */
  constructor(emitter, attempt, options = {}) {
    this.emitter = emitter;
    this.attempt = attempt;
    this.backoff = options.backoff ?? 50;
    this.maxBackoff = options.maxBackoff ?? 5000;
    this.random = options.random ?? Math.random;
    this.setTimer = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this.clearTimer = options.clearTimeout ?? ((handle) => clearTimeout(handle));
    this.changed = options.changed ?? (() => {});
  }

  /**
   * Move to `state` (nothing when it is the state already), with the code that caused it.
   * @param {ConnectionState} state @param {string | null} [code] @param {string} [reason]
   */
  set(state, code = null, reason = '') {
    if (this.state === state) return;
    if (!CONNECTION[this.state].includes(state)) {
      throw new Error(`convsync: no change of connection state from ${this.state} to ${state}`);
    }
    this.state = state;
    this.emitter.emit('state', { type: 'state', state, code, reason });
    this.changed();
  }

  /** An attempt begins: the first one is `connecting`. */
  begin() {
    if (this.attempts++ === 0) this.set('connecting');
  }

  /** The hub answered: `connected`, and the failures start again from none. */
  connected() {
    this.failures = 0;
    this.set('connected');
  }

  /**
   * A connection or an attempt ended, not by `close()`: what `retryRule` says of it. For
   * `refused` nothing is done (the shell closes, with its own code); else the state is
   * `disconnected` and the next attempt is timed.
   * @param {string | null} code the error code the hub sent (null: none came)
   * @param {number | null} closeCode @param {string} reason the socket's close
   * @param {boolean} canRefreshToken @returns {'refused' | 'at_once' | 'backoff'}
   */
  ended(code, closeCode, reason, canRefreshToken) {
    const rule = retryRule(code, closeCode, canRefreshToken, reason);
    if (rule === 'refused') return rule;
    this.set('disconnected', code, reason);
    this.failures += 1;
    const delay =
      rule === 'at_once'
        ? 0
        : backoffDelay(this.failures, this.backoff, this.maxBackoff, this.random);
    this.timer = this.setTimer(() => {
      this.timer = null;
      this.attempt();
    }, delay);
    return rule;
  }

  /** No next attempt (the shell is closing). */
  cancel() {
    if (this.timer !== null) this.clearTimer(this.timer);
    this.timer = null;
  }
}

/**
 * What every socket shell (`Replica`, `SummaryFeed`) has: its emitter, its reconnect loop,
 * `state`, `failures` and `on`. `start()` is each shell's own: the loop calls it for every
 * attempt after the first.
 */
export class Shell {
  /**
   * @param {Iterable<string> | null} notWild the types `*` does not hear (null: no `*`)
   * @param {ConstructorParameters<typeof Reconnect>[2]} options
   */
  constructor(notWild, options) {
    this.emitter = new Emitter(notWild);
    /** The connection state and the timing of the next attempt. */
    this.reconnect = new Reconnect(this.emitter, () => void this.start(), options);
  }

  /** @type {ConnectionState} see `CONNECTION` */
  get state() {
    return this.reconnect.state;
  }

  /** Set by hand (a test standing in for a socket's answer): no `state` event. */
  set state(state) {
    this.reconnect.state = state;
  }

  /** Attempts failed since the hub last answered. */
  get failures() {
    return this.reconnect.failures;
  }

  /**
   * Listen to events of `type`; returns the function that stops listening.
   * @param {string} type @param {(event: any) => void} listener
   */
  on(type, listener) {
    return this.emitter.on(type, listener);
  }

  /** Open a connection (each shell's own). */
  async start() {}
}

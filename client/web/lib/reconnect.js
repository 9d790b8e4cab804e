// @ts-check
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

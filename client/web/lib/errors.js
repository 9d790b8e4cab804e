// @ts-check
// The errors, and the one table of error codes (`sync/errors.py`).

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

// @ts-check
// Message and aside ids (UUIDv7), and lineages: the twin of `sync/ids.py`.

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

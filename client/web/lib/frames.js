// @ts-check
// What a frame holds and how large it may be (`sync/frames.py`, `sync/protocol.py`).
import { DecodeError } from './errors.js';

export const SUBPROTOCOL = 'convsync.v1';

/** The default frame limit in bytes (Python's `sync.frames.MAX_FRAME`): 16 MiB, so one record
 * may carry a screenshot of a few MiB as base64. */
export const MAX_FRAME = 16 << 20;

/** The bytes a push of several records is filled to (`FRAME_FILL`); a larger record goes alone,
 * up to the frame limit. */
export const FRAME_FILL = 1 << 20;

/** Bytes of a `push` frame around its records (`PUSH_OVERHEAD`). */
export const PUSH_OVERHEAD = 128;

/** The feature a session lists: it takes a placed push's records as its batch (SPEC 2.4.6). */
export const HUB_REBASE = 'hub_rebase';
export const DRAFTS = 'drafts';
export const PRESENCE = 'presence';

// ------------------------------------------------------------------ the replica session

/** `n` with thousands separated by commas, as Python's `f"{n:,}"`. @param {number} n */
export function grouped(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** @param {string} text */
export function utf8Length(text) {
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
export function needInts(message, fields) {
  for (const field of fields) {
    if (!Number.isInteger(message[field])) {
      throw new DecodeError(`${message.type}: ${field} is not an integer`);
    }
  }
}

// @ts-check
// The log as a session saw it (`LogView`), and the folds of the hub's records.
import { Conversation } from './conversation.js';
import { ConvsyncError, ProtocolError } from './errors.js';

/** @typedef {import('./conversation.js').ChangeRecord} ChangeRecord */

/**
 * The log as a session last saw it (`client/session.py`'s `LogView`): its value at the last
 * revision folded (`value`, the session's `confirmed`), and the records past it held back
 * (`held`: they overtook the batch in flight and wait for its ack or reject to say where
 * they go). The log's revision counts both. Every fold of the hub's records into the value
 * goes through here, and a record that does not fit is the hub's fault (`diverged`).
 */
export class LogView {
  /** @type {ChangeRecord[]} */
  held = [];

  /** @param {Conversation} [value] */
  constructor(value = new Conversation()) {
    this.value = value;
  }

  /** The log's revision as seen: the value's, and the records held past it. */
  get revision() {
    return this.value.revision + this.held.length;
  }

  /** Fold `records` (the log's, next after the value) into the value.
   * @param {ChangeRecord[]} records */
  fold(records) {
    foldAll(this.value, records);
  }

  /** Hold `records` (the log's, next after those held) back. @param {ChangeRecord[]} records */
  hold(records) {
    this.held = this.held.concat(records);
  }

  /** Fold the held records into the value; how many there were. */
  foldHeld() {
    const held = this.held;
    this.held = [];
    if (held.length > 0) foldAll(this.value, held);
    return held.length;
  }

  /** Forget the held records (a new connection's catch-up, or a state, brings them). */
  dropHeld() {
    this.held = [];
  }

  /** The log is `value` now (a state replaced it); nothing is held. @param {Conversation} value */
  replace(value) {
    this.value = value;
    this.held = [];
  }
}

/** @param {Conversation} conversation @param {ChangeRecord[]} records */
export function foldAll(conversation, records) {
  try {
    for (const record of records) conversation.apply(record);
  } catch (error) {
    if (!(error instanceof ConvsyncError)) throw error;
    throw new ProtocolError('diverged', `a record from the hub does not fit: ${error.message}`);
  }
}

/** `base` with `records` applied, or null when they do not fit. */
export function folded(base, records) {
  try {
    for (const record of records) base.apply(record);
  } catch (error) {
    if (error instanceof ConvsyncError) return null;
    throw error;
  }
  return base;
}

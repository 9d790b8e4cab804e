// @ts-check
// The one emitter of the socket shells.

/**
 * The one emitter of the socket shells (`Replica`, `SummaryFeed`), in the shape of nanoevents'
 * `index.js`: `on(type, listener)` returns the function that stops listening; `emit` calls the
 * listeners of a type in the order they came, on a copy (a listener may stop listening).
 *
 * `*` is a wildcard only when the emitter is made with the types it leaves out (a Replica's
 * `*` hears every session event, not `state` nor `refused`); a feed's emitter has none.
 */
export class Emitter {
  /** @type {Map<string, Set<(event: any) => void>>} */
  listeners = new Map();

  /** @param {Iterable<string> | null} [notWild] the types `*` does not hear; null: no `*` */
  constructor(notWild = null) {
    /** @type {Set<string> | null} */
    this.notWild = notWild === null ? null : new Set(notWild);
  }

  /** @param {string} type @param {(event: any) => void} listener @returns {() => void} */
  on(type, listener) {
    let set = this.listeners.get(type);
    if (set === undefined) this.listeners.set(type, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }

  /** @param {string} type @param {any} event */
  emit(type, event) {
    this.#call(type, event);
    if (this.notWild !== null && !this.notWild.has(type)) this.#call('*', event);
  }

  /** @param {string} key @param {any} event */
  #call(key, event) {
    const set = this.listeners.get(key);
    if (set !== undefined) for (const listener of Array.from(set)) listener(event);
  }
}

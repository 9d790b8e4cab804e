// @ts-check
// The summary feed of `/v1/summary` (SPEC §8, §17): `SummaryFeed`.
import { DecodeError, ProtocolError } from './errors.js';
import { SUBPROTOCOL } from './frames.js';
import { isText } from './live.js';
import { Shell, keepaliveOption, whenEnded } from './reconnect.js';
import { isObject } from './records.js';

/**
 * The rows of `/v1/summary`: every conversation under `prefix` with its revision, last
 * message and who is online, kept up to date. It reconnects with backoff like a `Replica`;
 * each (re)connection's snapshot replaces the rows, so nothing is missed across a gap.
 * Events: `rows` (`{type, rows: Row[], snapshot: boolean}`: the rows that changed) and
 * `state` (as a `Replica`'s).
 */
export class SummaryFeed extends Shell {
  /**
   * @param {string} url the hub's base url (`ws://host:port`)
   * @param {{prefix?: string, after?: string | null, limit?: number, getToken?: () => string | null | Promise<string | null>,
   *   WebSocket?: any, backoff?: number, maxBackoff?: number, random?: () => number}} [options]
   */
  constructor(url, options = {}) {
    // `rows` and `state` events (no `*`); reconnects as a `Replica`'s.
    const { backoff, maxBackoff, random } = options;
    super(null, { backoff, maxBackoff, random });
    this.url = `${url.replace(/\/+$/, '')}/v1/summary`;
    this.prefix = options.prefix ?? '';
    /** `id` (pages by `after`) or `updated` (the latest `limit` rows). */
    this.order = options.order ?? 'id';
    this.after = options.after ?? null;
    this.limit = options.limit ?? 100;
    this.getToken = options.getToken ?? null;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
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
    this.closing = false;
    /** @type {any} */
    this.ws = null;
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
    this.emitter.emit('rows', { type: 'rows', rows, left, snapshot });
    return rows;
  }

  /** Open the feed (and keep it open until `close()`). */
  async start() {
    if (this.closing || this.ws !== null) return;
    this.reconnect.begin(); // the first attempt only is `connecting` (see `CONNECTION`)
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
        this.reconnect.connected();
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
      if (this.closing) return this.reconnect.set('closed');
      const rule = this.reconnect.ended(code, closeCode, reason, this.getToken !== null);
      if (rule === 'refused') this.reconnect.set('closed', code, reason);
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
    this.reconnect.cancel();
    if (this.ws !== null) this.ws.close(1000, '');
    else this.reconnect.set('closed');
  }
}

// @ts-check
// One socket per browser (SPEC §14, `{shared: true}`): the tabs of an origin share one hub
// socket (`server/mux.py`); each tab's replica is a session of its own over a channel of it.
import { UsageError } from './errors.js';
import { Lineage } from './ids.js';
import { holdLock, locksOf } from './persist.js';

/**
 * How this works. Every tab that opens a replica with `shared: true` on hub `base` joins the
 * *link* of that hub: a BroadcastChannel named after it, and a queue for the Web Lock of the
 * same name. The tab holding the lock is the leader: it alone opens a websocket, to
 * `base/v1/mux`, when the first channel opens, and closes it when the last one closed. Every
 * tab (the leader too) gives its replicas a `ChannelSocket` in place of a WebSocket; each
 * opens a channel through the leader, which relays its frames both ways (`o<n>`, `m<n>`,
 * `c<n>` on the hub's socket, `server/mux.py`).
 *
 * So each tab's replica keeps its own client id, seq, token and outbox, and the hub checks
 * each session as it checks one on a socket of its own: a read-only tab never writes through
 * another tab's token (tokens go in each session's hello, never on the shared socket).
 *
 * Hand-over: when the leader's tab closes, its lock goes to the next tab waiting, which
 * announces itself; every tab then ends the channels it had (as a socket ends, code 1006), and
 * each replica reconnects, through the new leader, and sends again what was not acknowledged,
 * as after any dropped connection. Nothing is lost: the pending edits are in each tab's own
 * replica (and outbox). A tab that vanishes without a word (killed) holds a lock of its own
 * the leader waits on: when it is released the leader closes that tab's channels at the hub.
 * A channel not open within `OPEN_WAIT` ms (no leader answered) ends and is retried.
 */

/** ms a channel waits for the leader to open it before it ends (and its replica retries). */
export const OPEN_WAIT = 5000;

/** @type {Map<string, Link>} the links of this tab, by hub */
const links = new Map();

/**
 * The WebSocket class a replica on hub `base` uses with `shared: true`.
 * @param {string} base the hub's base url (`ws://host:port`)
 * @param {{BroadcastChannel?: any, locks?: any, WebSocket?: any, tab?: string}} [options]
 * `tab` (tests): replicas given different names act as different tabs of one realm.
 */
export function sharedSocket(base, options = {}) {
  const linkOf = sharedLink(base, options);
  return class extends ChannelSocket {
    /** @param {string} url @param {string} [protocol] */
    constructor(url, protocol) {
      super(linkOf, url, protocol);
    }
  };
}

/**
 * This tab's link to hub `base` (made at the first use): `close()` it to act as a tab that
 * closes (tests; a browser lets go of its locks by itself).
 * @param {string} base @param {{BroadcastChannel?: any, locks?: any, WebSocket?: any, tab?: string}} [options]
 */
export function sharedLink(base, options = {}) {
  const Channel = options.BroadcastChannel ?? globalThis.BroadcastChannel;
  if (typeof Channel !== 'function') {
    throw new UsageError('no_broadcast_channel', 'shared: true needs BroadcastChannel');
  }
  const WebSocket = options.WebSocket ?? globalThis.WebSocket;
  const locks = locksOf(options.locks);
  const key = options.tab === undefined ? base : `${base} ${options.tab}`;
  let link = links.get(key);
  if (link === undefined || link.closed) {
    link = new Link(base, Channel, locks, WebSocket, key);
    links.set(key, link);
  }
  return link;
}

/**
 * This tab's part in the sharing of hub `base`: its channels, and, while it leads, the hub's
 * socket and the channels of every tab.
 */
class Link {
  /**
   * @param {string} base @param {any} Channel @param {any} locks @param {any} WebSocket
   * @param {string} key its key in `links`
   */
  constructor(base, Channel, locks, WebSocket, key) {
    this.base = base.replace(/\/+$/, '');
    this.key = key;
    this.tab = Lineage.fresh().toString(16); // random, as a replica's client id
    this.locks = locks;
    this.WebSocket = WebSocket;
    this.closed = false;
    this.bus = new Channel(`convsync-shared:${this.base}`);
    this.bus.onmessage = (/** @type {any} */ event) => this.#heard(event.data);
    /** @type {Map<number, ChannelSocket>} this tab's channels by number */
    this.mine = new Map();
    this.next = 1;
    /** Whether this tab leads (holds the lock). */
    this.leading = false;
    /** @type {Leader | null} */
    this.leader = null;
    /** The leader this tab last heard of (its tab id). @type {string | null} */
    this.leaderTab = null;
    /** Lets go of the leader's lock (or stops waiting for it). */
    this.resign = () => {};
    // This tab's own lock, held while it lives: a leader waits on it to learn it is gone.
    // Its name is this tab's alone, so it is free; no channel is asked for before it is held.
    this.ownLock = holdLock(locks, `convsync-tab:${this.tab}`, OPEN_WAIT);
    this.#campaign();
    this.#post({ t: 'who' }); // a leader, if there is one, says so
  }

  /** Wait for the leader's lock; hold it (lead) until this tab goes. */
  #campaign() {
    const abort = new AbortController();
    const held = new Promise((resolve) => {
      this.resign = () => {
        abort.abort();
        resolve(undefined);
      };
    });
    this.locks
      .request(`convsync-shared:${this.base}`, { mode: 'exclusive', signal: abort.signal }, () => {
        if (this.closed) return undefined;
        this.leading = true;
        this.leader = new Leader(this);
        this.#post({ t: 'leader', tab: this.tab });
        this.#newLeader(this.tab);
        return held; // until the tab goes (`close`)
      })
      .catch(() => {});
  }

  /**
   * This tab goes (as when it closes): its channels end, the hub's socket it led closes, and
   * its locks go, so the next tab leads. The browser does this by itself when a tab closes.
   */
  close() {
    if (this.closed) return;
    for (const channel of [...this.mine.values()]) channel.close(1001, 'going away');
    this.leader?.stop();
    this.closed = true;
    this.leading = false;
    this.leader = null;
    this.resign();
    this.ownLock.then((release) => release?.());
    this.bus.close();
    if (links.get(this.key) === this) links.delete(this.key);
  }

  /** @param {any} message */
  #heard(message) {
    if (message === null || typeof message !== 'object') return;
    if (message.t === 'leader') {
      this.#newLeader(message.tab);
      return;
    }
    if (message.t === 'who') {
      if (this.leading) this.#post({ t: 'leader', tab: this.tab });
      return;
    }
    if (message.to === 'leader') {
      this.leader?.heard(message);
      return;
    }
    if (message.to !== this.tab) return;
    this.deliver(message);
  }

  /** A message from the leader for one of this tab's channels. @param {any} message */
  deliver(message) {
    const channel = this.mine.get(message.ch);
    if (channel === undefined) return;
    if (message.t === 'opened') channel.opened();
    else if (message.t === 'msg') channel.received(message.data);
    else if (message.t === 'closed') channel.ended(message.code, message.reason, true);
  }

  /** Another (or this) tab leads now: the channels through the one before end. @param {string} tab */
  #newLeader(tab) {
    if (this.leaderTab === tab) return;
    const had = this.leaderTab !== null;
    this.leaderTab = tab;
    if (!had) {
      // The first word of a leader: channels waiting for one go to it now.
      for (const channel of this.mine.values()) if (channel.readyState === 0) channel.ask();
      return;
    }
    for (const channel of [...this.mine.values()]) channel.ended(1006, 'the shared socket moved');
  }

  /** Send `message` to the leader (itself, when this tab leads). @param {any} message */
  toLeader(message) {
    const full = { ...message, to: 'leader', from: this.tab };
    if (this.leading) queueMicrotask(() => this.leader?.heard(full));
    else this.#post(full);
  }

  /** Send `message` to tab `tab` (itself too). @param {string} tab @param {any} message */
  toTab(tab, message) {
    const full = { ...message, to: tab };
    if (tab === this.tab) queueMicrotask(() => this.deliver(full));
    else this.#post(full);
  }

  /** @param {any} message */
  #post(message) {
    if (!this.closed) this.bus.postMessage(message);
  }

  /** @param {ChannelSocket} channel */
  add(channel) {
    const number = this.next++;
    this.mine.set(number, channel);
    return number;
  }

  /** @param {number} number */
  drop(number) {
    this.mine.delete(number);
  }
}

/**
 * The leading tab's relay: the hub's socket (`/v1/mux`) and every tab's channels over it.
 */
class Leader {
  /** @param {Link} link */
  constructor(link) {
    this.link = link;
    /** @type {any} */
    this.ws = null;
    this.open = false;
    this.next = 1; // channel numbers on the hub's socket, never used twice on one socket
    /** @type {Map<number, {tab: string, ch: number}>} hub channel → the tab's */
    this.routes = new Map();
    /** @type {Map<string, number>} `${tab} ${ch}` → hub channel */
    this.numbers = new Map();
    /** @type {string[]} frames waiting for the socket to open */
    this.waiting = [];
    /** @type {Set<string>} the tabs whose end is watched */
    this.watched = new Set();
  }

  /** This tab stops leading: the hub's socket closes (the hub ends its channels). */
  stop() {
    const ws = this.ws;
    this.ws = null;
    this.open = false;
    this.routes.clear();
    this.numbers.clear();
    if (ws === null) return;
    try {
      ws.close(1000, 'going away'); // (a page may not send 1001)
    } catch {
      // not open yet
    }
  }

  /** @param {any} message from a tab */
  heard(message) {
    const key = `${message.from} ${message.ch}`;
    if (message.t === 'open') {
      if (this.numbers.has(key)) return;
      const number = this.next++;
      this.routes.set(number, { tab: message.from, ch: message.ch });
      this.numbers.set(key, number);
      this.#watch(message.from);
      this.#send(`o${number} ${message.path}`);
      if (this.open) this.link.toTab(message.from, { t: 'opened', ch: message.ch });
      return;
    }
    const number = this.numbers.get(key);
    if (number === undefined) return;
    if (message.t === 'send') this.#send(`m${number} ${message.data}`);
    else if (message.t === 'close') {
      this.#forget(number);
      this.#send(`c${number} ${message.code ?? 1000} ${message.reason ?? ''}`);
      this.#idle();
    }
  }

  /** Close that tab's channels at the hub once its lock is free (it is gone). @param {string} tab */
  #watch(tab) {
    if (tab === this.link.tab || this.watched.has(tab)) return;
    this.watched.add(tab);
    this.link.locks
      .request(`convsync-tab:${tab}`, { mode: 'exclusive' }, () => {
        this.watched.delete(tab);
        for (const [number, route] of [...this.routes]) {
          if (route.tab !== tab) continue;
          this.#forget(number);
          this.#send(`c${number} 1001 gone`);
          // Told too, should it live after all (a lock let go early): it retries.
          this.link.toTab(tab, { t: 'closed', ch: route.ch, code: 1006, reason: 'gone' });
        }
        this.#idle();
      })
      .catch(() => {});
  }

  /** @param {string} frame */
  #send(frame) {
    if (this.ws === null) this.#connect();
    if (this.open) this.ws.send(frame);
    else this.waiting.push(frame);
  }

  #connect() {
    const ws = new this.link.WebSocket(`${this.link.base}/v1/mux`, 'convsync.v1');
    this.ws = ws;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      this.open = true;
      for (const frame of this.waiting.splice(0)) ws.send(frame);
      for (const route of this.routes.values()) {
        this.link.toTab(route.tab, { t: 'opened', ch: route.ch });
      }
    };
    ws.onmessage = (/** @type {any} */ event) => {
      if (this.ws !== ws) return;
      const text = typeof event.data === 'string' ? event.data : String(event.data);
      const space = text.indexOf(' ');
      const number = Number(text.slice(1, space));
      const route = this.routes.get(number);
      if (route === undefined) return;
      if (text[0] === 'm') {
        this.link.toTab(route.tab, { t: 'msg', ch: route.ch, data: text.slice(space + 1) });
      } else if (text[0] === 'c') {
        const rest = text.slice(space + 1);
        const gap = rest.indexOf(' ');
        const code = Number(gap < 0 ? rest : rest.slice(0, gap));
        const reason = gap < 0 ? '' : rest.slice(gap + 1);
        this.#forget(number);
        this.link.toTab(route.tab, { t: 'closed', ch: route.ch, code, reason });
        this.#idle();
      }
    };
    const ended = (/** @type {any} */ event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.open = false;
      this.waiting = [];
      const code = event?.code ?? 1006;
      for (const [number, route] of [...this.routes]) {
        this.#forget(number);
        this.link.toTab(route.tab, { t: 'closed', ch: route.ch, code, reason: event?.reason ?? '' });
      }
    };
    ws.onclose = ended;
    ws.onerror = () => {
      ended({ code: 1006, reason: 'the shared socket failed' });
      try {
        ws.close();
      } catch {
        // not open yet
      }
    };
  }

  /** @param {number} number */
  #forget(number) {
    const route = this.routes.get(number);
    if (route === undefined) return;
    this.routes.delete(number);
    this.numbers.delete(`${route.tab} ${route.ch}`);
  }

  /** No channel is left: the hub's socket goes. */
  #idle() {
    if (this.routes.size > 0 || this.ws === null) return;
    const ws = this.ws;
    this.ws = null;
    this.open = false;
    this.waiting = []; // not for the next socket
    try {
      ws.close(1000, '');
    } catch {
      // closing already
    }
  }
}

/**
 * A WebSocket, as far as a replica uses one (`readyState`, `send`, `close`, `onopen`,
 * `onmessage`, `onclose`, `onerror`), that is one channel of the shared socket.
 */
class ChannelSocket {
  /** @param {Link} link @param {string} url @param {string} [_protocol] */
  constructor(link, url, _protocol) {
    this.link = link;
    const parsed = new URL(url);
    this.path = parsed.pathname + parsed.search;
    this.url = url;
    this.readyState = 0;
    /** @type {((event: any) => void) | null} */ this.onopen = null;
    /** @type {((event: any) => void) | null} */ this.onmessage = null;
    /** @type {((event: any) => void) | null} */ this.onclose = null;
    /** @type {((event: any) => void) | null} */ this.onerror = null;
    this.number = link.add(this);
    /** @type {any} */
    this.timer = setTimeout(() => this.ended(1006, 'no shared socket answered'), OPEN_WAIT);
    if (link.leaderTab !== null) this.ask();
  }

  /**
   * Ask the leader to open this channel, once this tab holds its own lock: the leader waits
   * on that lock from this tab's first channel on, to learn the tab is gone, and a wait that
   * came before this tab's own hold would be granted at once (the tab taken for gone).
   */
  ask() {
    this.link.ownLock.then(() => {
      if (this.readyState === 0) this.link.toLeader({ t: 'open', ch: this.number, path: this.path });
    });
  }

  opened() {
    if (this.readyState !== 0) return;
    clearTimeout(this.timer);
    this.readyState = 1;
    this.onopen?.({ type: 'open' });
  }

  /** @param {string} data */
  received(data) {
    if (this.readyState === 1) this.onmessage?.({ type: 'message', data });
  }

  /** @param {string} data */
  send(data) {
    if (this.readyState !== 1) throw new Error('the channel is not open');
    this.link.toLeader({ t: 'send', ch: this.number, data });
  }

  /** @param {number} [code] @param {string} [reason] */
  close(code = 1000, reason = '') {
    this.ended(code, reason);
  }

  /**
   * The channel is closed: by this tab, by the hub (`told`: the leader says so), or because
   * the shared socket moved or no leader opened it. Unless told, the leader is asked to close
   * it at the hub, should it have opened it there.
   * @param {number} [code] @param {string} [reason] @param {boolean} [told]
   */
  ended(code = 1006, reason = '', told = false) {
    if (this.readyState === 3) return;
    if (!told) this.link.toLeader({ t: 'close', ch: this.number, code, reason });
    clearTimeout(this.timer);
    this.readyState = 3;
    this.link.drop(this.number);
    this.onclose?.({ type: 'close', code, reason, wasClean: code !== 1006 });
  }
}

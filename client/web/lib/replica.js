// @ts-check
// The socket shell of a replica: `Replica` and `connect` (`client/replica.py`).
import { approvals, ask, decide, findApproval, resultOf } from './approvals.js';
import { monotonicMs } from './budget.js';
import { ConvsyncError, ProtocolError, Refused, UsageError, codeOfClose } from './errors.js';
import { SUBPROTOCOL } from './frames.js';
import { Lineage } from './ids.js';
import { openKeeper, persistOption } from './persist.js';
import { Shell, keepaliveOption, whenEnded } from './reconnect.js';
import { isObject } from './records.js';
import { ReplicaSession } from './session.js';
import { sharedSocket } from './shared.js';

/** The longest delay a timer takes (2^31 - 1 ms, 24.8 days); a longer one fires at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * @typedef {import('./conversation.js').Conversation} Conversation
 * @typedef {{client?: string, getToken?: () => (string | null | Promise<string | null>),
 *   conversation?: Conversation, WebSocket?: any, maxFrame?: number, backoff?: number,
 *   maxBackoff?: number, random?: () => number, setTimeout?: (fn: () => void, ms: number) => any,
 *   clearTimeout?: (handle: any) => void, live?: boolean, keepalive?: number | null,
 *   persist?: 'indexeddb', outbox?: string, indexedDB?: any, locks?: any, lockWait?: number,
 *   early?: import('./early.js').Early, shared?: boolean, BroadcastChannel?: any, tab?: string
 * }} ConnectOptions
 * `shared: true`: the tabs of this origin share one socket to the hub (`lib/shared.js`);
 * this replica is a session of its own over a channel of it (`BroadcastChannel`, `locks`:
 * for a realm without them; `tab`, tests: replicas named apart act as different tabs).
 * `early`: the socket `openEarly` (`lib/early.js`) opened for this replica before its modules
 * loaded, with the same `client`: the first connection uses it and what it received.
 * `persist: 'indexeddb'`: keep the confirmed value, the pending edits and the batch in flight
 * with its seq in IndexedDB (`lib/persist.js`), in the outbox `outbox` (default: named after
 * the url); a reload resumes them, and `loaded` resolves once they are in `conversation`.
 * `keepalive` (ms, default 10000; null: none): a hub that stops answering is noticed within it.
 * A browser cannot send websocket pings, so the replica sends `ping` messages (to a hub whose
 * welcome lists the `ping` feature) every `keepalive / 2` and gives the socket up when nothing
 * comes back within `keepalive / 2`.
 */

/**
 * A live replica of one conversation over a websocket: the application edits `conversation`,
 * the replica pushes, applies, rebases and reconnects by itself.
 */
export class Replica extends Shell {
  /**
   * @param {string} url the hub's base url (`ws://host:port`)
   * @param {string} conversationId
   * @param {ConnectOptions} [options]
   */
  constructor(url, conversationId, options = {}) {
    const setTimer = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    const clearTimer = options.clearTimeout ?? ((handle) => clearTimeout(handle));
    // Session events, `state`, `refused` and `edited`; `*` hears the session events.
    super(['state', 'refused', 'edited'], {
      backoff: options.backoff,
      maxBackoff: options.maxBackoff,
      random: options.random,
      setTimeout: setTimer,
      clearTimeout: clearTimer,
      changed: () => this.#progressed(),
    });
    this.url = `${url.replace(/\/+$/, '')}/v1/conversations/${encodeURIComponent(conversationId)}`;
    this.conversationId = conversationId;
    const client = options.client ?? `web-${Lineage.fresh().toString(16)}`;
    this.session = new ReplicaSession(client, {
      local: options.conversation,
      maxFrame: options.maxFrame,
      live: options.live,
    });
    /** The IndexedDB outbox's keeper, once taken (`persist`); null without. */
    /** @type {import('./persist.js').Keeper | null} */
    this.keeper = null;
    const persist = persistOption(options);
    /** Resolves once the kept value (or none) is in `conversation`: at once without `persist`. */
    this.loaded =
      persist === null ? Promise.resolve(this) : this.#load(persist, options.client ?? null);
    this.loaded.catch(() => {}); // `ready` rejects with the same error
    this.getToken = options.getToken ?? null;
    /** The socket `openEarly` opened for the first connection (`options.early`), until used. */
    /** @type {import('./early.js').Early | null} */
    this.early = options.early ?? null;
    /** @type {string | null} */ this.lastToken = null; // sent in the last attempt
    /** @type {string | null} */ this.refusedToken = null; // the hub said `unauthorized` to it
    if (options.shared !== undefined && typeof options.shared !== 'boolean') {
      throw new UsageError('bad_option', `shared must be true or false (got ${options.shared})`);
    }
    const WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof WebSocket !== 'function') {
      throw new UsageError('no_websocket', 'no WebSocket here: pass options.WebSocket');
    }
    // `shared`: a channel of the one socket the tabs of this origin share (`lib/shared.js`).
    this.WebSocket = options.shared
      ? sharedSocket(url.replace(/\/+$/, ''), {
          WebSocket,
          BroadcastChannel: options.BroadcastChannel,
          locks: options.locks,
          tab: options.tab,
        })
      : WebSocket;
    this.setTimer = setTimer;
    /** @type {any} */
    this.paceTimer = null;
    this.clearTimer = clearTimer;
    this.keepalive = keepaliveOption(options.keepalive);
    if (options.presence !== undefined && typeof options.presence !== 'boolean') {
      throw new UsageError('bad_option', `presence must be true or false (got ${options.presence})`);
    }
    /** Watching without presence (`presence: false`): counted by the hub, shown nowhere. */
    this.watch = options.presence === false;
    this.pingTimer = null; // the next ping is due
    this.pongTimer = null; // a ping waits for its answer
    /** @type {Refused | null} */
    this.refused = null;
    /** Why the last connection or attempt ended; null while connected. @type {string | null} */
    this.failure = null;
    this.attempting = false; // a connection is being made or is up
    this.connects = 0;
    /** @type {any} */
    this.ws = null;
    this.refreshTimer = null;
    this.closing = false;
    /** @type {Set<() => void>} called after every message handled and every state change */
    this.progress = new Set();
    this.#watchLocal();
    /** Resolves once the first catch-up is done; rejects with `Refused` if refused first. */
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => {}); // an application that never awaits it is not an error
  }

  /** The local value: edit it; it holds your pending edits. */
  get conversation() {
    return this.session.local;
  }

  get client() {
    return this.session.client;
  }

  /** Edits made here that the hub has not acknowledged yet. */
  get pending() {
    return this.session.pending;
  }

  /** The log's revision as last seen. */
  get revision() {
    return this.session.confirmed.revision;
  }

  /** Open drafts by id, as they stream (with `live: true`). */
  get drafts() {
    return this.session.drafts;
  }

  /** This connection's principal as `welcome` said (`anonymous` without auth). */
  get sub() {
    return this.session.lastWelcome?.sub ?? 'anonymous';
  }

  /** Every approval and question (SPEC §12), `[asideId, approval]`, in the order asked. */
  get approvals() {
    return approvals(this.session.local);
  }

  /**
   * Whether this token may decide approvals (the `approve` scope; a hub without auth lets
   * every socket decide, except on the approvals its own client asked).
   */
  get mayDecide() {
    const scopes = this.session.lastWelcome?.scopes;
    return !Array.isArray(scopes) || scopes.includes('approve');
  }

  /**
   * Whether this replica may decide approval `approval` (an approval value): its token may
   * decide, and it did not ask it (by principal with auth, by client id without).
   */
  mayDecideOn(approval) {
    if (!this.mayDecide || approval.state !== 'open') return false;
    const auth = Array.isArray(this.session.lastWelcome?.scopes);
    return auth ? approval.asked_by !== this.sub : approval.asked_client !== this.client;
  }

  /**
   * Ask a person and wait for the decision (SPEC §12), as Python's `Replica.ask`: about
   * tool call `call`, or a question with `key`, `prompt` and a JSON `schema`. Idempotent per
   * `(turn, key)`. Resolves with the decided (or cancelled) approval; rejects with
   * `UsageError` `not_asked` when the hub refused the ask.
   * @param {{call?: string | null, prompt?: string | null, schema?: any, key?: string}} options
   */
  ask(options = {}) {
    const key = options.key ?? options.call ?? null;
    if (key === null) throw new UsageError('bad_key', 'ask about a call, or give a question its key');
    const { approval } = ask(this.session.local, {
      key,
      call: options.call ?? null,
      prompt: options.prompt ?? null,
      schema: options.schema ?? null,
      askedBy: this.sub,
      askedClient: this.client,
    });
    const turn = approval.turn;
    return new Promise((resolve, reject) => {
      const check = () => {
        const found = findApproval(this.session.local, turn, key);
        if (found === null) {
          stopListening();
          reject(new UsageError('not_asked', 'the hub refused the ask (see the conflict)'));
        } else if (found[1].state !== 'open') {
          stopListening();
          resolve(found[1]);
        }
      };
      const stopListening = this.on('*', check);
      check();
    });
  }

  /**
   * Resolves with the result of tool call `callId` (a frontend tool's, pushed by a UI) once
   * one is in the conversation: the first after the call (strict pairing refuses a second).
   * @param {string} callId
   */
  result(callId) {
    return new Promise((resolve) => {
      const check = () => {
        const found = resultOf(this.session.local, callId);
        if (found !== null) {
          stopListening();
          resolve(found);
        }
      };
      const stopListening = this.on('*', check);
      check();
    });
  }

  /**
   * Decide approval `id` as this replica's principal (an edit, pushed like any other): see
   * `decide`. A `conflict` event with reason `decided` comes when someone decided first.
   * @param {string} id @param {{approve?: boolean, answer?: any, reason?: string | null}} [options]
   */
  decide(id, options = {}) {
    if (!this.mayDecide) throw new UsageError('forbidden', 'this token lacks the approve scope');
    return decide(this.session.local, id, { ...options, decidedBy: this.sub });
  }

  /** Live connections by connection id (with `live: true`). */
  get presence() {
    return this.session.presence;
  }

  /**
   * Listen to `type`: a session event (`connected`, `disconnected`, `applied`, `rebased`,
   * `reset`, `conflict`), `state` (`{state, code, reason}`), `refused` (a `Refused`),
   * `edited` (after each record `conversation` makes: an edit here, or one a rebase
   * replays), or `*` (every session event). Returns a function that stops listening.
   * @param {string} type @param {(event: any) => void} listener
   */
  on(type, listener) {
    return super.on(type, listener);
  }

  #events(events) {
    for (const event of events) this.emitter.emit(event.type, event);
  }

  /** Push each edit of the local value (the outbox keeps it first). */
  #watchLocal() {
    // `edited`: a record made here (an edit, or a rebase replaying one), which no session
    // event names; a view of `conversation` (react.js) listens to it besides `*`.
    this.session.local.onEdit(() => {
      this.keeper?.changed();
      this.#pump();
      this.emitter.emit('edited', { type: 'edited' });
    });
  }

  /** Take the outbox and put what it keeps into the session (before the first hello). */
  async #load(persist, client) {
    const { keeper, conflicts } = await openKeeper(this.session, this.url, persist, client);
    if (this.closing) {
      void keeper.close();
      return this;
    }
    this.keeper = keeper;
    keeper.onError = (error) =>
      this.emitter.emit('outbox_error', { type: 'outbox_error', detail: String(error) });
    this.#watchLocal();
    this.#events(conflicts);
    this.#progressed();
    return this;
  }

  /** Open the first connection (called by `connect`). */
  async start() {
    if (this.closing || this.attempting) return;
    this.attempting = true;
    this.reconnect.begin();
    try {
      await this.loaded;
    } catch (error) {
      this.attempting = false;
      const code = error instanceof ConvsyncError ? error.reason : 'outbox_unreadable';
      this.#refuse(code, error instanceof Error ? error.message : String(error), null);
      return;
    }
    let token = null;
    try {
      token = this.getToken !== null ? await this.getToken() : null;
    } catch (error) {
      this.#ended(null, null, `getToken failed: ${error}`);
      return;
    }
    if (this.closing) {
      this.session.release();
      this.reconnect.set('closed');
      return;
    }
    if (this.refusedToken !== null && token === this.refusedToken) {
      // `getToken` gave back the very token the hub just refused (a page holding one token):
      // asking again would only be refused again, forever.
      this.attempting = false;
      this.#refuse('unauthorized', 'the hub refused this token and getToken gave it again', 4001);
      return;
    }
    this.lastToken = token;
    this.refusedToken = null;
    // The socket `openEarly` opened for this replica's first connection, if it can be used.
    const early = this.#adoptable();
    let ws = early?.ws;
    try {
      ws ??= new this.WebSocket(this.url, SUBPROTOCOL);
    } catch (error) {
      this.#ended(null, null, `${error}`);
      return;
    }
    this.ws = ws;
    let errorCode = null;
    let done = false;
    const finish = (closeCode, reason) => {
      if (done) return;
      done = true;
      if (this.ws === ws) this.ws = null;
      this.#ended(errorCode, closeCode, reason);
    };
    ws.onopen = () => ws.send(this.#hello(token));
    ws.onmessage = (message) => {
      if (done) return;
      try {
        const data = typeof message.data === 'string' ? message.data : String(message.data);
        const decoded = JSON.parse(data);
        this.#heard(ws, decoded);
        this.#maybeRefresh(ws, decoded);
        const events = this.session.receive(decoded);
        if (events.length > 0 && events[0].type === 'connected') {
          this.failure = null;
          this.connects += 1;
          this.reconnect.connected();
        }
        this.#events(events);
        if (this.session.ready) this.resolveReady(this);
        this.#pump();
        this.#progressed();
      } catch (error) {
        if (error instanceof ProtocolError && error.fromHub) errorCode = error.reason;
        else if (!(error instanceof ConvsyncError) && !(error instanceof SyntaxError)) throw error;
        const reason = error instanceof Error ? error.message : String(error);
        try {
          ws.close(error instanceof ProtocolError && error.fromHub ? 1000 : 4002, 'protocol error');
        } catch {
          // already closing
        }
        finish(null, reason);
      }
    };
    whenEnded(ws, finish);
    if (early?.sent) {
      // Its hello went when it opened: what it said must be what this replica says.
      const hello = this.#hello(token);
      if (hello !== early.hello) {
        // Not this replica's socket after all (another kept value, other options): connect
        // anew, as after any connection that ended before its welcome.
        try {
          ws.close(1000, '');
        } catch {
          // closing already
        }
        finish(null, 'the early socket said another hello');
        return;
      }
      for (const data of early.messages.splice(0)) ws.onmessage?.({ data });
    }
  }

  /** This connection's hello (the session moves on to waiting for the welcome). */
  #hello(token) {
    const hello = /** @type {any} */ (this.session.hello(token));
    if (this.getToken !== null) hello.features = [...hello.features, 'auth'];
    if (this.keepalive !== null) hello.features = [...hello.features, 'ping'];
    if (this.watch) hello.watch = true; // in no presence, not `online` (SPEC §17)
    return JSON.stringify(hello);
  }

  /**
   * The early socket (`lib/early.js`) given as `options.early`, taken once, for this
   * replica's first connection: its own listeners detached and its kept messages still in
   * it; null when there is none, or it is of another conversation or client, or it closed.
   */
  #adoptable() {
    const early = this.early;
    this.early = null;
    if (early === null) return null;
    const usable =
      !this.closing &&
      early.url === this.url &&
      early.client === this.client &&
      !early.ended &&
      early.ws.readyState <= 1;
    early.detach();
    if (usable) return early;
    try {
      early.ws.close(1000, '');
    } catch {
      // closing already
    }
    return null;
  }

  /**
   * After a `welcome` or `auth_ok` that says when the token expires, fetch a new token with
   * `getToken` at 80% of that time and send it as `auth` (SPEC §6 live refresh).
   */
  #maybeRefresh(ws, message) {
    if (this.getToken === null || !isObject(message)) return;
    if (message.type !== 'welcome' && message.type !== 'auth_ok') return;
    const expiresIn = message.expires_in;
    if (typeof expiresIn !== 'number' || !Number.isFinite(expiresIn)) return;
    if (Array.isArray(message.features) && !message.features.includes('auth')) return;
    if (this.refreshTimer !== null) this.clearTimer(this.refreshTimer);
    const getToken = this.getToken;
    this.refreshTimer = this.setTimer(
      async () => {
        this.refreshTimer = null;
        if (this.ws !== ws || ws.readyState !== 1) return;
        try {
          const token = await getToken();
          if (this.ws === ws && ws.readyState === 1 && token)
            ws.send(JSON.stringify({ type: 'auth', token }));
        } catch {
          // the hub closes with `unauthorized` at expiry; the reconnect asks again
        }
      },
      // Timers take at most 2^31 - 1 ms (24.8 days): a longer delay fires at once, and each
      // `auth_ok` armed it again, an `auth` flood. A token living longer is refreshed later
      // than 80% of its life, at 24.8 days, which is still well before it ends.
      Math.min(MAX_TIMER_MS, Math.max(0, expiresIn * 800)),
    );
  }

  /**
   * Keepalive: after a welcome listing `ping`, ping every `keepalive / 2`; anything the hub
   * sends answers the ping in flight. A ping unanswered for `keepalive / 2` gives the socket
   * up at once: a frozen hub would not finish a closing handshake either.
   */
  #heard(ws, message) {
    if (this.keepalive === null || !isObject(message)) return;
    const features = message.type === 'welcome' ? message.features : null;
    const welcomed = Array.isArray(features) && features.includes('ping');
    if (!welcomed && this.pongTimer === null) return;
    if (this.pongTimer !== null) this.clearTimer(this.pongTimer);
    this.pongTimer = null;
    const half = this.keepalive / 2;
    this.pingTimer = this.setTimer(() => {
      this.pingTimer = null;
      if (this.ws !== ws || ws.readyState !== 1) return;
      ws.send('{"type":"ping"}');
      this.pongTimer = this.setTimer(() => {
        this.pongTimer = null;
        if (this.ws !== ws) return;
        ws.onmessage = () => {};
        ws.onclose = () => {};
        ws.onerror = () => {};
        try {
          ws.close(1000, 'keepalive');
        } catch {
          // already closing
        }
        this.ws = null;
        this.#ended(null, null, `keepalive timed out: a ping went unanswered for ${half / 1000}s`);
      }, half);
    }, half);
  }

  #stopKeepalive() {
    for (const timer of [this.pingTimer, this.pongTimer]) {
      if (timer !== null) this.clearTimer(timer);
    }
    this.pingTimer = null;
    this.pongTimer = null;
  }

  #pump() {
    const ws = this.ws;
    if (ws === null || ws.readyState !== 1) return;
    const { frame, conflicts } = this.session.nextPush(monotonicMs());
    this.#events(conflicts);
    if (frame !== null && this.keeper !== null) {
      // Sent once the outbox holds the batch with its seq (never again under another).
      this.keeper.sending(() => {
        if (this.ws === ws && ws.readyState === 1) ws.send(frame);
      });
    } else if (frame !== null) {
      ws.send(frame);
    } else if (this.session.pacedUntil !== null && this.paceTimer === null) {
      // Within the hub's budget: push what gathered meanwhile once a token is there.
      this.paceTimer = this.setTimer(() => {
        this.paceTimer = null;
        this.#pump();
      }, Math.max(0, this.session.pacedUntil - monotonicMs()));
    }
  }

  #ended(code, closeCode, reason) {
    this.attempting = false;
    this.#stopKeepalive();
    if (this.refreshTimer !== null) {
      this.clearTimer(this.refreshTimer);
      this.refreshTimer = null;
    }
    if (this.paceTimer !== null) {
      this.clearTimer(this.paceTimer);
      this.paceTimer = null;
    }
    this.failure = reason || `closed ${closeCode ?? ''}`.trim();
    this.#events(this.session.disconnected(this.failure));
    if (this.closing) {
      this.session.release();
      this.reconnect.set('closed', code, reason);
      return;
    }
    // Refused for its token: the next attempt asks `getToken` for another (see `start`).
    // (Set before the state changes, as before; with no `getToken` the rule refuses.)
    const known = code ?? codeOfClose(closeCode, reason);
    if (known === 'unauthorized' && this.getToken !== null) this.refusedToken = this.lastToken;
    const rule = this.reconnect.ended(code, closeCode, reason, this.getToken !== null);
    if (rule === 'refused') this.#refuse(known ?? `close_${closeCode}`, reason, closeCode);
  }

  /** Stop for good, refused by the hub (`code`): `closed`, a `refused` event, `ready` rejects. */
  #refuse(code, reason, closeCode) {
    this.#adoptable(); // an early socket not used yet is closed: this replica is done
    this.refused = new Refused(code, reason, closeCode);
    // A deleted conversation takes no edits: what its outbox kept will never go.
    if (code === 'deleted' && this.keeper !== null) void this.keeper.clear();
    this.reconnect.set('closed', this.refused.code, reason);
    this.emitter.emit('refused', this.refused);
    this.rejectReady(this.refused);
  }

  /** Resolves once every edit made so far is in the outbox (`persist`; at once without). */
  saved() {
    return this.keeper === null ? Promise.resolve() : this.keeper.saved();
  }

  /** Resolves once every edit made so far is acknowledged (waits across reconnects); rejects
   * when the replica is closed or refused first. */
  flush() {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.session.settled && this.ws !== null) {
          this.progress.delete(check);
          resolve(undefined);
        } else if (this.state === 'closed') {
          this.progress.delete(check);
          reject(this.refused ?? new UsageError('closed', 'the replica is closed'));
        }
      };
      this.progress.add(check);
      this.#pump();
      check();
    });
  }

  #progressed() {
    this.keeper?.changed();
    for (const check of Array.from(this.progress)) check();
  }

  /** Disconnect and stop reconnecting. Unacknowledged edits stay in `conversation.unsaved()`. */
  close() {
    this.closing = true;
    this.#adoptable(); // an early socket not used yet is closed
    void this.keeper?.close(); // written first, then let go (another tab may take it)
    this.#stopKeepalive();
    this.reconnect.cancel();
    const ws = this.ws;
    if (ws !== null) {
      try {
        ws.close(1000, '');
      } catch {
        // already closed
      }
    } else {
      this.session.release();
      this.reconnect.set('closed');
    }
  }
}

/**
 * Connect a replica of `conversationId` on the hub at `url`; it starts at once.
 * @param {string} url @param {string} conversationId
 * @param {ConnectOptions} [options]
 */
export function connect(url, conversationId, options = {}) {
  const replica = new Replica(url, conversationId, options);
  void replica.start();
  return replica;
}

// @ts-check
// The pure replica session: frames in, frames and events out (`client/session.py`).
import { APPROVAL_KIND, approvalOf, isDecision } from './approvals.js';
import { pacerFor } from './budget.js';
import { Conversation } from './conversation.js';
import { ConvsyncError, DecodeError, ProtocolError, UsageError } from './errors.js';
import {
  DRAFTS,
  FRAME_FILL,
  HUB_REBASE,
  MAX_FRAME,
  PRESENCE,
  PUSH_OVERHEAD,
  grouped,
  needInts,
  utf8Length,
} from './frames.js';
import { Lineage } from './ids.js';
import { receiveLive, sweepDrafts } from './live.js';
import { LogView, folded } from './log.js';
import { next, refusal } from './phases.js';
import { conflict, needsBase, rebase } from './rebase.js';
import { isObject } from './records.js';
import { QUEUED_KIND, STOP_KIND, queueRecords, rejectRule } from './steer.js';

/** The approval events of `records` (asked, or decided). @param {any[]} records */
function approvalEvents(records) {
  const events = [];
  for (const record of records) {
    const change = record.change;
    if (change.type !== 'aside' || change.aside === null || change.aside.kind !== APPROVAL_KIND) continue;
    const approval = approvalOf(change.aside);
    if (approval === null) continue;
    const type = approval.state === 'open' ? 'approval_asked' : 'approval_decided';
    events.push({ type, id: change.id, approval });
  }
  return events;
}

/**
 * The integer fields and the list each hub message must have: checked first, so a message
 * the hub got wrong is `malformed` in any phase.
 * @type {Readonly<Record<string, {ints: string[], list: string | null}>>}
 */
const SHAPES = Object.freeze({
  welcome: { ints: ['lineage', 'revision', 'acked'], list: null },
  records: { ints: ['from'], list: 'records' },
  state: { ints: ['lineage', 'revision'], list: null },
  entries: { ints: [], list: 'entries' },
  ack: { ints: ['seq', 'from', 'revision'], list: null },
  reject: { ints: ['seq', 'lineage', 'revision'], list: null },
});

/**
 * One replica of one conversation across any number of connections: messages from the hub
 * in, frames and events out, no socket (as `client/session.py`).
 *
 * `phase` is where the connection is (`PHASES` in `phases.js`: what each phase accepts, and
 * where it goes); `log` is the log as seen: `confirmed`, its value at the last revision folded,
 * and the records held past it. `local` is what the application edits (`confirmed` plus
 * pending records: the batch in flight, then `local`'s outbox).
 */
export class ReplicaSession {
  #maxFrame = MAX_FRAME;

  /**
   * @param {string} client this replica's client id (push seqs rise under it)
   * @param {{local?: Conversation, maxFrame?: number, maxBatch?: number, seq?: number, live?: boolean}} [options]
   *   `live`: ask for drafts and presence (SPEC §7) and keep them in `drafts` and `presence`.
   */
  constructor(client, options = {}) {
    const local = options.local ?? new Conversation();
    if (local.revision !== local.unsaved().length) {
      throw new UsageError('saved_value', 'a replica starts from a value with no saved records');
    }
    this.client = client;
    this.local = local;
    /** The log as seen: its value (`confirmed`) and the records held past it. */
    this.log = new LogView();
    /** The connection's phase (`PHASES` in phases.js). @type {import('./phases.js').Phase} */
    this.phase = /** @type {import('./phases.js').Phase} */ ('connecting');
    this.seq = options.seq ?? 0;
    this.maxFrame = options.maxFrame ?? MAX_FRAME;
    this.maxBatch = options.maxBatch ?? 1000;
    /** @type {{seq: number, records: ChangeRecord[], doomed: boolean, landed: ChangeRecord[] | null, base: Conversation | null} | null} */
    this.inflight = null;
    /** @type {ChangeRecord[]} */
    this.landed = [];
    /** @type {any} */
    this.welcome = null;
    /** Who the hub knows this connection as (`welcome.sub`; `anonymous` without auth). */
    this.sub = 'anonymous';
    /** The latest welcome, kept over a disconnect (who this replica is: `sub`, `scopes`). */
    /** @type {any} */
    this.lastWelcome = null;
    /** Pushes are paced within the hub's push budget (`welcome.limits.push`), once welcomed. */
    /** @type {TokenBucket | null} */
    this.pacer = null;
    /** When `nextPush(now)` held a push back to stay within the budget: when to call it again. */
    /** @type {number | null} */
    this.pacedUntil = null;
    /** @type {Conversation | null} */
    this.beforeCatchUp = null;
    this.rebaseDue = false; // rebase `local` at the end of the catch-up, moved or not
    // The revision the last ack said this replica will hold: a queue the hub landed with the
    // push follows its ack (SPEC §10); no push goes until those records are in.
    this.owed = 0;
    /** @type {any} */
    this.partial = null;
    /** @type {Entry[]} */
    this.partialEntries = [];
    this.live = options.live === true;
    /** Open drafts by id (live only): the hub's view, as it streams. @type {Map<string, Draft>} */
    this.drafts = new Map();
    /** Live connections by connection id (live only). @type {Map<string, any>} */
    this.presence = new Map();
    this.draftsFresh = false;
  }

  /**
   * The largest frame this session sends, in bytes; setting it also sets `local.recordLimit`
   * to what one push can carry (`maxFrame - 128`), so an edit too large to push throws at the
   * call that makes it.
   */
  get maxFrame() {
    return this.#maxFrame;
  }

  set maxFrame(maxFrame) {
    if (!(Number.isInteger(maxFrame) && maxFrame > PUSH_OVERHEAD)) {
      throw new UsageError(
        'bad_setting',
        `maxFrame must be more than ${PUSH_OVERHEAD} bytes, got ${JSON.stringify(maxFrame)}`,
      );
    }
    this.#maxFrame = maxFrame;
    this.local.recordLimit = maxFrame - PUSH_OVERHEAD;
  }

  /** The log's value at the last revision folded (`log.value`). */
  get confirmed() {
    return this.log.value;
  }

  /** Records made here that the hub has not acknowledged yet. */
  get pending() {
    const inflight = this.inflight;
    const sent = inflight !== null && !inflight.doomed ? inflight.records.length : 0;
    return sent + this.local.unsaved().length;
  }

  /** Welcomed and caught up: pushes can go. */
  get ready() {
    return this.phase === 'live' && this.confirmed.revision >= this.owed;
  }

  /** Caught up with nothing pending and nothing in flight. */
  get settled() {
    return this.ready && this.inflight === null && this.local.unsaved().length === 0;
  }

  /** The first message of a new connection; forgets the previous connection's state. */
  hello(token = null) {
    this.phase = next(this.phase, 'hello');
    this.welcome = null;
    this.partial = null;
    this.partialEntries = [];
    this.log.dropHeld(); // the hub sends them again in the catch-up
    this.owed = 0; // the catch-up brings them
    return {
      type: 'hello',
      client: this.client,
      lineage: this.confirmed.lineage,
      revision: this.confirmed.revision,
      token,
      features: this.live ? [HUB_REBASE, DRAFTS, PRESENCE] : [HUB_REBASE],
    };
  }

  /**
   * The next push frame (JSON text) if one may go now, and records refused locally. An edit
   * too large to push throws when it is made (`local.recordLimit`); a record that still
   * outgrows a push here (made before the session measured `local`, or re-targeted by a
   * rebase) is taken out of `local` and reported `too_large`. A push of several records is
   * filled to 1 MiB at most; a larger record goes alone, up to `maxFrame`. Given `now`
   * (milliseconds, any monotonic clock), pushes are paced within the hub's budget: one that
   * would go over it is held back (`pacedUntil` says until when) and the records made
   * meanwhile go out together.
   * @param {number | null} [now]
   * @returns {{frame: string | null, conflicts: Conflict[]}}
   */
  nextPush(now = null) {
    this.pacedUntil = null;
    if (!this.ready || this.inflight !== null || this.local.unsaved().length === 0) {
      return { frame: null, conflicts: [] };
    }
    if (this.pacer !== null && now !== null && !this.pacer.take(now / 1000)) {
      this.pacedUntil = this.pacer.readyAt(now / 1000) * 1000;
      return { frame: null, conflicts: [] };
    }
    const records = this.local.unsaved();
    const budget = this.maxFrame - PUSH_OVERHEAD;
    const fill = Math.min(this.maxFrame, FRAME_FILL) - PUSH_OVERHEAD;
    const encoded = [];
    let size = 0;
    for (let at = 0; at < records.length; at += 1) {
      if (encoded.length === this.maxBatch) break;
      const data = JSON.stringify(records[at]);
      const bytes = utf8Length(data);
      if (at === 0 && bytes > budget) return this.#refuse(at, bytes, budget);
      if (at > 0 && size + bytes + 1 > fill) break; // the next push takes it
      encoded.push(data);
      size += bytes + 1;
    }
    const taken = this.local.takeUnsaved();
    this.local.returnUnsaved(taken.slice(encoded.length));
    this.seq += 1;
    this.inflight = {
      seq: this.seq,
      records: taken.slice(0, encoded.length),
      doomed: false,
      landed: null,
      base: null,
    };
    const frame =
      `{"type":"push","seq":${this.seq},"lineage":${this.confirmed.lineage},` +
      `"revision":${this.confirmed.revision},"records":[${encoded.join(',')}]}`;
    return { frame, conflicts: [] };
  }

  #refuse(at, size, budget) {
    const records = this.local.takeUnsaved();
    const detail =
      `record of ${grouped(size)} bytes is ${grouped(size - budget)} bytes over the ` +
      `${grouped(budget)} a push can carry (maxFrame ${grouped(this.maxFrame)})`;
    const conflicts = [conflict(records[at], 'too_large', detail)];
    const keep = records.slice(0, at).concat(records.slice(at + 1));
    conflicts.push(...rebase(this.local, this.confirmed, keep, this.confirmed));
    const next = this.nextPush();
    return { frame: next.frame, conflicts: conflicts.concat(next.conflicts) };
  }

  /**
   * Handle one decoded message from the hub; returns the events for the application. Message
   * types this version does not know are ignored.
   * @throws {ProtocolError} the message breaks the protocol; drop the connection.
   */
  receive(message) {
    const events = this.#receive(message);
    if (this.live && this.drafts.size > 0 && events.length > 0) events.push(...sweepDrafts(this));
    return events;
  }

  /** @param {any} message @returns {any[]} */
  #receive(message) {
    if (!isObject(message)) throw new DecodeError('a hub message is not an object');
    const shape = SHAPES[message.type];
    if (shape !== undefined) {
      needInts(message, shape.ints);
      if (shape.list !== null && !Array.isArray(message[shape.list]))
        throw new DecodeError(`${message.type}: not a list`);
    }
    const refused = refusal(this.phase, message.type);
    if (refused !== null) throw refused;
    switch (message.type) {
      case 'welcome':
        if (typeof message.sub === 'string') this.sub = message.sub;
        return this.#onWelcome(message);
      case 'records':
        return [...this.#onRecords(message), ...approvalEvents(message.records)];
      case 'state':
        return this.#onState(message);
      case 'entries':
        return this.#onEntries(message);
      case 'ack':
        return this.#onAck(message);
      case 'reject':
        return this.#onReject(message);
      case 'drafts':
      case 'draft':
      case 'draft_end':
      case 'presence':
      case 'presence_diff':
        return this.live ? receiveLive(this, message) : [];
      case 'error':
        throw new ProtocolError(
          String(message.code),
          `the hub closed the session: ${message.detail}`,
          true,
        );
      default:
        return []; // a newer hub's message: not ours to understand
    }
  }

  /**
   * The replica stopped for good (`closed`): the session takes no more hub messages and no
   * `hello()`. The shell calls it when it is closed by `close()`.
   */
  release() {
    this.phase = next(this.phase, 'release');
  }

  /**
   * The connection is gone; the session waits for the next `hello()`. A `disconnected` event
   * only when a welcomed connection ended: events mark changes of state (one `disconnected`
   * after each `connected`), not every failed attempt to reconnect.
   */
  disconnected(reason) {
    const welcomed = this.welcome !== null;
    this.phase = next(this.phase, 'disconnected');
    this.welcome = null;
    /** @type {any[]} */
    const events = welcomed ? [{ type: 'disconnected', reason }] : [];
    if (this.live) {
      // Drafts and presence are live facts of a connection: the next one sends them afresh.
      for (const id of this.drafts.keys()) events.push({ type: 'draft_end', id, status: 'lost' });
      this.drafts.clear();
      if (this.presence.size > 0) {
        events.push({ type: 'presence', joined: [], left: [...this.presence.keys()], changed: [] });
        this.presence.clear();
      }
    }
    return events;
  }

  #onWelcome(welcome) {
    this.welcome = welcome;
    this.lastWelcome = welcome; // kept over a disconnect: who this replica is
    this.pacer = pacerFor(welcome.limits?.push);
    this.draftsFresh = true;
    this.seq = Math.max(this.seq, welcome.acked);
    const batch = this.inflight;
    this.inflight = null;
    if (batch !== null) {
      if (batch.seq <= welcome.acked && batch.landed !== null) {
        // Placed by the hub, its ack lost: `confirmed` holds it as it landed, `local` as
        // sent. What was made on top is replayed from the batch's base, as the ack would;
        // with nothing on top, `local` is that base. Either way `local` is rebased.
        this.local.beforeEdit(null);
        if (this.beforeCatchUp === null)
          this.beforeCatchUp = batch.base !== null ? batch.base : this.local.copy();
        this.rebaseDue = true;
      } else if (batch.seq <= welcome.acked) {
        this.landed = batch.records; // they come in the catch-up
      } else if (!batch.doomed) this.local.returnUnsaved(batch.records);
    }
    const confirmed = this.confirmed;
    if (confirmed.lineage === Lineage.EMPTY && confirmed.revision === 0) {
      confirmed.continueLog(welcome.lineage, 0); // a value begun here continues any log
    }
    this.phase = next(this.phase, 'welcome');
    if (this.beforeCatchUp === null) this.beforeCatchUp = confirmed.copy();
    return [
      { type: 'connected', lineage: welcome.lineage, revision: welcome.revision },
      ...this.#maybeCaughtUp(),
    ];
  }

  #maybeCaughtUp() {
    const welcome = this.welcome;
    const confirmed = this.confirmed;
    if (
      this.partial !== null ||
      !(confirmed.lineage === welcome.lineage && confirmed.revision >= welcome.revision)
    ) {
      return [];
    }
    this.phase = next(this.phase, 'caught_up');
    let base = this.beforeCatchUp;
    this.beforeCatchUp = null;
    const landed = this.landed;
    this.landed = [];
    base = base !== null ? folded(base, landed) : null;
    const unmoved =
      base !== null && base.lineage === confirmed.lineage && base.revision === confirmed.revision;
    const due = this.rebaseDue;
    this.rebaseDue = false;
    if (unmoved && landed.length === 0 && this.local.unsaved().length === 0 && !due) return [];
    return this.#rebaseLocal(base);
  }

  /** @param {Conversation | null} base */
  #rebaseLocal(base) {
    const pending = this.local.takeUnsaved();
    const conflicts = rebase(this.local, this.confirmed, pending, base);
    /** @type {any[]} */
    const events = conflicts.slice();
    if (pending.length > 0) {
      events.push({
        type: 'rebased',
        replayed: pending.length - conflicts.length,
        revision: this.confirmed.revision,
      });
    }
    return events;
  }

  #onRecords(message) {
    const confirmed = this.confirmed;
    const revision = this.log.revision;
    const skip = revision - message.from;
    if (skip < 0) throw new ProtocolError('gap', `records from ${message.from}, at ${revision}`);
    const records = message.records.slice(skip);
    if (records.length === 0) return [];
    if (this.phase === 'catching_up') {
      this.log.fold(records);
      return [
        { type: 'applied', count: records.length, revision: confirmed.revision },
        ...this.#maybeCaughtUp(),
      ];
    }
    const inflight = this.inflight;
    if (inflight === null && this.local.unsaved().length === 0) {
      this.log.fold(records);
      for (const record of records) this.local.apply(record);
      return [{ type: 'applied', count: records.length, revision: confirmed.revision }];
    }
    if (inflight !== null && !inflight.doomed) {
      const origin = message.origin;
      if (isObject(origin) && origin.client === this.client && origin.seq === inflight.seq) {
        // The hub placed our stale batch (SPEC 2.4.6): these records are it, as it landed;
        // its ack follows. Fold what overtook it, then these.
        if (inflight.landed === null) {
          inflight.landed = [];
          // What is made on top of the batch as sent is replayed onto the batch as it
          // landed, from this base (pure insertions need it).
          if (this.local.unsaved().length > 0) {
            inflight.base = folded(confirmed.copy(), inflight.records);
          } else {
            // `local` is that base now: copy it before the next edit, if one comes before
            // the ack (a writer that awaits its flush makes none: no copy).
            this.local.beforeEdit(() => {
              if (this.inflight === inflight && inflight.base === null)
                inflight.base = this.local.copy();
            });
          }
        }
        const overtaken = this.#foldHeld();
        this.log.fold(records);
        inflight.landed = inflight.landed.concat(records);
        return overtaken;
      }
      // The log moved under the batch in flight, which the hub may still place: hold these
      // records until its ack or reject says what became of it.
      this.log.hold(records);
      return [];
    }
    // The log moved under pending records: replay them on it.
    let base = null;
    const pending = this.local.takeUnsaved();
    if (needsBase(pending)) base = confirmed.copy();
    this.log.fold(records);
    this.local.returnUnsaved(pending);
    return [
      { type: 'applied', count: records.length, revision: confirmed.revision },
      ...this.#rebaseLocal(base),
    ];
  }

  /** Fold the records that overtook the batch in flight into `confirmed`. */
  #foldHeld() {
    const count = this.log.foldHeld();
    if (count === 0) return [];
    return [{ type: 'applied', count, revision: this.confirmed.revision }];
  }

  #onState(message) {
    this.partial = message;
    this.partialEntries = [];
    this.draftsFresh = true; // a drafts snapshot follows every state
    return message.more ? [] : this.#takeState();
  }

  #onEntries(message) {
    if (this.partial === null) throw new ProtocolError('unexpected', 'entries without a state');
    for (const entry of message.entries) this.partialEntries.push(entry);
    return message.more ? [] : this.#takeState();
  }

  #takeState() {
    const message = this.partial;
    this.partial = null;
    let state = message.state;
    if (this.partialEntries.length > 0) {
      state = { ...state, entries: (state.entries ?? []).concat(this.partialEntries) };
      this.partialEntries = [];
    }
    let confirmed;
    try {
      confirmed = Conversation.fromState(state);
    } catch (error) {
      if (!(error instanceof ConvsyncError)) throw error;
      throw new ProtocolError(
        'malformed',
        `the hub sent a state that is not valid: ${error.message}`,
      );
    }
    const holds = this.confirmed;
    if (
      this.phase !== 'catching_up' &&
      this.log.held.length === 0 &&
      message.lineage === holds.lineage &&
      message.revision === holds.revision &&
      message.lineage !== Lineage.EMPTY &&
      message.lineage !== Lineage.DETACHED
    ) {
      // The state of the very log this replica holds (a hub answering an older push
      // `lineage` sends it once more): nothing moved, and a batch made on it since is still
      // good (as client/session.py does).
      return [];
    }
    confirmed.continueLog(message.lineage, message.revision);
    this.owed = 0; // a state holds whatever an ack said would follow, or replaces it
    const old = this.confirmed;
    this.log.replace(confirmed); // the state holds the records held

    const events = [{ type: 'reset', lineage: message.lineage, revision: message.revision }];
    if (this.phase === 'catching_up') return [...events, ...this.#maybeCaughtUp()];
    const inflight = this.inflight;
    if (inflight !== null && !inflight.doomed) {
      inflight.doomed = true;
      this.local.returnUnsaved(inflight.records);
    }
    return [...events, ...this.#rebaseLocal(old)];
  }

  #onAck(ack) {
    const batch = this.inflight;
    if (batch === null || batch.seq !== ack.seq) return []; // a resend's duplicate answer
    if (batch.doomed)
      throw new ProtocolError('unexpected', `ack of push ${ack.seq} after the log moved`);
    const confirmed = this.confirmed;
    const landed = batch.landed;
    if (landed !== null) {
      // Placed by the hub: `confirmed` holds it already, as it landed. Replay what was made on
      // top of the batch as sent onto the log as it is.
      if (ack.revision < confirmed.revision || ack.from !== confirmed.revision - landed.length) {
        throw new ProtocolError(
          'gap',
          `ack ${ack.from}..${ack.revision} for ${landed.length} placed records at ${confirmed.revision}`,
        );
      }
      this.inflight = null;
      this.owed = ack.revision;
      this.local.beforeEdit(null); // the base-keeping hook, if it is still armed
      return [
        { type: 'applied', count: landed.length, revision: confirmed.revision },
        ...this.#rebaseLocal(batch.base),
      ];
    }
    if (ack.from !== confirmed.revision || ack.revision < ack.from + batch.records.length) {
      throw new ProtocolError(
        'gap',
        `ack ${ack.from}..${ack.revision} for ${batch.records.length} records at ${confirmed.revision}`,
      );
    }
    this.inflight = null;
    this.owed = ack.revision; // more than the batch: a queue landed with it, and follows
    this.log.fold(batch.records);
    return [];
  }

  #onReject(reject) {
    const confirmed = this.confirmed;
    if (reject.lineage === confirmed.lineage && reject.revision < confirmed.revision) {
      // The hub's log is behind this replica's (a stale hub): resending would spin. Drop the
      // connection; the next hello, ahead of the log, gets the log's state.
      throw new ProtocolError(
        'ahead',
        `the hub's log is at ${reject.revision}, this replica at ${confirmed.revision}`,
      );
    }
    const batch = this.inflight;
    if (batch === null || batch.seq !== reject.seq) return [];
    this.inflight = null;
    if (batch.doomed) return [];
    // What the batch (and what was made on top of it) was made on: `confirmed` before the
    // records that overtook it, copied only when needed.
    const rule = rejectRule(reject.reason);
    if (rule === 'queue') return this.#queue(batch.records);
    if (reject.reason === 'turn_ended') {
      const dropped = this.#dropLateStops(batch.records, reject);
      if (dropped !== null) return dropped;
    }
    if (reject.reason === 'decided') {
      const dropped = this.#dropRefused(batch.records, reject, isDecision);
      if (dropped !== null) return dropped;
    }
    const pending = batch.records.concat(this.local.unsaved());
    // `forbidden` (a token without `write`) is final like `invalid`: resending cannot help.
    const final = rule === 'final';
    const base = needsBase(pending) || final ? confirmed.copy() : null;
    const events = this.#foldHeld();
    if (!final) {
      // The hub could not place it: the records it missed came first (held, or on their way);
      // replay the batch and what followed it on the log.
      this.local.returnUnsaved(batch.records);
      if (events.length === 0) return [];
      return [...events, ...this.#rebaseLocal(base)];
    }
    for (const record of batch.records) {
      events.push(conflict(record, reject.reason, String(reject.detail ?? '')));
    }
    return [
      ...events,
      ...this.#rebaseLocal(folded(/** @type {Conversation} */ (base), batch.records)),
    ];
  }

  /**
   * A batch refused `turn_ended` holding stop requests and other records (a stop pressed as
   * the turn ended, a message typed next): the stops are the conflict, the rest is replayed,
   * never lost with them (`_drop_late_stops` in Python). With no stop but a decision, the
   * hub refused the decision (its approval's turn ended, SPEC §12): the decisions are the
   * conflict. Stops go first, as the hub checks them first. Null: final as a whole.
   * @param {ChangeRecord[]} records @param {any} reject
   */
  #dropLateStops(records, reject) {
    const isStop = (/** @type {ChangeRecord} */ record) =>
      record.change.type === 'aside' &&
      record.change.aside != null &&
      record.change.aside.kind === STOP_KIND;
    return this.#dropRefused(records, reject, records.some(isStop) ? isStop : isDecision);
  }

  /**
   * A batch refused for what only its `refused` records can be refused for: those are the
   * conflict, the rest is replayed, never lost with them (`_drop_refused` in Python):
   * `turn_ended`'s late stops, `decided`'s decisions of an approval another decided first
   * (SPEC §12), so a message typed beside a losing click still lands. Null when every
   * record, or none, is such: final as a whole.
   * @param {ChangeRecord[]} records @param {any} reject
   * @param {(record: ChangeRecord) => boolean} refused
   */
  #dropRefused(records, reject, refused) {
    const dropped = records.filter(refused);
    if (dropped.length === 0 || dropped.length === records.length) return null;
    const rest = records.filter((record) => !refused(record));
    const before = this.confirmed.copy();
    const events = this.#foldHeld();
    for (const record of dropped) {
      events.push(conflict(record, reject.reason, String(reject.detail ?? '')));
    }
    this.local.returnUnsaved(rest);
    return [...events, ...this.#rebaseLocal(before)];
  }

  /**
   * The batch of user text `records` was refused `queued` (SPEC §10): replay it as
   * `rig.queued` asides (`queueRecords`) ahead of what was made on top, on the log as it is.
   * @param {ChangeRecord[]} records
   */
  #queue(records) {
    // The base is `confirmed` before the records that overtook the batch: what it (and what
    // was made on top) was made on, so an edit there merges with what those records changed.
    const before = this.confirmed.copy();
    const events = this.#foldHeld();
    const confirmed = this.confirmed;
    const last = confirmed.length > 0 ? confirmed.id(confirmed.length - 1) : null;
    const queued = queueRecords(records, last);
    if (queued === null) {
      const detail = "refused queued, but not the user's own text";
      return [...events, ...records.map((record) => conflict(record, 'queued', detail))];
    }
    const pending = queued.concat(this.local.unsaved());
    const base = needsBase(pending) ? before : null;
    this.local.returnUnsaved(queued);
    const ids = queued
      .filter((r) => r.change.type === 'aside' && r.change.aside?.kind === QUEUED_KIND)
      .map((r) => /** @type {any} */ (r.change).id);
    return [...events, { type: 'queued', ids, mine: true }, ...this.#rebaseLocal(base)];
  }
}

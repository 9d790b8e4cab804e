// Types of convsync.js, kept by hand (the module has no build step). Field names are the wire's.

export const SUBPROTOCOL: 'convsync.v1';
export const STOPPED: 'STOPPED';

// ---------------------------------------------------------------- wire values

export type Halt = 'stopped' | 'kept';
export type AuthorKind = 'user' | 'agent' | 'plugin' | 'rig';

export interface AuthorValue {
  kind: AuthorKind;
  name: string | null;
  request: string | null;
  title: string | null;
}

export interface Stop {
  reason: 'stop' | 'length' | 'tool_use' | 'error' | 'aborted';
  detail: string | null;
}

export interface Origin {
  provider: string;
  model: string;
  response_id: string | null;
}

export interface Usage {
  input_tokens: number | null;
  output_tokens: number | null;
  cache_read_tokens: number | null;
  cache_write_tokens: number | null;
  reasoning_tokens: number | null;
}

export type Part =
  | { type: 'text'; text: string }
  | {
      type: 'tool_call';
      id: string;
      name: string;
      arguments: Record<string, unknown>;
      provider_data: Record<string, unknown> | null;
    }
  | { type: 'tool_result'; call_id: string; name: string; content: Part[]; is_error: boolean }
  | { type: 'json'; value: unknown }
  | {
      type: 'reasoning';
      text: string;
      redacted: boolean;
      signature: string | null;
      data: string | null;
      provider_data: Record<string, unknown> | null;
    }
  | { type: 'image'; media_type: string; data: string | null; url: string | null }
  | {
      type: 'document';
      media_type: string;
      data: string | null;
      url: string | null;
      name: string | null;
    };

export type MessageValue =
  | { role: 'system'; content: string }
  | { role: 'user'; content: Part[] }
  | {
      role: 'assistant';
      content: Part[];
      stop: Stop | null;
      origin: Origin | null;
      usage: Usage | null;
    };

export interface Entry {
  message: MessageValue;
  id: string | null;
  author: AuthorValue | null;
  source_id: string | null;
}

export interface AsideValue {
  kind: string;
  after: string | null;
  author: AuthorValue;
  value: unknown;
  saved: boolean;
}

export type TurnEnd =
  | { how: 'answered'; answer: string | null }
  | { how: 'failed'; why: string }
  | { how: 'stopped'; why: string | null };

export interface TurnRecord {
  index: number;
  start: string;
  end: TurnEnd | null;
}

export interface ConversationState {
  entries: Entry[];
  asides: ({ id: string } & AsideValue)[];
  halt: Halt | null;
  retired: string[];
}

export type Change =
  | { type: 'push'; entries: Entry[] }
  | { type: 'splice'; start: number; stop: number; removed: string[]; entries: Entry[] }
  | { type: 'halt'; halt: Halt | null }
  | { type: 'aside'; id: string; aside: AsideValue | null }
  | { type: 'reset'; state: ConversationState };

export interface ChangeRecord {
  change: Change;
  by: AuthorValue | null;
  at: number | null;
}

// ---------------------------------------------------------------- errors

export class ConvsyncError extends Error {
  constructor(reason: string, message: string);
  /** Machine-readable, the same strings as Python's. */
  reason: string;
  detail: string;
}
export class ApplyError extends ConvsyncError {}
export class ProtocolError extends ConvsyncError {
  constructor(reason: string, message: string, fromHub?: boolean);
  /** The hub sent this error itself (an `error` message before it closes). */
  fromHub: boolean;
}
export class DecodeError extends ProtocolError {
  constructor(message: string);
}
export class UsageError extends ConvsyncError {}
export class Refused extends ConvsyncError {
  constructor(code: string, detail: string, closeCode?: number | null);
  code: string;
  closeCode: number | null;
}

// ---------------------------------------------------------------- ids, helpers

export function codePoints(text: string): number;
export function sliceCodePoints(text: string, start: number): string;
export function isMessageId(value: unknown): value is string;
export function isAsideId(value: unknown): value is string;
export function madeMs(id: string): number;
export function isFailedReply(message: MessageValue): boolean;
export function isStopMarker(entry: Entry): boolean;
export function jsonEqual(a: unknown, b: unknown): boolean;
export function readRecord(record: unknown): ChangeRecord;

export class IdMinter {
  constructor(options?: { clock?: () => number; random?: () => bigint });
  messageId(at?: number | null): string;
  asideId(at?: number | null): string;
}
export const defaultMinter: IdMinter;

export const Lineage: Readonly<{ EMPTY: 0; DETACHED: number; fresh(): number }>;

export const Message: Readonly<{
  system(text: string): MessageValue;
  user(text: string): MessageValue;
  assistant(text: string, stop?: Stop | null): MessageValue;
  toolResult(callId: string, name: string, text: string, isError?: boolean): MessageValue;
}>;

export const Author: Readonly<{
  user(title?: string | null): AuthorValue;
  agent(name: string, request?: string | null): AuthorValue;
  plugin(name: string): AuthorValue;
  rig(): AuthorValue;
}>;

// ---------------------------------------------------------------- the model

export type EntryLike = MessageValue | (Partial<Entry> & { message: MessageValue });

export interface Spliced {
  removed: string[];
  kept: string[];
  restored: string[];
  added: string[];
}

/** The default frame limit in bytes (16 MiB). */
export const MAX_FRAME: number;

export class Conversation {
  constructor(options?: { ids?: IdMinter; recordLimit?: number | null });
  /** The most bytes one record made here may take (JSON, UTF-8); null: no limit. An edit
   * over it throws `UsageError` (`too_large`) and changes nothing. */
  recordLimit: number | null;
  static fromState(state: unknown, options?: { ids?: IdMinter }): Conversation;
  ids: IdMinter;
  revision: number;
  lineage: number;
  readonly length: number;
  copy(): Conversation;
  messages(): MessageValue[];
  entries(): Entry[];
  entry(at: number): Entry | null;
  id(at: number): string | null;
  indexOf(id: string): number | null;
  holds(id: string): boolean;
  isRetired(id: string): boolean;
  startOf(id: string): number;
  halted(): Halt | null;
  awaitsModel(): boolean;
  asides(): [string, AsideValue][];
  aside(id: string): AsideValue | null;
  turns(): [string, TurnRecord][];
  unsaved(): ChangeRecord[];
  state(): ConversationState;
  toJSON(): ConversationState;
  equals(other: unknown): boolean;
  continues(lineage: number, changes: number): boolean;
  /** Throws ApplyError (a fit rule) or DecodeError (`malformed`); changes nothing then. */
  apply(record: unknown): void;
  replay(record: unknown): void;
  onEdit(listener: (() => void) | null): void;
  takeUnsaved(): ChangeRecord[];
  returnUnsaved(records: ChangeRecord[]): void;
  continueLog(lineage: number, changes: number): void;
  reread(fromLog: Conversation): void;
  push(item: EntryLike): string;
  extend(items: Iterable<EntryLike>): string[];
  splice(
    start: number,
    stop: number,
    items: Iterable<EntryLike>,
    by?: AuthorValue | null,
    options?: { restore?: boolean },
  ): Spliced;
  halt(halt: Halt): boolean;
  resume(): boolean;
  reset(to: Conversation | ConversationState, by?: AuthorValue | null): void;
  addAside(aside: Omit<AsideValue, 'saved'> & { saved?: boolean }): string;
  replaceAside(id: string, aside: Omit<AsideValue, 'saved'> & { saved?: boolean }): boolean;
  removeAside(id: string): AsideValue | null;
}

export interface Conflict {
  type: 'conflict';
  record: ChangeRecord;
  reason: string;
  detail: string;
  /** For reason `edited`: the log's version of the entry or aside (it stays). */
  theirs?: Entry | AsideValue | null;
  /** For reason `edited`: the record's version (it did not land; null when none one to one). */
  ours?: Entry | AsideValue | null;
}

/** `base[start:stop]` (code points) became `text`. */
export type Hunk = [start: number, stop: number, text: string];
/** The hunks that make `base` into `other`, over code points (as `sync.merge.diff`). */
export function diff(base: string, other: string): Hunk[];
/** Both sides' changes of `base`, or null when two touch and differ (a conflict). */
export function mergeText(base: string, ours: string, theirs: string): string | null;
/** A message merged part by part, or null on a conflict. */
export function mergeMessage(
  base: MessageValue,
  ours: MessageValue,
  theirs: MessageValue,
): MessageValue | null;
/** The entry `pending` becomes on a log that made `base` into `log`, or null on a conflict. */
export function mergeEntry(base: Entry, log: Entry, pending: Entry): Entry | null;
/** The aside `pending` becomes on a log that made `base` into `log` (a note's text merged). */
export function mergeAside(
  base: AsideValue,
  log: AsideValue,
  pending: AsideValue,
): AsideValue | null;

export function needsBase(pending: ChangeRecord[]): boolean;
export function rebase(
  local: Conversation,
  onto: Conversation,
  pending: ChangeRecord[],
  base?: Conversation | null,
): Conflict[];

// ---------------------------------------------------------------- the session

export type SessionEvent =
  | { type: 'connected'; lineage: number; revision: number }
  | { type: 'disconnected'; reason: string }
  | { type: 'applied'; count: number; revision: number }
  | { type: 'rebased'; replayed: number; revision: number }
  | { type: 'reset'; lineage: number; revision: number }
  | { type: 'draft'; id: string }
  | { type: 'draft_end'; id: string; status: string }
  | { type: 'presence'; joined: string[]; left: string[]; changed: string[] }
  | { type: 'queued'; ids: string[]; mine: boolean }
  | { type: 'approval_asked'; id: string; approval: Approval }
  | { type: 'approval_decided'; id: string; approval: Approval }
  | Conflict;

/** A message in progress (SPEC §7), as the hub streams it; `parts` only grow. */
export interface Draft {
  id: string;
  role: string;
  principal: string | null;
  client: string | null;
  author: AuthorValue | null;
  after: string | null;
  /** `text`, `reasoning`, `call:<call_id>` (a tool call's arguments as JSON text so far). */
  parts: Record<string, string>;
  names: Record<string, string | null>;
  /** Each part's length in code points. */
  lengths: Record<string, number>;
  since: number | null;
}

/** One live connection (SPEC §7 presence); fields as the hub sends them. */
export interface PresenceItem {
  connection: string | number;
  principal?: string;
  client?: string;
  kind?: string | null;
  name?: string | null;
  status?: string | null;
  detail?: unknown;
  since?: number;
  /** The shared socket (`shared: true`) this session is a channel of: one browser's tabs. */
  socket?: number;
}

/** The people in a replica's `presence`: one item per shared socket (one browser's tabs) and
 * per session on a socket of its own, with `connections`, every session it stands for. */
export function people(
  presence: Map<string, PresenceItem> | Iterable<PresenceItem>,
): Array<PresenceItem & { connections: Array<string | number> }>;

/** Append `text` at code-point `offset` of `part`; skips what the draft has, ignores a gap. */
export function appendToDraft(
  draft: Draft,
  part: string,
  offset: number,
  text: string,
  name?: string | null,
): boolean;

export interface Hello {
  type: 'hello';
  client: string;
  lineage: number;
  revision: number;
  token: string | null;
  features: string[];
}

export class ReplicaSession {
  constructor(
    client: string,
    options?: {
      local?: Conversation;
      maxFrame?: number;
      maxBatch?: number;
      seq?: number;
      /** Ask for drafts and presence and keep them (`drafts`, `presence`). */
      live?: boolean;
    },
  );
  live: boolean;
  /** Who the hub knows this connection as (`welcome.sub`; `anonymous` without auth). */
  sub: string;
  drafts: Map<string, Draft>;
  presence: Map<string, PresenceItem>;
  client: string;
  local: Conversation;
  readonly confirmed: Conversation;
  seq: number;
  /** Setting it also sets `local.recordLimit` (`maxFrame - 128`). */
  maxFrame: number;
  maxBatch: number;
  readonly pending: number;
  /** Where the connection is (one table, as `client/phases.py`): `connecting` until a welcome,
   * `catching_up`, `live`; `closed` once released for good. */
  readonly phase: 'connecting' | 'catching_up' | 'live' | 'closed';
  readonly ready: boolean;
  readonly settled: boolean;
  /** The latest welcome, kept over a disconnect (`sub`, `scopes`). */
  lastWelcome: any;
  hello(token?: string | null): Hello;
  /** Given `now` (ms, monotonic), pushes are paced within the hub's budget (`pacedUntil`). */
  nextPush(now?: number | null): { frame: string | null; conflicts: Conflict[] };
  /** When `nextPush(now)` held a push back to stay within the hub's budget; else null. */
  pacedUntil: number | null;
  /** A decoded hub message; unknown types are ignored. Throws ProtocolError. */
  receive(message: unknown): SessionEvent[];
  disconnected(reason: string): SessionEvent[];
  /** The replica stopped for good (`closed`): no more hub messages, no `hello()`. */
  release(): void;
}

// ---------------------------------------------------------------- the socket shell

export type ConnectionState = 'connecting' | 'connected' | 'disconnected' | 'closed';

export type Retry = 'never' | 'new_token' | 'backoff' | 'at_once';
/** The one table of error codes (SPEC §5): close code and retry rule per code. */
// Steering (SPEC §10).
export const STEP_KIND: 'rig.step';
export const QUEUED_KIND: 'rig.queued';
export const STOP_KIND: 'rig.stop';
export type RejectRule = 'replay' | 'final' | 'queue';
export const REJECTS: Readonly<Record<string, RejectRule>>;
export function rejectRule(reason: string): RejectRule;
export function isUserText(entry: Entry): boolean;
export function queuedId(entryId: string): string;
export function queuedEntryId(asideId: string): string;
export function queueRecords(records: ChangeRecord[], after: string | null): ChangeRecord[] | null;
export function stepPending(conversation: Conversation): boolean;
export function midStep(conversation: Conversation): boolean;
export function stop(conversation: Conversation, now?: number, sub?: string): boolean;

// Approvals, questions and frontend tools (SPEC §12).
export const APPROVAL_KIND: 'rig.approval';
export const TOOLS_KIND: 'rig.tools';
export type ApprovalState = 'open' | 'approved' | 'denied' | 'answered' | 'cancelled';
/** The value of a `rig.approval` aside, keyed by `(turn, key)`. */
export interface Approval {
  turn: number;
  key: string;
  call: string | null;
  prompt: string | null;
  /** A JSON Schema of the supported subset (see `schemaProblem`), or null. */
  schema: any;
  state: ApprovalState;
  answer: any;
  reason: string | null;
  asked_by: string;
  /** The asker's client id (the hub checks it, so the asking client never decides). */
  asked_client: string | null;
  decided_by: string | null;
  decided_at: number | null;
}
export function approvalOf(aside: unknown): Approval | null;
export function approvals(conversation: Conversation): [string, Approval][];
export function findApproval(
  conversation: Conversation,
  turn: number,
  key: string,
): [string, Approval] | null;
export function ask(
  conversation: Conversation,
  options: {
    key: string;
    askedBy: string;
    askedClient: string;
    call?: string | null;
    prompt?: string | null;
    schema?: any;
  },
): { id: string; approval: Approval; made: boolean };
/** Throws `UsageError` `no_approval`, `decided` or `bad_answer`; nothing changes then. */
export function decide(
  conversation: Conversation,
  id: string,
  options: {
    approve?: boolean;
    answer?: any;
    reason?: string | null;
    decidedBy: string;
    at?: number;
  },
): Approval;
/** The first result answering tool call `callId` after the entry holding it, or null. */
export function resultOf(conversation: Conversation, callId: string): any | null;
export function decidedMeanwhile(then: unknown, held: unknown, pending: unknown): boolean;
export function schemaProblem(schema: unknown): string | null;
export function answerProblem(schema: unknown, value: unknown, path?: string): string | null;

export const CODES: Readonly<Record<string, { close: number; retry: Retry }>>;
export function retryOf(code: string): Retry;
export function closeCodeOf(code: string): number;
export function codeOfClose(close: number | null, reason: string): string | null;
export function retryRule(
  code: string | null,
  closeCode: number | null,
  canRefreshToken: boolean,
  closeReason?: string,
): 'refused' | 'at_once' | 'backoff';
export function backoffDelay(
  failures: number,
  base: number,
  max: number,
  random?: () => number,
): number;

export interface ConnectOptions {
  /** This replica's client id, kept across reconnects (random when omitted). */
  client?: string;
  /** Called on every (re)connect; its token goes in `hello.token`. */
  getToken?: () => string | null | Promise<string | null>;
  /** Ask the hub for drafts and presence (SPEC §7); they arrive as events. */
  live?: boolean;
  /** A value to start from (its unsaved records are pushed). */
  conversation?: Conversation;
  /** The WebSocket constructor (default: globalThis.WebSocket). */
  WebSocket?: new (url: string, protocol: string) => unknown;
  maxFrame?: number;
  /** First reconnect delay cap in ms (default 50); doubles per failure... */
  backoff?: number;
  /** ...up to this (default 5000). Each delay is uniform below the cap. */
  maxBackoff?: number;
  random?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: unknown) => void;
  /** Ms within which a hub that stopped answering is noticed (default 10000; null: none):
   * `ping` messages every half of it, to a hub that lists the `ping` feature. */
  keepalive?: number | null;
  /** false: watch without joining presence; the hub shows this replica in no one's presence
   * and in no summary row's `online` (default true). */
  presence?: boolean;
  /** Keep the confirmed value, pending edits and the batch in flight with its seq in
   * IndexedDB (SPEC §14): a reload or a new tab resumes them. */
  persist?: 'indexeddb';
  /** The outbox's name (default: `convsync:` + the replica's url). */
  outbox?: string;
  /** The IndexedDB factory (default: globalThis.indexedDB). */
  indexedDB?: unknown;
  /** Web Locks (default: navigator.locks; in-realm locks where there are none). */
  locks?: unknown;
  /** Ms to wait for the outbox's lock before refusing `outbox_in_use` (default 3000). */
  lockWait?: number;
  /** The socket `openEarly` opened for this replica (the same `client`): its first connection
   * uses it and what it received; one that would say another hello connects anew. */
  early?: EarlySocket;
  /** Share one socket to the hub with the other tabs of this origin (SPEC §14): this replica
   * is a session of its own (client, token, outbox) over a channel of it; one tab, chosen
   * by a Web Lock, holds the socket and hands it over when it closes. */
  shared?: boolean;
  /** BroadcastChannel for `shared` (default: globalThis.BroadcastChannel). */
  BroadcastChannel?: unknown;
  /** Tests: `shared` replicas of one realm given different names act as different tabs. */
  tab?: string;
}

/** ms a `shared` replica's channel waits for the leading tab to open it before it retries. */
export const SHARED_OPEN_WAIT: number;

/** This tab's part in sharing hub `base`'s socket (`shared: true`); `close()` acts as the tab
 * closing: its channels end, the socket it led closes and the next tab leads. */
export function sharedLink(
  base: string,
  options?: { BroadcastChannel?: unknown; locks?: unknown; WebSocket?: unknown; tab?: string },
): { readonly tab: string; readonly leading: boolean; close(): void };

/** A replica's first socket, opened before its modules loaded (`openEarly`). */
export interface EarlySocket {
  readonly url: string;
  readonly client: string;
  readonly sent: boolean;
  readonly ended: boolean;
  taken: boolean;
}

/**
 * Open the socket of a fresh replica `client` of `conversationId` now and send its hello, so
 * the catch-up streams in while the rest of the page loads; `connect(url, id, {client,
 * early})` adopts it. `token`, `live`, `auth` (the replica has a `getToken`) and `ping` (it
 * keeps the default keepalive; default true) must be what that replica's hello will carry.
 */
export function openEarly(
  url: string,
  conversationId: string,
  options: {
    client: string;
    token?: string | null;
    live?: boolean;
    auth?: boolean;
    ping?: boolean;
    WebSocket?: new (url: string, protocol: string) => unknown;
  },
): EarlySocket;

export interface StateEvent {
  type: 'state';
  state: ConnectionState;
  code: string | null;
  reason: string;
}

export class Replica {
  constructor(url: string, conversationId: string, options?: ConnectOptions);
  readonly url: string;
  readonly session: ReplicaSession;
  readonly conversation: Conversation;
  readonly client: string;
  readonly pending: number;
  readonly revision: number;
  readonly drafts: Map<string, Draft>;
  readonly presence: Map<string, PresenceItem>;
  /** This connection's principal (`anonymous` without auth). */
  readonly sub: string;
  /** Every approval and question, `[asideId, approval]`, in the order asked. */
  readonly approvals: [string, Approval][];
  /** Whether this token may decide approvals (the `approve` scope, or no auth). */
  readonly mayDecide: boolean;
  /** Whether this replica may decide `approval`: it may decide and did not ask it. */
  mayDecideOn(approval: Approval): boolean;
  /** Ask a person and wait for the decision (idempotent per `(turn, key)`). */
  ask(options: {
    call?: string | null;
    prompt?: string | null;
    schema?: any;
    key?: string;
  }): Promise<Approval>;
  /** Resolves with the result of (frontend) tool call `callId` once one has landed. */
  result(callId: string): Promise<any>;
  /** Decide approval `id` as this replica's principal; throws `UsageError` as `decide`. */
  decide(id: string, options?: { approve?: boolean; answer?: any; reason?: string | null }): Approval;
  /** `connecting` until the first welcome; `disconnected` (retrying) after a lost connection or
   * a failed attempt, once: failed attempts change nothing; `closed` after close or refusal. */
  state: ConnectionState;
  refused: Refused | null;
  /** Why the last connection or attempt ended; null while connected. */
  failure: string | null;
  /** Called after every message handled and every state change (an ack included). */
  progress: Set<() => void>;
  /** Resolves after the first catch-up; rejects with Refused when refused first. */
  ready: Promise<Replica>;
  /** Resolves once the outbox's value is in `conversation` (`persist`; at once without):
   * an offline start. Rejects as `ready` does when the outbox is refused. */
  loaded: Promise<Replica>;
  /** Resolves once every edit so far is in the outbox (`persist`; at once without). */
  saved(): Promise<void>;
  on(type: 'outbox_error', listener: (event: { type: 'outbox_error'; detail: string }) => void): () => void;
  on(type: 'state', listener: (event: StateEvent) => void): () => void;
  on(type: 'refused', listener: (error: Refused) => void): () => void;
  /** After each record `conversation` makes (an edit here, or a rebase replaying one). */
  on(type: 'edited', listener: (event: { type: 'edited' }) => void): () => void;
  on(type: SessionEvent['type'] | '*', listener: (event: SessionEvent) => void): () => void;
  start(): Promise<void>;
  flush(): Promise<void>;
  close(): void;
}

export function connect(url: string, conversationId: string, options?: ConnectOptions): Replica;

/** The layout of an IndexedDB outbox (`persist: 'indexeddb'`); another is refused. */
export const OUTBOX_LAYOUT: number;

/** One IndexedDB outbox, held by its Web Lock until `close()` (see lib/persist.js). */
export class Outbox {
  /** Rejects with Refused `outbox_in_use` when another holds it past `lockWait` ms. */
  static open(
    name: string,
    options?: { indexedDB?: unknown; locks?: unknown; lockWait?: number },
  ): Promise<Outbox>;
  readonly name: string;
  closed: boolean;
  load(): Promise<unknown>;
  clear(): Promise<void>;
  close(): void;
}

/** Calls `end` once when `ws` ends: at `close`, or at an `error` no `close` may follow. */
export function whenEnded(
  ws: unknown,
  end: (closeCode: number | null, reason: string) => void,
): (reason: string) => void;

// ---------------------------------------------------------------- the summary feed

export interface SummaryRow {
  id: string;
  lineage: number;
  revision: number;
  /** When the last entry was made (ms, from its id), or null. */
  updated: number | null;
  entries: number;
  halt: Halt | null;
  last: { id: string | null; role: string; text: string } | null;
  /** Client ids with a live socket on this conversation (watchers left out). */
  online: string[];
  /** Presence statuses as shown (`drafting` while drafting), by client id; at most 16. */
  status: Record<string, string>;
  /** Open drafts, and the client ids making them (at most 16). */
  drafts: { open: number; producers: string[] };
  /** The last turn record: running until it ends, then how it ended; null: no turn. */
  turn: { index: number; state: 'running' | 'answered' | 'failed' | 'stopped'; owner: string | null } | null;
  /** User messages waiting for the agent's step to end (`rig.queued` asides standing). */
  queued: number;
  /** Approvals and questions waiting for a decision (`rig.approval` asides still open). */
  approvals: number;
  /** The summed usage of the assistant replies the log holds (a field no reply reported
   * counts 0); null when no reply reported any. */
  usage: SummaryUsage | null;
}

export interface SummaryUsage {
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  cache_write_tokens: number;
  reasoning_tokens: number;
}

export class SummaryFeed {
  constructor(
    url: string,
    options?: {
      prefix?: string;
      /** `id` (pages by `after`; the default) or `updated` (the latest `limit` rows). */
      order?: 'id' | 'updated';
      after?: string | null;
      limit?: number;
      getToken?: () => string | null | Promise<string | null>;
      WebSocket?: new (url: string, protocol: string) => unknown;
      backoff?: number;
      maxBackoff?: number;
      random?: () => number;
      /** Ms within which a hub that stopped answering is noticed (default 10000; null:
       * none): `ping` messages every half of it, to a hub whose snapshot lists `ping`. */
      keepalive?: number | null;
    },
  );
  readonly url: string;
  rows: Map<string, SummaryRow>;
  more: boolean;
  state: ConnectionState;
  on(
    type: 'rows',
    listener: (event: {
      type: 'rows';
      rows: SummaryRow[];
      /** Ids that left the window. */
      left: string[];
      snapshot: boolean;
    }) => void,
  ): () => void;
  /** Another window on the same socket; its snapshot replaces the rows. */
  window(page: {
    prefix?: string;
    order?: 'id' | 'updated';
    after?: string | null;
    limit?: number;
  }): void;
  on(type: 'state', listener: (event: StateEvent) => void): () => void;
  /** One hub message (for tests); returns the rows it changed. */
  receive(message: unknown): SummaryRow[];
  start(): Promise<void>;
  close(): void;
}

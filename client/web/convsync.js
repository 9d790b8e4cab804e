// @ts-check
/**
 * convsync for browsers and Node: the conversation model, rebase, the replica session and a
 * websocket shell, as dependency-free ES modules (no build step). This file re-exports the
 * public API from `lib/`, one module per concept (their map: `docs/design.md`, "The
 * JavaScript replica in modules"), so an embedder imports this one file.
 *
 * How this works. It is the JavaScript twin of the Python packages, rule for rule:
 * - `Conversation` folds change records exactly as `sync/conversation.py` does: a record is
 *   read (its shape checked, defaults filled, like msgspec's decoder), then checked against
 *   every fit rule, and only then applied; a misfit throws `ApplyError` with the same `reason`
 *   as Python and changes nothing.
 * - `rebase` replays pending records by intent, as `sync/rebase.py`.
 * - `ReplicaSession` is `client/session.py`: frames in, frames and events out, no socket.
 * - `connect` is the thin shell: a `WebSocket`, reconnects with capped exponential backoff and
 *   full jitter, and the refusal rule of SPEC §5 (codes that mean "refused for good" are never
 *   retried).
 * The vectors in `tests/vectors/` (generated from the Python model) are the shared spec; both
 * languages run them.
 *
 * Offsets into text (drafts) count Unicode code points: use `codePoints(text)`, never
 * `text.length`.
 *
 * Use:
 *   import { connect, Message } from './convsync.js';
 *   const replica = connect('ws://127.0.0.1:8765', 'demo', { getToken: () => token });
 *   replica.on('state', ({ state }) => show(state));       // connecting, connected, ...
 *   replica.on('*', (event) => render(replica.conversation)); // applied, rebased, conflict...
 *   await replica.ready;
 *   replica.conversation.push(Message.user('hello'));       // pushed by itself
 *   await replica.flush();                                   // acknowledged by the hub
 */

export {
  ConvsyncError,
  ApplyError,
  ProtocolError,
  DecodeError,
  UsageError,
  Refused,
  CODES,
  retryOf,
  closeCodeOf,
  codeOfClose,
} from './lib/errors.js';
export { codePoints, sliceCodePoints } from './lib/text.js';
export { isMessageId, isAsideId, madeMs, IdMinter, defaultMinter, Lineage } from './lib/ids.js';
export { STOPPED, Message, Author, isFailedReply, isStopMarker } from './lib/messages.js';
export { readRecord } from './lib/records.js';
export { jsonEqual, Conversation } from './lib/conversation.js';
export { diff, mergeText, mergeMessage, mergeEntry, mergeAside } from './lib/merge.js';
export { needsBase, rebase } from './lib/rebase.js';
export {
  STEP_KIND,
  QUEUED_KIND,
  STOP_KIND,
  REJECTS,
  rejectRule,
  isUserText,
  queuedId,
  queuedEntryId,
  queueRecords,
  stepPending,
  midStep,
  stop,
} from './lib/steer.js';
export {
  APPROVAL_KIND,
  TOOLS_KIND,
  approvalOf,
  approvals,
  findApproval,
  ask,
  decide,
  decidedMeanwhile,
  schemaProblem,
  answerProblem,
  resultOf,
} from './lib/approvals.js';
export { SUBPROTOCOL, MAX_FRAME } from './lib/frames.js';
export { ReplicaSession } from './lib/session.js';
export { appendToDraft, people } from './lib/live.js';
export { retryRule, backoffDelay, whenEnded } from './lib/reconnect.js';
export { Replica, connect } from './lib/replica.js';
export { openEarly } from './lib/early.js';
export { LAYOUT as OUTBOX_LAYOUT, Outbox } from './lib/persist.js';
export { SummaryFeed } from './lib/summary.js';
export { OPEN_WAIT as SHARED_OPEN_WAIT, sharedLink } from './lib/shared.js';

// @ts-check
// Steering a running agent (SPEC §10): the twin of `sync/steer.py`.
import { Author, isFailedReply, isStopMarker } from './messages.js';

/** A model call is under way: value `{turn, at}`. */
export const STEP_KIND = 'rig.step';
/** User input waiting for the step to end: value the entry. */
export const QUEUED_KIND = 'rig.queued';
/** The user asked the turn to stop: value `{turn, at}`. */
export const STOP_KIND = 'rig.stop';

/**
 * What a replica does with a push rejected for each reason (`sync.errors.REJECTS`): replay it
 * once the records it missed arrive, report its records as conflicts, or queue its user text.
 * @type {Readonly<Record<string, 'replay' | 'final' | 'queue'>>}
 */
export const REJECTS = Object.freeze({
  behind: 'replay',
  lineage: 'replay',
  invalid: 'final',
  forbidden: 'final',
  queued: 'queue',
  superseded: 'final',
  turn_ended: 'final',
  pinned: 'final',
  decided: 'final',
  asked: 'final',
  forged: 'final',
  bad_answer: 'final',
});

/** The rule for a reject `reason`; final when unknown (a newer hub). @param {string} reason */
export function rejectRule(reason) {
  return Object.hasOwn(REJECTS, reason) ? REJECTS[reason] : 'final';
}

/** Whether `entry` is the user's own message (a user message holding no tool result, and not
 * the STOPPED note, which a worker's answer after a stop carries and which never waits). */
export function isUserText(entry) {
  const message = entry.message;
  return (
    message.role === 'user' &&
    !message.content.some((part) => part.type === 'tool_result') &&
    !isStopMarker(entry)
  );
}

/** The id of the queued aside holding entry `entryId`. @param {string} entryId */
export function queuedId(entryId) {
  return 'aside_' + entryId.slice('msg_'.length);
}

/** The id of the entry queued aside `asideId` holds. @param {string} asideId */
export function queuedEntryId(asideId) {
  return 'msg_' + asideId.slice('aside_'.length);
}

/**
 * The rebase rule for a push refused `queued` (`sync.steer.queue_records`): each entry of the
 * user's own text a push brings becomes a `rig.queued` aside put, in order, drawn after
 * `after`; the other entries of that push stay a push before them; other records stay.
 * Null when no record pushes user text.
 * @param {ChangeRecord[]} records @param {string | null} after @returns {ChangeRecord[] | null}
 */
export function queueRecords(records, after) {
  if (!records.some((r) => r.change.type === 'push' && r.change.entries.some(isUserText))) {
    return null;
  }
  const replayed = [];
  for (const record of records) {
    const change = record.change;
    if (change.type !== 'push') {
      replayed.push(record);
      continue;
    }
    // A STOPPED note pushed before the user's text goes: the landing puts one itself while
    // the halt stands (a note alone must never land mid-step).
    const typed = change.entries.some(isUserText);
    const rest = change.entries.filter(
      (entry) => !isUserText(entry) && !(typed && isStopMarker(entry)),
    );
    if (rest.length > 0) {
      replayed.push(
        rest.length === change.entries.length
          ? record
          : { ...record, change: { type: 'push', entries: rest } },
      );
    }
    for (const entry of change.entries) {
      if (!isUserText(entry)) continue;
      const author = entry.author ?? Author.user();
      const value = {
        message: entry.message,
        id: entry.id,
        author: entry.author ?? null,
        source_id: entry.source_id ?? null,
      };
      const aside = { kind: QUEUED_KIND, after, author, value, saved: true };
      replayed.push({
        change: { type: 'aside', id: queuedId(entry.id), aside },
        by: author,
        at: record.at ?? null,
      });
    }
  }
  return replayed;
}

/**
 * Whether the last assistant message a model reads has a call nothing answers yet, read from
 * the end back to it (as `sync.steer.step_pending`). @param {Conversation} conversation
 */
export function stepPending(conversation) {
  /** @type {Map<string, number>} */
  const answered = new Map();
  for (let at = conversation.length - 1; at >= 0; at -= 1) {
    const message = /** @type {Entry} */ (conversation.entry(at)).message;
    if (message.role === 'user') {
      const results = message.content.filter((part) => part.type === 'tool_result');
      if (results.length !== message.content.length) return false;
      for (const result of results)
        answered.set(result.call_id, (answered.get(result.call_id) ?? 0) + 1);
    } else if (message.role === 'assistant') {
      if (isFailedReply(message)) return false;
      for (const part of message.content) {
        if (part.type !== 'tool_call') continue;
        const left = answered.get(part.id) ?? 0;
        if (left === 0) return true;
        answered.set(part.id, left - 1);
      }
      return false;
    }
  }
  return false;
}

/**
 * Whether `conversation` is mid-step (SPEC §10): a `rig.step` marker stands, or the last
 * assistant message a model reads has pending calls. @param {Conversation} conversation
 */
export function midStep(conversation) {
  if (conversation.asides().some(([, aside]) => aside.kind === STEP_KIND)) return true;
  return stepPending(conversation);
}

/**
 * Ask the running turn to stop (SPEC §10), as `Replica.stop` in Python: while a turn record
 * is open or `conversation` is mid-step, put a stop request (`rig.stop`, value `{turn, at}`);
 * otherwise halt the user's last request `stopped`. Whether anything was asked. The request's
 * author names `sub`, who the hub knows this connection as (`welcome.sub`; the hub checks it).
 * @param {Conversation} conversation @param {number} [now] @param {string} [sub]
 */
export function stop(conversation, now = Date.now(), sub = 'anonymous') {
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  const openTurn = last !== null && last.end === null ? last.index : null;
  if (openTurn === null && !midStep(conversation)) return conversation.halt('stopped');
  if (conversation.asides().some(([, aside]) => aside.kind === STOP_KIND)) return true;
  const after = conversation.length > 0 ? conversation.id(conversation.length - 1) : null;
  const value = { turn: openTurn, at: now };
  const author = { kind: 'user', name: sub, request: null, title: null };
  conversation.addAside({ kind: STOP_KIND, after, author, value, saved: true });
  return true;
}

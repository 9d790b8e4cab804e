// How one entry of the log is drawn: messages and their parts, tool results beside their calls,
// compactions folded, approval cards' data, queued input, drafts.

import { STOP_KIND, approvals, isStopMarker, madeMs, midStep, stop } from '../convsync.js';
import { h, richText, timeOf, authorLabel, jsonText } from './dom.js';

export function compactionsBySummary(conversation) {
  const found = new Map();
  for (const [, aside] of conversation.asides()) {
    const value = aside.kind === 'rig.compacted' ? aside.value : null;
    if (value && typeof value.summary === 'string' && Array.isArray(value.originals)) {
      found.set(value.summary, value);
    }
  }
  return found;
}

/**
 * A summary's originals, folded under it: a closed `<details>` holding each original entry
 * drawn as the log draws one (text nodes only), marked as an original, not a live entry.
 */
export function drawCompacted(compaction) {
  const originals = compaction.originals.filter(
    (entry) => entry && typeof entry === 'object' && entry.message,
  );
  /** @type {Map<string, any>} */
  const results = new Map();
  for (const entry of originals) {
    if (entry.message.role !== 'user' || !Array.isArray(entry.message.content)) continue;
    for (const part of entry.message.content) {
      if (part.type === 'tool_result') results.set(part.call_id, part);
    }
  }
  const list = h('ol', { class: 'originals' });
  for (const entry of originals) {
    const element = drawEntry({ ...entry, id: entry.id ?? null }, false, results, undefined);
    element.removeAttribute('data-entry-id'); // not in the log: nothing may act on it there
    element.setAttribute('data-original-id', String(entry.id ?? ''));
    list.append(element);
  }
  const count = originals.length;
  return h(
    'details',
    { class: 'compacted', 'data-compacted': String(count) },
    h('summary', {}, `${count} earlier message${count === 1 ? '' : 's'}, compacted`),
    list,
  );
}

/** The approvals drawn under each entry (`after`), by entry id. */
export function approvalsByEntry(conversation) {
  /** @type {Map<string, [string, any][]>} */
  const byEntry = new Map();
  for (const [id, approval] of approvals(conversation)) {
    const after = conversation.aside(id)?.after;
    if (typeof after !== 'string') continue;
    if (!byEntry.has(after)) byEntry.set(after, []);
    byEntry.get(after).push([id, approval]);
  }
  return byEntry;
}

export function approvalStamp(asked, replica) {
  return asked
    .map(([id, a]) => `${id}:${a.state}:${a.decided_by}:${replica.mayDecideOn(a)}`)
    .join(',');
}

/** The values a simple schema allows (an `enum`, a `boolean`), or null for a free answer. */
export function choicesOf(schema) {
  if (schema === null || typeof schema !== 'object') return null;
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum;
  if (schema.type === 'boolean') return [true, false];
  return null;
}

export function displayed(value) {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * A question's typed answer as its schema wants it: text for a string (or no schema), else
 * the text read as JSON when it parses (a number, `true`), else the text itself (the schema
 * check then says what is wrong).
 */
export function answerValue(schema, text) {
  const type = schema && typeof schema === 'object' ? schema.type : undefined;
  if (schema === null || type === 'string' || (type === undefined && !('enum' in (schema ?? {})))) {
    return text;
  }
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export function turnStamp(turn) {
  return turn === undefined ? '' : `${turn.index}:${turn.end?.how ?? ''}`;
}

/** A number per object, for stamps: a result part edited (say, redacted) is a new object. */
const identities = new WeakMap();
let identitiesMade = 0;
export function identity(object) {
  let id = identities.get(object);
  if (id === undefined) {
    identitiesMade += 1;
    id = identitiesMade;
    identities.set(object, id);
  }
  return id;
}

/**
 * What an assistant entry's drawing shows of its calls' results: which one each call has, so
 * that a result edited after it was drawn (a secret redacted) is drawn again, not only one
 * that came or went.
 */
export function resultStamp(entry, results) {
  if (entry.message.role !== 'assistant') return '';
  let stamp = '';
  for (const part of entry.message.content) {
    if (part.type !== 'tool_call') continue;
    const result = results.get(part.id);
    stamp += result === undefined ? '-,' : `${identity(result)},`;
  }
  return stamp;
}

/** Whether Stop does something now: a turn is open, a step is under way, or a request is owed
 * (then it halts); and no stop request stands already. @param {any} conversation */
export function canStop(conversation) {
  if (conversation.asides().some(([, aside]) => aside.kind === STOP_KIND)) return false;
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  return (last !== null && last.end === null) || midStep(conversation) || conversation.awaitsModel();
}

/** A queued message: its text (as text), "queued", and "unsend" for its sender.
 * @param {string} id @param {any} aside @param {boolean} mine @param {() => void} unsend */
export function drawQueued(id, aside, mine, unsend) {
  const message = aside.value?.message;
  const text = Array.isArray(message?.content)
    ? message.content
        .filter((part) => part.type === 'text')
        .map((part) => part.text)
        .join('')
    : '';
  const body = h('div', { class: 'text', dir: 'auto' });
  body.textContent = text;
  const element = h(
    'li',
    { class: 'entry queued', 'data-queued-id': id, 'data-role': 'user', 'data-mine': String(mine) },
    h('span', { class: 'label' }, 'queued'),
    body,
  );
  if (mine) {
    const button = h('button', { type: 'button', 'data-action': 'unsend' }, 'unsend');
    button.addEventListener('click', unsend);
    element.append(button);
  }
  return element;
}

/** One entry's element: role, author, time, its parts as text; calls with their results. */
export function drawEntry(entry, pending, results, turn) {
  const message = entry.message;
  const onlyResults =
    message.role === 'user' &&
    message.content.length > 0 &&
    message.content.every((part) => part.type === 'tool_result');
  const classes = ['entry', message.role];
  if (onlyResults) classes.push('results');
  if (pending) classes.push('pending');
  if (isStopMarker(entry)) classes.push('stop-note');
  const element = h('li', {
    class: classes.join(' '),
    'data-entry-id': entry.id ?? '',
    'data-role': message.role,
    'data-pending': pending ? 'true' : null,
  });
  if (turn !== undefined) {
    const end = turn.end === null ? 'running' : turn.end.how;
    element.append(
      h('div', { class: 'turn', 'data-turn': String(turn.index) }, `turn ${turn.index} · ${end}`),
    );
  }
  const made = entry.id !== null ? madeMs(entry.id) : null;
  element.append(
    h(
      'div',
      { class: 'meta' },
      h('span', { class: 'who' }, authorLabel(entry.author, message.role)),
      made !== null && !Number.isNaN(made) ? h('time', {}, timeOf(made)) : null,
      pending ? h('span', { class: 'badge' }, 'sending') : null,
    ),
  );
  if (message.role === 'system') {
    element.append(richText(message.content));
    return element;
  }
  for (const part of message.content) element.append(drawPart(part, results));
  if (
    message.role === 'assistant' &&
    message.stop &&
    !['stop', 'tool_use'].includes(message.stop.reason)
  ) {
    const why = message.stop.detail ? `: ${message.stop.detail}` : '';
    element.append(h('div', { class: 'stopped' }, `(${message.stop.reason}${why})`));
  }
  return element;
}

export function drawPart(part, results) {
  switch (part.type) {
    case 'text':
      return richText(part.text);
    case 'reasoning':
      return h(
        'details',
        { class: 'reasoning' },
        h('summary', {}, part.redacted ? 'reasoning (redacted)' : 'reasoning'),
        h('div', { class: 'text' }, part.text),
      );
    case 'tool_call': {
      const result = results.get(part.id);
      return h(
        'div',
        { class: 'call', 'data-call-id': part.id },
        h('div', { class: 'call-head' }, `⚙ ${part.name}`),
        h('pre', { class: 'args' }, jsonText(part.arguments)),
        result === undefined
          ? h('div', { class: 'waiting' }, 'waiting for the result…')
          : drawResult(result),
      );
    }
    case 'tool_result':
      return h(
        'div',
        { class: 'result-ref', 'data-result-ref': part.call_id },
        `↳ ${part.is_error ? 'error from' : 'result of'} ${part.name}`,
      );
    case 'json':
      return h('pre', { class: 'json' }, jsonText(part.value));
    case 'image':
      return h('div', { class: 'attachment' }, `[image ${part.media_type}]`);
    case 'document':
      return h('div', { class: 'attachment' }, `[document ${part.name ?? part.media_type}]`);
    default:
      return h('pre', { class: 'json' }, jsonText(part));
  }
}

export function drawResult(result) {
  const body = result.content.map((part) =>
    part.type === 'text'
      ? part.text
      : part.type === 'json'
        ? jsonText(part.value)
        : `[${part.type}]`,
  );
  return h(
    'div',
    { class: result.is_error ? 'result error' : 'result', 'data-result-for': result.call_id },
    h('pre', {}, body.join('\n')),
  );
}

export function fillDraft(element, draft) {
  const children = [
    h(
      'div',
      { class: 'meta' },
      h('span', { class: 'who' }, authorLabel(draft.author, draft.role)),
      h('span', { class: 'badge live' }, 'writing…'),
    ),
  ];
  for (const [part, text] of Object.entries(draft.parts)) {
    if (part === 'text') children.push(h('div', { class: 'text', 'data-part': part }, text));
    else if (part === 'reasoning') {
      children.push(
        h(
          'details',
          { class: 'reasoning' },
          h('summary', {}, 'reasoning'),
          h('div', { class: 'text' }, text),
        ),
      );
    } else if (part.startsWith('call:')) {
      children.push(
        h(
          'div',
          { class: 'call', 'data-call-id': part.slice(5) },
          h('div', { class: 'call-head' }, `⚙ ${draft.names[part] ?? 'tool'}`),
          h('pre', { class: 'args' }, text),
        ),
      );
    }
  }
  element.replaceChildren(...children);
}

// ---------------------------------------------------------------- editing in place (SPEC §16)

/**
 * Editing a message or a note in place, for a token with `write`, and the conflicts it meets.
 *
 * An edit is saved on the text it was opened on: when the log changed that entry (or note)
 * while the editor was open, the page merges the two edits three ways (`mergeEntry`,
 * `mergeAside`, as the replica's rebase does) before it records anything, so an edit it heard
 * of is never written over. An edit already sent meets the ones it had not heard of in the
 * replica's rebase: merged there, or a `Conflict(edited)` event. Either way a clash is shown
 * with both versions; "Keep the log's" drops this page's version, "Put mine back" records it
 * again as a new edit of the version the log holds now.
 */

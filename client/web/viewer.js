// The convsync viewer: `/` lists conversations live, `/c/{id}` shows one live and steers it.
//
// How this works: the page is an embedder of convsync.js like any other. The conversation page
// opens a `Replica` with `live: true` and redraws from its value on every event, at most once a
// frame: entries are keyed by id and reused, and only the last WINDOW entries are in the page
// until the reader scrolls up (so 10,000 messages cost what 150 do). The list page follows a
// `SummaryFeed`. Everything a model, a tool or a presence status wrote goes in with
// `textContent` (or an attribute value): never as markup.

import {
  Author,
  Message,
  QUEUED_KIND,
  STOP_KIND,
  SummaryFeed,
  approvals,
  connect,
  isStopMarker,
  jsonEqual,
  madeMs,
  mergeAside,
  mergeEntry,
  midStep,
  stop,
} from './convsync.js';
import { markdown } from './markdown.js';

const WINDOW = 150; // entries drawn at first
const STEP = 200; // more when the reader scrolls to the top
const NEAR_BOTTOM = 80; // px: a reader this close to the end follows new messages

// ---------------------------------------------------------------- the token (SPEC §8)

/** Read `#token=...` once, take it out of the address bar, keep it in memory only. */
function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get('token');
  if (token !== null) {
    history.replaceState(history.state, '', location.pathname + location.search);
  }
  return token;
}

// The token in use: replaced when the address gets a new `#token=` (`hashchange`), or when
// the page asks for one after the hub refused it, so the page outlives one token's TTL.
let token = takeToken();
const getToken = () => token;
const hubUrl = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}`;

// ---------------------------------------------------------------- DOM helpers (text only)

/**
 * An element with attributes and children; strings become text nodes. No markup is parsed.
 * @param {string} tag @param {Record<string, string | null | undefined>} [attrs]
 * @param {...(Node | string | null | undefined | false)} children
 */
function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) element.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    element.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return element;
}

/**
 * A message's text drawn as safe markdown (`markdown.js`: a fixed set of elements, text nodes
 * only, links to http(s) only), in a `.text` block whose direction follows its text.
 * @param {string} text
 */
function richText(text) {
  const draw = (node) =>
    typeof node === 'string' ? node : h(node.tag, node.attrs ?? {}, ...node.children.map(draw));
  return h('div', { class: 'text', dir: 'auto' }, ...markdown(text).map(draw));
}

function timeOf(ms) {
  if (typeof ms !== 'number') return '';
  const date = new Date(ms);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
}

function authorLabel(author, role) {
  if (author === null || author === undefined) return role;
  const name = author.name ?? author.title;
  return name ? `${role} · ${name}` : `${role} · ${author.kind}`;
}

function jsonText(value) {
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

// ---------------------------------------------------------------- the conversation page

class ConversationView {
  /** @param {HTMLElement} root @param {string} conversationId */
  constructor(root, conversationId) {
    this.root = root;
    this.id = conversationId;
    this.replica = connect(hubUrl, conversationId, { live: true, getToken });
    this.window = WINDOW;
    /** @type {Map<string, {entry: any, element: HTMLElement, stamp: string}>} */
    this.drawn = new Map();
    /** @type {Map<string, HTMLElement>} */
    this.draftElements = new Map();
    /** @type {Map<string, HTMLElement>} */
    this.queuedElements = new Map();
    /** Queued asides this page put (SPEC §10: only the sender may withdraw one). */
    this.mine = new Set();
    this.scheduled = false;
    this.build();
    this.editing = new Editing(this); // edit in place, conflicts, notes (SPEC §16)
    this.replica.on('*', () => this.schedule());
    this.replica.on('queued', (event) => {
      if (event.mine) for (const id of event.ids) this.mine.add(id);
    });
    this.replica.progress.add(() => this.schedule()); // acks move no value but end "sending"
    this.replica.on('state', (event) => {
      root.dataset.connectionState = event.state;
      this.stateLabel.textContent = event.state + (event.code ? ` (${event.code})` : '');
      this.schedule();
    });
    this.replica.on('refused', (error) => {
      this.notice.replaceChildren(`refused: ${error.code} ${error.detail ?? ''}`);
      if (error.code === 'unauthorized') this.notice.append(tokenPrompt());
      this.notice.hidden = false;
    });
    this.replica.on('conflict', (event) => {
      if (event.reason !== 'decided') return;
      // Someone decided first (SPEC §12): their decision stands and the card shows it.
      this.notice.replaceChildren('Someone else decided first; their decision stands.');
      this.notice.hidden = false;
    });
    root.dataset.connectionState = this.replica.state;
    this.schedule();
  }

  build() {
    const back = h('a', { href: '/', class: 'back' }, '← all');
    back.addEventListener('click', (event) => carryToken(event, '/'));
    this.stateLabel = h('span', { class: 'state' }, 'connecting');
    this.revisionLabel = h('span', { class: 'revision' });
    this.pendingLabel = h('span', { class: 'pending', hidden: '' });
    this.presence = h('ul', { class: 'presence', 'aria-label': 'online' });
    this.notice = h('p', { class: 'notice', hidden: '' });
    this.halt = h('p', { class: 'halt', hidden: '' });
    this.more = h('button', { type: 'button', class: 'more', hidden: '' }, 'show earlier');
    this.more.addEventListener('click', () => this.showEarlier());
    this.log = h('ol', { class: 'log' });
    this.drafts = h('ol', { class: 'drafts', 'aria-live': 'polite' });
    // Input typed mid-step waits here until the step ends (SPEC §10), with "unsend".
    this.queue = h('ol', { class: 'queue', 'aria-label': 'queued', 'aria-live': 'polite' });
    this.scroller = h('div', { class: 'scroller' }, this.more, this.log, this.drafts, this.queue);
    this.scroller.addEventListener('scroll', () => {
      if (this.scroller.scrollTop < 40 && !this.more.hidden) this.showEarlier();
    });
    this.input = /** @type {HTMLTextAreaElement} */ (
      h('textarea', {
        name: 'message',
        rows: '2',
        placeholder: 'Message (Enter sends, Shift+Enter for a new line)',
        'aria-label': 'message',
      })
    );
    this.send = h('button', { type: 'submit', 'data-action': 'send' }, 'Send');
    this.stop = h('button', { type: 'button', 'data-action': 'stop', class: 'stop' }, 'Stop');
    const form = h('form', { class: 'composer' }, this.input, this.send, this.stop);
    this.composer = form;
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.sendMessage();
    });
    this.input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.sendMessage();
      }
    });
    this.stop.addEventListener('click', () => {
      // A stop request while a turn runs (the worker finishes it), else a halt (SPEC §10).
      stop(this.replica.conversation, Date.now(), this.replica.session.sub);
      this.schedule();
    });
    const header = h(
      'header',
      { class: 'bar' },
      back,
      h('h1', {}, this.id),
      this.stateLabel,
      this.revisionLabel,
      this.pendingLabel,
      this.presence,
    );
    this.root.replaceChildren(header, this.notice, this.halt, this.scroller, form);
    document.title = `${this.id} · convsync`;
  }

  /** Whether this connection may write (the scopes `welcome` gave; none listed: no auth). */
  get canWrite() {
    const scopes = this.replica.session.welcome?.scopes;
    return !Array.isArray(scopes) || scopes.includes('write');
  }

  sendMessage() {
    const text = this.input.value;
    if (text.trim() === '' || !this.canWrite) return;
    this.replica.conversation.push({ message: Message.user(text), author: Author.user() });
    this.input.value = '';
    this.follow = true;
    this.schedule();
  }

  showEarlier() {
    const before = this.scroller.scrollHeight;
    this.window += STEP;
    this.render();
    this.scroller.scrollTop += this.scroller.scrollHeight - before; // keep the reader's place
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.render();
    });
  }

  render() {
    // A read-only token gets no composer and no Stop: the hub would refuse what they send.
    this.composer.hidden = !this.canWrite;
    const scroller = this.scroller;
    const atBottom =
      this.follow ||
      scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < NEAR_BOTTOM;
    this.follow = false;
    const replica = this.replica;
    const conversation = replica.conversation;
    this.revisionLabel.textContent = `rev ${replica.revision}`;
    const pending = replica.pending;
    this.pendingLabel.hidden = pending === 0;
    this.pendingLabel.textContent = `${pending} pending`;
    const halt = conversation.halted();
    this.halt.hidden = halt === null;
    this.halt.textContent = halt === 'stopped' ? 'Stopped: the agent halts here.' : `halt: ${halt}`;
    this.renderEntries(conversation);
    this.editing.render(conversation);
    this.renderDrafts();
    this.renderQueue(conversation);
    this.stop.disabled = !canStop(conversation);
    this.renderPresence();
    if (atBottom) scroller.scrollTop = scroller.scrollHeight;
  }

  renderEntries(conversation) {
    const length = conversation.length;
    const start = Math.max(0, length - this.window);
    this.more.hidden = start === 0;
    this.more.textContent = `show earlier (${start} more)`;
    const confirmed = this.replica.session.confirmed;
    // Tool results by call id, and turn starts, over what is drawn (a result follows its call).
    /** @type {Map<string, any>} */
    const results = new Map();
    for (let at = start; at < length; at += 1) {
      const message = conversation.entry(at).message;
      if (message.role !== 'user') continue;
      for (const part of message.content) {
        if (part.type === 'tool_result') results.set(part.call_id, part);
      }
    }
    /** @type {Map<string, any>} */
    const turns = new Map();
    for (const [, turn] of conversation.turns()) turns.set(turn.start, turn);
    const compactions = compactionsBySummary(conversation);
    const cards = approvalsByEntry(conversation);
    const keep = new Set();
    let previous = null;
    for (let at = start; at < length; at += 1) {
      const entry = conversation.entry(at);
      const key = entry.id ?? `at:${at}`;
      keep.add(key);
      const pending = entry.id !== null && !confirmed.holds(entry.id);
      let drawn = this.drawn.get(key);
      const compaction = compactions.get(key);
      const asked = cards.get(key) ?? [];
      const stamp =
        `${pending}|${turnStamp(turns.get(key))}|${resultStamp(entry, results)}` +
        `|${compaction === undefined ? '' : identity(compaction)}|${this.editing.stamp(key)}` +
        `|${approvalStamp(asked, this.replica)}`;
      // An entry being edited keeps its editor while the log changes under it.
      const changed = drawn !== undefined && drawn.entry !== entry && !this.editing.holds(key);
      if (drawn === undefined || changed || drawn.stamp !== stamp) {
        const element = this.editing.decorate(entry, drawEntry(entry, pending, results, turns.get(key)));
        if (compaction !== undefined) element.append(drawCompacted(compaction));
        for (const [id, approval] of asked) element.append(this.drawApproval(id, approval));
        if (drawn !== undefined) drawn.element.replaceWith(element);
        drawn = { entry, element, stamp };
        this.drawn.set(key, drawn);
      }
      const want = previous === null ? this.log.firstChild : previous.nextSibling;
      if (want !== drawn.element) this.log.insertBefore(drawn.element, want);
      previous = drawn.element;
    }
    for (const [key, drawn] of this.drawn) {
      if (!keep.has(key)) {
        drawn.element.remove();
        this.drawn.delete(key);
      }
    }
  }

  /** The queued input (`rig.queued` asides), in order, each until its entry lands. */
  renderQueue(conversation) {
    const standing = new Map();
    for (const [id, aside] of conversation.asides()) {
      if (aside.kind === QUEUED_KIND) standing.set(id, aside);
    }
    const confirmed = this.replica.session.confirmed;
    for (const [id, element] of this.queuedElements) {
      if (!standing.has(id)) {
        element.remove();
        this.queuedElements.delete(id);
      }
    }
    for (const [id, aside] of standing) {
      // Mine: put by this page (its `queued` event), or not yet in the log at all.
      const mine = this.mine.has(id) || confirmed.aside(id) === null;
      let element = this.queuedElements.get(id);
      if (element === undefined || element.dataset.mine !== String(mine)) {
        const fresh = drawQueued(id, aside, mine && this.canWrite, () => {
          this.replica.conversation.removeAside(id); // withdraw: only until it lands
          this.schedule();
        });
        if (element !== undefined) element.replaceWith(fresh);
        else this.queue.append(fresh);
        element = fresh;
        this.queuedElements.set(id, element);
      }
    }
  }

  /**
   * An approval card (SPEC §12): the question, then Approve / Deny with a reason (a text
   * answer for a question) for a token that may decide it, else who decided what; the
   * decision and who made it are shown to everyone.
   * @param {string} id @param {any} approval
   */
  drawApproval(id, approval) {
    const question = approval.call === null;
    const card = h('div', {
      class: `approval ${approval.state}`,
      'data-approval-id': id,
      'data-approval-state': approval.state,
      'data-approval-key': approval.key,
    });
    const what = question ? 'Question' : `Approve call ${approval.key}?`;
    card.append(h('div', { class: 'approval-title' }, what));
    if (approval.prompt) card.append(h('div', { class: 'approval-prompt', dir: 'auto' }, approval.prompt));
    if (approval.state !== 'open') {
      const who = approval.decided_by ? ` by ${approval.decided_by}` : '';
      const answer =
        approval.answer !== null && approval.answer !== undefined
          ? `: ${typeof approval.answer === 'string' ? approval.answer : jsonText(approval.answer)}`
          : '';
      const why = approval.reason ? ` (${approval.reason})` : '';
      card.append(h('div', { class: 'approval-decision' }, `${approval.state}${who}${answer}${why}`));
      return card;
    }
    if (!this.replica.mayDecideOn(approval)) {
      card.append(h('div', { class: 'approval-decision' }, 'waiting for a person'));
      return card;
    }
    const choices = question ? choicesOf(approval.schema) : null;
    /** @type {HTMLInputElement | HTMLSelectElement | null} */
    let answer = null;
    if (choices !== null) {
      // A simple schema (an enum, a boolean) is a form: pick one of its values.
      answer = /** @type {HTMLSelectElement} */ (
        h(
          'select',
          { name: 'answer', 'aria-label': 'answer' },
          ...choices.map((value, at) => h('option', { value: String(at) }, displayed(value))),
        )
      );
    } else if (question) {
      answer = /** @type {HTMLInputElement} */ (
        h('input', { name: 'answer', placeholder: 'answer', 'aria-label': 'answer' })
      );
    }
    const answerOf = () => {
      if (answer === null) return null;
      if (choices !== null) return choices[Number(answer.value)];
      return answerValue(approval.schema, answer.value);
    };
    const reason = /** @type {HTMLInputElement} */ (
      h('input', { name: 'reason', placeholder: 'reason (optional)', 'aria-label': 'reason' })
    );
    const error = h('div', { class: 'approval-error', hidden: '' });
    const decideWith = (approve) => {
      try {
        this.replica.decide(id, {
          approve,
          answer: approve ? answerOf() : null,
          reason: reason.value.trim() === '' ? null : reason.value,
        });
      } catch (caught) {
        error.textContent = caught instanceof Error ? caught.message : String(caught);
        error.hidden = false;
        return;
      }
      this.schedule();
    };
    const yes = h('button', { type: 'button', 'data-action': 'approve' }, question ? 'Answer' : 'Approve');
    const no = h('button', { type: 'button', 'data-action': 'deny' }, 'Deny');
    yes.addEventListener('click', () => decideWith(true));
    no.addEventListener('click', () => decideWith(false));
    card.append(h('div', { class: 'approval-actions' }, answer, reason, yes, no), error);
    return card;
  }

  renderDrafts() {
    const drafts = this.replica.drafts;
    const stopping = this.replica.conversation
      .asides()
      .some(([, aside]) => aside.kind === STOP_KIND);
    for (const [id, element] of this.draftElements) {
      if (!drafts.has(id)) {
        element.remove();
        this.draftElements.delete(id);
      }
    }
    for (const [id, draft] of drafts) {
      let element = this.draftElements.get(id);
      if (element === undefined) {
        element = h('li', { class: 'entry draft', 'data-draft-id': id, 'data-role': draft.role });
        this.draftElements.set(id, element);
        this.drafts.append(element);
      }
      fillDraft(element, draft);
      // Stopping (SPEC §10): kept on screen with its text, growing no more.
      if (stopping) element.dataset.status = 'stopping';
      else delete element.dataset.status;
    }
  }

  renderPresence() {
    // One item per person: with tokens, the connections of one principal (a second tab, a
    // phone) are that person; without them (`anonymous`), each client id is its own.
    /** @type {Map<string, any[]>} */
    const byWho = new Map();
    for (const item of this.replica.presence.values()) {
      const principal = typeof item.principal === 'string' ? item.principal : 'anonymous';
      const who =
        principal !== 'anonymous'
          ? `principal:${principal}`
          : `client:${String(item.client ?? item.connection)}`;
      if (!byWho.has(who)) byWho.set(who, []);
      byWho.get(who).push(item);
    }
    const items = [];
    for (const [who, connections] of byWho) {
      const first = connections[0];
      const client = String(first.client ?? first.connection);
      const status = connections.map((c) => c.status).find((s) => typeof s === 'string') ?? '';
      const mine = connections.some((c) => c.client === this.replica.client);
      const fallback = who.startsWith('principal:') ? who.slice('principal:'.length) : client;
      const label = mine ? 'you' : String(first.name ?? fallback);
      items.push(
        h(
          'li',
          {
            'data-presence-client': client,
            'data-presence-who': who,
            title: String(first.kind ?? ''),
          },
          h('span', { class: 'dot' }),
          label,
          status ? h('span', { class: 'status' }, status) : null,
        ),
      );
    }
    this.presence.replaceChildren(...items);
  }
}

// ---------------------------------------------------------------- compaction (SPEC 11)

/**
 * The `rig.compacted` asides by the id of their summary entry: what `compact` took out,
 * kept so `uncompact` can put it back (`{summary, originals}`).
 * @returns {Map<string, {summary: string, originals: any[]}>}
 */
function compactionsBySummary(conversation) {
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
function drawCompacted(compaction) {
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
function approvalsByEntry(conversation) {
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

function approvalStamp(asked, replica) {
  return asked
    .map(([id, a]) => `${id}:${a.state}:${a.decided_by}:${replica.mayDecideOn(a)}`)
    .join(',');
}

/** The values a simple schema allows (an `enum`, a `boolean`), or null for a free answer. */
function choicesOf(schema) {
  if (schema === null || typeof schema !== 'object') return null;
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum;
  if (schema.type === 'boolean') return [true, false];
  return null;
}

function displayed(value) {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * A question's typed answer as its schema wants it: text for a string (or no schema), else
 * the text read as JSON when it parses (a number, `true`), else the text itself (the schema
 * check then says what is wrong).
 */
function answerValue(schema, text) {
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

function turnStamp(turn) {
  return turn === undefined ? '' : `${turn.index}:${turn.end?.how ?? ''}`;
}

/** A number per object, for stamps: a result part edited (say, redacted) is a new object. */
const identities = new WeakMap();
let identitiesMade = 0;
function identity(object) {
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
function resultStamp(entry, results) {
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
function canStop(conversation) {
  if (conversation.asides().some(([, aside]) => aside.kind === STOP_KIND)) return false;
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  return (last !== null && last.end === null) || midStep(conversation) || conversation.awaitsModel();
}

/** A queued message: its text (as text), "queued", and "unsend" for its sender.
 * @param {string} id @param {any} aside @param {boolean} mine @param {() => void} unsend */
function drawQueued(id, aside, mine, unsend) {
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
function drawEntry(entry, pending, results, turn) {
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

function drawPart(part, results) {
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

function drawResult(result) {
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

function fillDraft(element, draft) {
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
class Editing {
  /** @param {ConversationView} view */
  constructor(view) {
    this.view = view;
    /** @type {Map<string, {kind: 'entry' | 'note', base: any, form: HTMLElement, areas: HTMLTextAreaElement[], hint: HTMLElement, refocus: any}>} */
    this.open = new Map();
    /** @type {Map<string, {kind: 'entry' | 'note', theirs: any, ours: any}>} */
    this.conflicts = new Map();
    /** @type {Map<string, {aside: any, element: HTMLElement, stamp: string}>} */
    this.drawnNotes = new Map();
    this.notes = h('ol', { class: 'notes', 'aria-label': 'notes', hidden: '' });
    view.scroller.prepend(this.notes);
    view.replica.on('conflict', (event) => this.takeConflict(event));
  }

  get conversation() {
    return this.view.replica.conversation;
  }

  /** What of `key`'s drawing depends on editing: may write, editor open, conflict shown. */
  stamp(key) {
    const conflict = this.conflicts.get(key);
    const open = this.open.has(key) ? 'editing' : '';
    return `${this.view.canWrite}|${open}|${conflict === undefined ? '' : identity(conflict)}`;
  }

  /** Whether `key` has an editor open (its drawing is kept while the log changes). */
  holds(key) {
    return this.open.has(key);
  }

  /** `element` (an entry's drawing) with its Edit button, its editor or its conflict. */
  decorate(entry, element) {
    const id = entry.id;
    if (id === null) return element;
    const state = this.open.get(id);
    if (state !== undefined) {
      const blocks = element.querySelectorAll(':scope > .text');
      this.keepFocus(state);
      if (blocks.length > 0) blocks[0].replaceWith(state.form);
      else element.append(state.form);
      for (const block of Array.from(blocks).slice(1)) block.remove();
    } else if (this.view.canWrite && isEditable(entry)) {
      const meta = element.querySelector(':scope > .meta');
      const button = editButton(() => this.start('entry', id, entry));
      (meta ?? element).append(button);
    }
    const conflict = this.conflicts.get(id);
    if (conflict !== undefined) element.append(this.drawConflict(id, conflict));
    return element;
  }

  /** After the entries are drawn: the notes, each open editor's hint, focus put back. */
  render(conversation) {
    this.renderNotes(conversation);
    for (const [key, state] of this.open) {
      const now = this.current(state.kind, key);
      if (now === null) {
        state.hint.textContent = 'Removed meanwhile: saving does nothing.';
        state.hint.hidden = false;
      } else {
        const changed = !jsonEqual(
          state.kind === 'entry' ? now.message : now,
          state.kind === 'entry' ? state.base.message : state.base,
        );
        state.hint.textContent = 'Changed by someone else meanwhile: saving merges both edits.';
        state.hint.hidden = !changed;
      }
      const refocus = state.refocus;
      state.refocus = null;
      if (refocus !== null && state.form.isConnected) {
        const area = state.areas[refocus.at];
        area.focus();
        area.setSelectionRange(refocus.start, refocus.end);
      }
    }
  }

  /** The entry or note `key` as the page's value holds it now, or null. */
  current(kind, key) {
    const conversation = this.conversation;
    if (kind === 'note') return conversation.aside(key);
    const at = conversation.indexOf(key);
    return at === null ? null : conversation.entry(at);
  }

  /** Open an editor on `base` (the entry or note as drawn). */
  start(kind, key, base) {
    if (!this.view.canWrite || this.open.has(key)) return;
    const texts = kind === 'entry' ? textsOf(base.message) : [base.value.text];
    const areas = texts.map((text) => {
      const area = /** @type {HTMLTextAreaElement} */ (
        h('textarea', { name: 'edit', dir: 'auto', 'aria-label': 'edit', rows: '3' })
      );
      area.value = text;
      area.addEventListener('keydown', (event) => {
        if (event.key === 'Escape') this.cancel(key);
        else if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
          event.preventDefault();
          this.save(key);
        }
      });
      return area;
    });
    const hint = h('p', { class: 'edit-hint', hidden: '' });
    const save = h('button', { type: 'submit', 'data-action': 'save-edit' }, 'Save');
    const cancel = h('button', { type: 'button', 'data-action': 'cancel-edit' }, 'Cancel');
    cancel.addEventListener('click', () => this.cancel(key));
    const form = h('form', { class: 'editor' }, ...areas, hint, h('div', {}, save, cancel));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.save(key);
    });
    const end = areas.length > 0 ? areas[0].value.length : 0; // the caret at the text's end
    this.open.set(key, { kind, base, form, areas, hint, refocus: { at: 0, start: end, end } });
    this.conflicts.delete(key); // a new edit: the old clash is behind it
    this.view.schedule();
  }

  cancel(key) {
    this.open.delete(key);
    this.view.schedule();
  }

  /** Record the editor's text as an edit, merged with what the log changed since it opened. */
  save(key) {
    const state = this.open.get(key);
    if (state === undefined) return;
    this.open.delete(key);
    this.view.schedule();
    const conversation = this.conversation;
    const now = this.current(state.kind, key);
    if (now === null || !this.view.canWrite) return;
    const texts = state.areas.map((area) => area.value);
    if (state.kind === 'entry') {
      const mine = { ...state.base, message: withTexts(state.base.message, texts) };
      const merged = jsonEqual(now.message, state.base.message)
        ? mine
        : mergeEntry(state.base, now, mine);
      if (merged === null) {
        this.conflicts.set(key, { kind: 'entry', theirs: now, ours: mine });
        return;
      }
      if (jsonEqual(merged.message, now.message)) return;
      const at = /** @type {number} */ (conversation.indexOf(key));
      conversation.splice(at, at + 1, [{ ...now, message: merged.message }], Author.user());
    } else {
      const mine = { ...state.base, value: { ...state.base.value, text: texts[0] } };
      const merged = jsonEqual(now, state.base) ? mine : mergeAside(state.base, now, mine);
      if (merged === null) {
        this.conflicts.set(key, { kind: 'note', theirs: now, ours: mine });
        return;
      }
      if (jsonEqual(merged.value, now.value)) return;
      putNote(conversation, key, now, merged.value);
    }
  }

  /** A `Conflict(edited)` of one of this page's edits: shown with both versions. */
  takeConflict(event) {
    if (event.reason !== 'edited' || event.ours == null || event.theirs == null) return;
    const change = event.record.change;
    if (change.type === 'aside') {
      if (event.theirs.kind !== 'note') return;
      this.conflicts.set(change.id, { kind: 'note', theirs: event.theirs, ours: event.ours });
    } else if (change.type === 'splice' && typeof event.theirs.id === 'string') {
      this.conflicts.set(event.theirs.id, { kind: 'entry', theirs: event.theirs, ours: event.ours });
    }
    this.view.schedule();
  }

  /** The choice: keep the log's version (drop mine), or put mine back over it now. */
  resolve(key, putMine) {
    const conflict = this.conflicts.get(key);
    this.conflicts.delete(key);
    this.view.schedule();
    const now = conflict === undefined ? null : this.current(conflict.kind, key);
    if (!putMine || now === null || conflict === undefined || !this.view.canWrite) return;
    const conversation = this.conversation;
    if (conflict.kind === 'entry') {
      if (jsonEqual(now.message, conflict.ours.message)) return;
      const at = /** @type {number} */ (conversation.indexOf(key));
      conversation.splice(at, at + 1, [{ ...now, message: conflict.ours.message }], Author.user());
    } else if (!jsonEqual(now.value, conflict.ours.value)) {
      putNote(conversation, key, now, conflict.ours.value);
    }
  }

  /** Both versions and the choice; the log's as it stands now (it may have moved on). */
  drawConflict(key, conflict) {
    const now = this.current(conflict.kind, key) ?? conflict.theirs;
    const textOf = (item) =>
      conflict.kind === 'entry' ? textsOf(item.message).join('\n\n') : String(item.value.text);
    const version = (side, label, item) =>
      h(
        'div',
        { class: `version ${side}` },
        h('div', { class: 'version-label' }, label),
        h('div', { class: 'version-text', dir: 'auto' }, textOf(item)),
      );
    const keep = h('button', { type: 'button', 'data-action': 'keep-theirs' }, "Keep the log's");
    const mine = h('button', { type: 'button', 'data-action': 'put-mine' }, 'Put mine back');
    keep.addEventListener('click', () => this.resolve(key, false));
    mine.addEventListener('click', () => this.resolve(key, true));
    return h(
      'div',
      { class: 'conflict', 'data-conflict-for': key, role: 'alert' },
      h('p', {}, 'Someone else edited the same words at the same time; the log kept theirs.'),
      version('theirs', 'In the log', now),
      version('ours', 'Yours', conflict.ours),
      this.view.canWrite ? h('div', { class: 'choice' }, keep, mine) : null,
    );
  }

  /** The notes (asides of kind `note`), each editable like a message. */
  renderNotes(conversation) {
    const notes = conversation.asides().filter(([, aside]) => isNote(aside));
    this.notes.hidden = notes.length === 0;
    const keep = new Set();
    let previous = null;
    for (const [id, aside] of notes) {
      keep.add(id);
      let drawn = this.drawnNotes.get(id);
      const stamp = this.stamp(id);
      const changed = drawn !== undefined && drawn.aside !== aside && !this.holds(id);
      if (drawn === undefined || changed || drawn.stamp !== stamp) {
        const element = this.drawNote(id, aside);
        if (drawn !== undefined) drawn.element.replaceWith(element);
        drawn = { aside, element, stamp };
        this.drawnNotes.set(id, drawn);
      }
      const want = previous === null ? this.notes.firstChild : previous.nextSibling;
      if (want !== drawn.element) this.notes.insertBefore(drawn.element, want);
      previous = drawn.element;
    }
    for (const [id, drawn] of this.drawnNotes) {
      if (!keep.has(id)) {
        drawn.element.remove();
        this.drawnNotes.delete(id);
      }
    }
  }

  drawNote(id, aside) {
    const title = typeof aside.value.title === 'string' ? aside.value.title : '';
    const meta = h(
      'div',
      { class: 'meta' },
      h('span', { class: 'who' }, authorLabel(aside.author, 'note')),
      title ? h('strong', { class: 'note-title', dir: 'auto' }, title) : null,
    );
    const element = h('li', { class: 'note', 'data-note-id': id }, meta);
    const state = this.open.get(id);
    if (state !== undefined) {
      this.keepFocus(state);
      element.append(state.form);
    } else {
      element.append(richText(aside.value.text));
      if (this.view.canWrite) meta.append(editButton(() => this.start('note', id, aside)));
    }
    const conflict = this.conflicts.get(id);
    if (conflict !== undefined) element.append(this.drawConflict(id, conflict));
    return element;
  }

  /** An editor about to move to a new drawing: its caret goes back once it is in the page. */
  keepFocus(state) {
    const at = state.areas.findIndex((area) => area === document.activeElement);
    if (at >= 0) {
      const area = state.areas[at];
      state.refocus = { at, start: area.selectionStart, end: area.selectionEnd };
    }
  }
}

function editButton(onClick) {
  const button = h('button', { type: 'button', class: 'edit', 'data-action': 'edit' }, 'Edit');
  button.addEventListener('click', onClick);
  return button;
}

function isNote(aside) {
  return aside.kind === 'note' && aside.value !== null && typeof aside.value?.text === 'string';
}

/** Whether the viewer edits `entry` in place: a message with text (not the STOPPED note). */
function isEditable(entry) {
  if (isStopMarker(entry)) return false;
  const message = entry.message;
  return message.role === 'system' || message.content.some((part) => part.type === 'text');
}

/** A message's texts, in order: a system message's one, or each text part's. */
function textsOf(message) {
  if (message.role === 'system') return [message.content];
  return message.content.filter((part) => part.type === 'text').map((part) => part.text);
}

/** `message` with its texts (as `textsOf` lists them) replaced by `texts`. */
function withTexts(message, texts) {
  if (message.role === 'system') return { ...message, content: texts[0] };
  let next = 0;
  const content = message.content.map((part) =>
    part.type === 'text' ? { ...part, text: texts[next++] } : part,
  );
  return { ...message, content };
}

/** Put note `id` (held now as `now`) back with `value`, as edited by this page's user. */
function putNote(conversation, id, now, value) {
  conversation.replaceAside(id, {
    kind: now.kind,
    after: now.after,
    author: Author.user(),
    value,
    saved: now.saved,
  });
}

// ---------------------------------------------------------------- the list page

const PAGE_SIZE = 50;
/** While a search is typed the window widens to this many rows (the hub's most), so the
 * search looks through every conversation of the prefix, not only the page shown. */
const SEARCH_LIMIT = 1000;

/**
 * The list page, an operator's dashboard (SPEC §17): a window of the summary feed (by id,
 * paged with `after`; or the latest activity), filtered by prefix on the hub and searched
 * here; rows keep their place while the pointer is over the list (new activity is
 * highlighted instead), and "offline" replaces who is online while the feed is disconnected.
 */
class ListView {
  /** @param {HTMLElement} root */
  constructor(root) {
    this.root = root;
    const params = new URLSearchParams(location.search);
    this.order = params.get('order') === 'updated' ? 'updated' : 'id';
    /** `after` of each page before this one (id order): Previous pops it. */
    this.pages = [];
    this.feed = new SummaryFeed(hubUrl, {
      prefix: params.get('prefix') ?? '',
      order: this.order,
      getToken,
      limit: PAGE_SIZE,
    });
    /** @type {Map<string, number>} the revision each row was last drawn at */
    this.drawn = new Map();
    /** @type {string[] | null} the order frozen while the pointer is over the list */
    this.frozen = null;
    /** @type {Map<string, any>} the rows last drawn, by id: a row that left the window while
     * the order is frozen stays drawn (dimmed) in its place until the pointer leaves */
    this.shown = new Map();
    this.search = '';
    /** A window was asked for and its snapshot has not come yet. */
    this.pending = false;
    /** `after` of the page shown when a search began: the page comes back when it ends. */
    this.pageAfter = null;
    this.list = h('ol', { class: 'conversations' });
    this.list.addEventListener('pointerenter', () => {
      this.frozen = this.ordered().map((row) => row.id);
    });
    this.list.addEventListener('pointerleave', () => {
      this.frozen = null;
      this.schedule();
    });
    this.empty = h('p', { class: 'empty' }, 'No conversations yet.');
    this.more = h('button', { type: 'button', 'data-action': 'next', hidden: '' }, 'Next page');
    this.back = h('button', { type: 'button', 'data-action': 'previous', hidden: '' }, 'Previous');
    this.more.addEventListener('click', () => this.next());
    this.back.addEventListener('click', () => this.previous());
    this.stateLabel = h('span', { class: 'state' }, 'connecting');
    const open = /** @type {HTMLInputElement} */ (
      h('input', {
        name: 'open',
        placeholder: 'conversation id',
        'aria-label': 'conversation id',
        pattern: '[A-Za-z0-9._:-]{1,128}',
      })
    );
    const go = h('button', { type: 'submit' }, 'Open');
    const form = h('form', { class: 'open' }, open, go);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      if (open.value && open.checkValidity()) navigate(`/c/${encodeURIComponent(open.value)}`);
    });
    const prefix = /** @type {HTMLInputElement} */ (
      h('input', {
        name: 'prefix',
        placeholder: 'prefix',
        'aria-label': 'only ids starting with',
        value: this.feed.prefix,
      })
    );
    const sort = /** @type {HTMLSelectElement} */ (
      h(
        'select',
        { name: 'order', 'aria-label': 'sort' },
        h('option', { value: 'id' }, 'by id'),
        h('option', { value: 'updated' }, 'latest activity'),
      )
    );
    sort.value = this.order;
    const search = /** @type {HTMLInputElement} */ (
      h('input', { name: 'search', type: 'search', placeholder: 'search', 'aria-label': 'search' })
    );
    const controls = h('form', { class: 'open controls' }, prefix, sort, search);
    controls.addEventListener('submit', (event) => event.preventDefault());
    prefix.addEventListener('change', () => this.show({ prefix: prefix.value.trim() }));
    sort.addEventListener('change', () => {
      this.order = sort.value === 'updated' ? 'updated' : 'id';
      this.show({ order: this.order });
    });
    search.addEventListener('input', () => {
      const was = this.search !== '';
      this.search = search.value.trim().toLowerCase();
      if ((this.search !== '') !== was) this.searching(this.search !== '');
      this.schedule();
    });
    this.matches = h('p', { class: 'matches', hidden: '' });
    this.problem = h('p', { class: 'empty problem', hidden: '' });
    root.replaceChildren(
      h('header', { class: 'bar' }, h('h1', {}, 'Conversations'), this.stateLabel),
      form,
      controls,
      this.problem,
      this.empty,
      this.matches,
      h('div', { class: 'scroller' }, this.list, h('p', { class: 'pages' }, this.back, this.more)),
    );
    document.title = 'convsync';
    this.scheduled = false;
    this.feed.on('rows', (event) => {
      if (event.snapshot) this.pending = false;
      // The first page is drawn as its snapshot comes, so it paints in the next frame, not
      // in the one after; later rows wait for a frame (one draw per frame however many).
      if (event.snapshot && this.drawn.size === 0) this.render();
      else this.schedule();
    });
    this.feed.on('state', (event) => {
      root.dataset.connectionState = event.state;
      this.stateLabel.textContent = event.state === 'disconnected' ? 'offline' : event.state;
      // A refused window (a bad prefix, a token without read) is named, not shown as empty.
      const refused = event.state === 'closed' && event.code !== null;
      this.problem.hidden = !refused;
      if (refused) this.problem.textContent = `The hub refused this list: ${event.reason || event.code}`;
      this.schedule();
    });
    root.dataset.connectionState = 'connecting';
    void this.feed.start();
  }

  /** A new window (prefix or order): back to the first page. */
  show(page) {
    this.pages = [];
    this.pageAfter = null;
    this.frozen = null;
    this.ask({ ...page, after: null });
    if (this.feed.state === 'closed') void this.feed.start(); // refused before: try this one
  }

  /** Ask the feed for another window; the rows drawn stay until its snapshot comes (else
   * the old window's rows would show for a moment under the new page's controls). */
  ask(page) {
    this.pending = true;
    this.feed.window(page);
  }

  /** A search began (`on`) or ended: widen the window to every row the hub gives, or go
   * back to the page shown before. */
  searching(on) {
    this.frozen = null;
    if (on) {
      this.pageAfter = this.feed.after;
      this.ask({ limit: SEARCH_LIMIT, after: null });
    } else {
      this.ask({ limit: PAGE_SIZE, after: this.order === 'id' ? this.pageAfter : null });
    }
  }

  next() {
    const ids = [...this.feed.rows.keys()].sort();
    if (this.order !== 'id' || ids.length === 0) return;
    this.pages.push(this.feed.after);
    this.ask({ after: ids[ids.length - 1] });
  }

  previous() {
    if (this.pages.length === 0) return;
    this.ask({ after: this.pages.pop() ?? null });
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.render();
    });
  }

  /** The window's rows in the chosen order. */
  ordered() {
    const rows = [...this.feed.rows.values()];
    if (this.order === 'updated') {
      return rows.sort((a, b) => (b.updated ?? 0) - (a.updated ?? 0) || (a.id < b.id ? -1 : 1));
    }
    return rows.sort((a, b) => (a.id < b.id ? -1 : 1));
  }

  render() {
    if (this.pending && this.feed.state === 'connected') return; // the new window's snapshot is on its way
    let rows = this.ordered();
    /** @type {Set<string>} rows drawn in place though they left the window */
    const gone = new Set();
    if (this.frozen !== null) {
      // Rows keep their place under the pointer: one that entered goes at the end, one that
      // left stays where it was (dimmed) until the pointer leaves the list.
      const place = new Map(this.frozen.map((id, at) => [id, at]));
      for (const id of this.frozen) {
        const ghost = this.shown.get(id);
        if (!this.feed.rows.has(id) && ghost !== undefined) {
          rows.push(ghost);
          gone.add(id);
        }
      }
      rows.sort((a, b) => (place.get(a.id) ?? Infinity) - (place.get(b.id) ?? Infinity));
    }
    let matched = rows.length;
    if (this.search) {
      const q = this.search;
      rows = rows.filter(
        (row) => row.id.toLowerCase().includes(q) || (row.last?.text ?? '').toLowerCase().includes(q),
      );
      matched = rows.length;
      rows = rows.slice(0, PAGE_SIZE);
    }
    this.matches.hidden = !this.search || matched <= rows.length;
    this.matches.textContent = `${matched} conversations match; the first ${rows.length} are shown.`;
    const offline = this.feed.state !== 'connected';
    this.root.classList.toggle('offline', offline);
    this.empty.hidden = rows.length > 0 || !this.problem.hidden;
    this.empty.textContent = this.search ? 'No conversation matches.' : 'No conversations yet.';
    const elements = rows.map((row) => {
      const changed = this.drawn.has(row.id) && this.drawn.get(row.id) !== row.revision;
      this.drawn.set(row.id, row.revision);
      const element = drawRow(row, offline);
      if (changed) element.classList.add('changed');
      if (gone.has(row.id)) element.classList.add('left');
      return element;
    });
    this.shown = new Map(rows.map((row) => [row.id, row]));
    this.list.replaceChildren(...elements);
    this.more.hidden = !(this.feed.more && this.order === 'id') || this.search !== '';
    this.back.hidden = this.pages.length === 0 || this.search !== '';
  }
}

function drawRow(row, offline = false) {
  const href = `/c/${encodeURIComponent(row.id)}`;
  const link = h('a', { href, class: 'title' }, row.id);
  link.addEventListener('click', (event) => carryToken(event, href));
  const last = row.last === null ? '' : `${row.last.role}: ${row.last.text}`;
  const turn = row.turn ? ` · turn ${row.turn.index} ${row.turn.state}` : '';
  const drafts = row.drafts?.open ? ` · ${row.drafts.open} drafting` : '';
  const waiting = [];
  if (row.queued) waiting.push(h('span', { class: 'queued' }, ` · ${row.queued} queued`));
  if (row.approvals) {
    const label = row.approvals === 1 ? 'approval' : 'approvals';
    waiting.push(h('span', { class: 'approvals' }, ` · ${row.approvals} ${label} waiting`));
  }
  const usage = row.usage ? ` · ${tokens(row.usage.input_tokens + row.usage.output_tokens)} tokens` : '';
  let online = '';
  if (offline) online = h('span', { class: 'offline' }, ' · offline');
  else if (row.online.length) {
    const who = row.online.map((client) => {
      const status = row.status?.[client];
      return status ? `${client} (${status})` : client;
    });
    online = h('span', { class: 'online' }, ` · online: ${who.join(', ')}`);
  }
  return h(
    'li',
    { 'data-conversation-id': row.id, 'data-revision': String(row.revision) },
    h('div', { class: 'row-head' }, link, h('time', {}, timeOf(row.updated))),
    h('div', { class: 'preview' }, last),
    h(
      'div',
      { class: 'row-meta' },
      `rev ${row.revision} · ${row.entries} messages`,
      row.halt ? ` · ${row.halt}` : '',
      turn,
      drafts,
      ...waiting,
      usage,
      online,
    ),
  );
}

/** A token count for a row: `950`, `12.3k`, `4.1M`. */
function tokens(count) {
  if (count < 1000) return String(count);
  if (count < 1_000_000) return `${(count / 1000).toFixed(count < 10_000 ? 1 : 0)}k`;
  return `${(count / 1_000_000).toFixed(1)}M`;
}

/** Follow a link inside the viewer, handing the in-memory token on in the fragment. */
function carryToken(event, href) {
  if (token === null || event.metaKey || event.ctrlKey || event.shiftKey) return;
  event.preventDefault();
  navigate(href);
}

function navigate(href) {
  location.assign(token === null ? href : `${href}#token=${encodeURIComponent(token)}`);
}

// ---------------------------------------------------------------- start

const root = /** @type {HTMLElement} */ (document.getElementById('app'));
const path = location.pathname;
/** The conversation id in a `/c/{id}` path, or null (a bad `%` escape makes no id). */
function idOfPath(at) {
  try {
    return decodeURIComponent(at.slice(3));
  } catch {
    return null;
  }
}

const id = path.startsWith('/c/') && path.length > 3 ? idOfPath(path) : null;

/** The page's view, made anew when a new token comes after the hub refused the old one. */
function open() {
  // Exposed for tests and for the curious: the replica (or feed) behind the page. The list
  // serves also a `/c/` address that names no conversation (it stayed blank).
  globalThis.convsyncView = id !== null ? new ConversationView(root, id) : new ListView(root);
}

/** Use `fresh` from now on: a connection the hub refused starts again with it; a live one
 * sends it at its next refresh (the replica asks `getToken`). */
function useToken(fresh) {
  token = fresh;
  const connection = globalThis.convsyncView.replica ?? globalThis.convsyncView.feed;
  if (connection.state === 'closed') {
    connection.close();
    open();
  }
}

/** A field to paste a new token into, shown when the hub refused the page's token. */
function tokenPrompt() {
  const input = h('input', {
    type: 'password',
    name: 'token',
    autocomplete: 'off',
    placeholder: 'paste a new token',
    'aria-label': 'new token',
  });
  const form = h('form', { class: 'token-prompt' }, input, h('button', { type: 'submit' }, 'Use'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const value = /** @type {HTMLInputElement} */ (input).value.trim();
    if (value !== '') useToken(value);
  });
  return form;
}

window.addEventListener('hashchange', () => {
  const fresh = takeToken();
  if (fresh !== null) useToken(fresh);
});
open();

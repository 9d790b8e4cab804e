// The conversation page, `/c/{id}`: a live `Replica` drawn at most once a frame, entries keyed by
// id and reused, only the last WINDOW entries in the page until the reader scrolls up.

import { Author, Message, QUEUED_KIND, STOP_KIND, connect, stop } from '../convsync.js';
import { h, jsonText, warmTimes } from './dom.js';
import { getToken, hubUrl, carryToken, tokenPrompt } from './token.js';
import {
  compactionsBySummary,
  drawCompacted,
  approvalsByEntry,
  approvalStamp,
  choicesOf,
  displayed,
  answerValue,
  turnStamp,
  identity,
  resultStamp,
  canStop,
  drawQueued,
  drawEntry,
  fillDraft,
} from './entries.js';
import { Editing } from './editing.js';

const WINDOW = 150; // entries drawn at first
const STEP = 200; // more when the reader scrolls to the top
const NEAR_BOTTOM = 80; // px: a reader this close to the end follows new messages

export class ConversationView {
  /**
   * @param {HTMLElement} root @param {string} conversationId
   * @param {import('../lib/early.js').Early | null} [early] the page's early socket, taken
   *   by the first view only (a view made again after a refusal connects anew)
   */
  constructor(root, conversationId, early = null) {
    this.root = root;
    this.id = conversationId;
    const adopt = early !== null && !early.taken ? { client: early.client, early } : {};
    if (early !== null) early.taken = true;
    this.replica = connect(hubUrl, conversationId, { live: true, getToken, ...adopt });
    setTimeout(warmTimes, 0); // while the socket opens and the catch-up streams in
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

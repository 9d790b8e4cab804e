// The list page, `/`: an operator's dashboard over the summary feed (SPEC §17).

import { SummaryFeed } from '../lib/summary.js';
import { h, timeOf } from './dom.js';
import { getToken, hubUrl, carryToken, navigate } from './token.js';

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
export class ListView {
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
      // Hold what the reader sees, in the order drawn; not while another window is on its
      // way (its snapshot replaces every row, so there is nothing of it to hold yet).
      if (!this.pending) this.frozen = [...this.shown.keys()];
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
      if (event.snapshot) {
        // A new window's rows: an order held over the old window holds nothing of this one
        // (else the old window's rows would stay drawn as ghosts beside the new ones).
        if (this.pending) this.frozen = null;
        this.pending = false;
      }
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

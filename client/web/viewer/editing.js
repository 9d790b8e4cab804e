// Editing a message or a note in place (SPEC §16), three-way merged on save, conflicts shown.

import { Author, isStopMarker, jsonEqual, mergeAside, mergeEntry } from '../convsync.js';
import { h, richText, authorLabel } from './dom.js';
import { identity } from './entries.js';

export class Editing {
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

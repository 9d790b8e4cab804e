// The viewer's DOM helpers: elements from text only (no markup is ever parsed), times, labels.

import { markdown } from '../markdown.js';

export function h(tag, attrs = {}, ...children) {
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
export function richText(text) {
  const draw = (node) =>
    typeof node === 'string' ? node : h(node.tag, node.attrs ?? {}, ...node.children.map(draw));
  return h('div', { class: 'text', dir: 'auto' }, ...markdown(text).map(draw));
}

// The formats of `toLocaleTimeString()` and `toLocaleString()`, each made once: those calls
// build a formatter every time (15 ms for a page of entries). Made on first use, not at load:
// the first `Intl` formatter of a page loads the locale's data (tens of ms), which would hold
// back the socket; `warmTimes()` makes them while the page waits for the hub.
/** @type {[Intl.DateTimeFormat, Intl.DateTimeFormat] | null} */
let formats = null;

export function warmTimes() {
  const time = { hour: 'numeric', minute: 'numeric', second: 'numeric' };
  formats ??= [
    new Intl.DateTimeFormat(undefined, /** @type {const} */ (time)),
    new Intl.DateTimeFormat(undefined, { year: 'numeric', month: 'numeric', day: 'numeric', ...time }),
  ];
  return formats;
}

export function timeOf(ms) {
  if (typeof ms !== 'number' || Number.isNaN(ms)) return '';
  const date = new Date(ms);
  const now = new Date();
  const today =
    date.getFullYear() === now.getFullYear() &&
    date.getMonth() === now.getMonth() &&
    date.getDate() === now.getDate();
  const [time, dateTime] = warmTimes();
  return (today ? time : dateTime).format(date);
}

export function authorLabel(author, role) {
  if (author === null || author === undefined) return role;
  const name = author.name ?? author.title;
  return name ? `${role} · ${name}` : `${role} · ${author.kind}`;
}

export function jsonText(value) {
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

// ---------------------------------------------------------------- the conversation page

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

export function timeOf(ms) {
  if (typeof ms !== 'number') return '';
  const date = new Date(ms);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
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

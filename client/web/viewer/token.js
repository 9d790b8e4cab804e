// The viewer's token (SPEC §8): read once from `#token=`, kept in memory only, handed on to
// links inside the viewer, replaced when a new one comes (`hashchange`, or the prompt shown
// after the hub refused the old one).

import { h } from './dom.js';

/** Read `#token=...` once, take it out of the address bar, keep it in memory only. */
export function takeToken() {
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
export const getToken = () => token;
export const hubUrl = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}`;

/** What the page does with a fresh token (set by `viewer.js`: reopen a refused view). */
let fresh = (/** @type {string} */ _value) => {};

/** Register what happens when a fresh token is put in (`useToken`). */
export function onFreshToken(callback) {
  fresh = callback;
}

/** Use `value` from now on, and tell the page (`onFreshToken`). */
export function useToken(value) {
  token = value;
  fresh(value);
}

/** Follow a link inside the viewer, handing the in-memory token on in the fragment. */
export function carryToken(event, href) {
  if (token === null || event.metaKey || event.ctrlKey || event.shiftKey) return;
  event.preventDefault();
  navigate(href);
}

export function navigate(href) {
  location.assign(token === null ? href : `${href}#token=${encodeURIComponent(token)}`);
}

/** A field to paste a new token into, shown when the hub refused the page's token. */
export function tokenPrompt() {
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

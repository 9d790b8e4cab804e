// The convsync viewer: `/` lists conversations live, `/c/{id}` shows one live and steers it.
//
// How this works: the page is an embedder of convsync.js like any other. The conversation page
// opens a `Replica` with `live: true` and redraws from its value on every event, at most once a
// frame: entries are keyed by id and reused, and only the last WINDOW entries are in the page
// until the reader scrolls up (so 10,000 messages cost what 150 do). The list page follows a
// `SummaryFeed`. Everything a model, a tool or a presence status wrote goes in with
// `textContent` (or an attribute value): never as markup.
//
// The page's parts are in `viewer/`: `dom.js` (elements from text), `token.js`, `entries.js` (how
// an entry is drawn), `editing.js`, `conversation.js` (the `/c/{id}` page), `list.js` (`/`).

import { openEarly } from './lib/early.js';
import { getToken, hubUrl, onFreshToken, takeToken, useToken } from './viewer/token.js';

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

// The conversation's socket opens now, with the hello its replica will send, so the hub's
// catch-up streams in while the replica's modules load (`lib/early.js`); the view adopts it.
const early =
  id !== null
    ? openEarly(hubUrl, id, {
        client: `web-${Array.from(crypto.getRandomValues(new Uint32Array(2)), (n) => n.toString(16)).join('')}`,
        token: getToken(),
        live: true,
        auth: true,
      })
    : null;

// Only the page shown is loaded: the list needs the summary feed and its few modules, not the
// replica (the conversation page loads all of `convsync.js`).
const View =
  id !== null
    ? (await import('./viewer/conversation.js')).ConversationView
    : (await import('./viewer/list.js')).ListView;

/** The page's view, made anew when a new token comes after the hub refused the old one. */
function open() {
  // Exposed for tests and for the curious: the replica (or feed) behind the page. The list
  // serves also a `/c/` address that names no conversation (it stayed blank).
  globalThis.convsyncView = id !== null ? new View(root, id, early) : new View(root);
}

// A fresh token: a connection the hub refused starts again with it; a live one sends it at
// its next refresh (the replica asks `getToken`).
onFreshToken(() => {
  const connection = globalThis.convsyncView.replica ?? globalThis.convsyncView.feed;
  if (connection.state === 'closed') {
    connection.close();
    open();
  }
});

window.addEventListener('hashchange', () => {
  const fresh = takeToken();
  if (fresh !== null) useToken(fresh);
});
open();

// @ts-check
// A replica's first socket, opened before its modules have loaded (`openEarly`).
import { DRAFTS, HUB_REBASE, PRESENCE, SUBPROTOCOL } from './frames.js';

/**
 * How this works: a page that will `connect` a fresh replica (nothing kept, so it will ask for
 * everything from revision 0) opens its socket with this small module first and sends the
 * hello that replica would send, so the hub's catch-up streams in while the rest of
 * `convsync.js` and the page load (the viewer's first paint of a 20,000-message conversation
 * waited some 150 ms for them). The socket keeps every message it receives until
 * `connect(url, id, {client, early})` adopts it: the replica sends nothing twice and handles
 * the kept messages first, in order. A replica that would say something else in its hello (a
 * kept value, other options), or a socket that has closed meanwhile, is not adopted: the
 * replica closes it and connects as usual, so a mismatch costs time, never correctness.
 *
 * @typedef {{url: string, client: string, ws: any, hello: string, sent: boolean,
 *   messages: any[], ended: boolean, taken: boolean, detach: () => void}} Early
 * (`taken`: for the page, which hands it to one replica only)
 */

/**
 * Open `conversationId`'s socket on the hub at `url` for the fresh replica `client` will
 * connect; `token`, `live`, `auth` (the replica has a `getToken`) and `ping` (it keeps the
 * default keepalive) must be what that replica's hello will carry.
 * @param {string} url @param {string} conversationId
 * @param {{client: string, token?: string | null, live?: boolean, auth?: boolean,
 *   ping?: boolean, WebSocket?: any}} options
 * @returns {Early}
 */
export function openEarly(url, conversationId, options) {
  const target = `${url.replace(/\/+$/, '')}/v1/conversations/${encodeURIComponent(conversationId)}`;
  const features = options.live === true ? [HUB_REBASE, DRAFTS, PRESENCE] : [HUB_REBASE];
  if (options.auth === true) features.push('auth');
  if (options.ping !== false) features.push('ping');
  // The keys in the order `ReplicaSession.hello` makes them: the replica compares the text.
  const hello = JSON.stringify({
    type: 'hello',
    client: options.client,
    lineage: 0,
    revision: 0,
    token: options.token ?? null,
    features,
  });
  const Socket = options.WebSocket ?? globalThis.WebSocket;
  const ws = new Socket(target, SUBPROTOCOL);
  /** @type {Early} */
  const early = {
    url: target,
    client: options.client,
    ws,
    hello,
    sent: false,
    messages: [],
    ended: false,
    taken: false,
    detach: () => {
      ws.onopen = null;
      ws.onmessage = null;
      ws.onclose = null;
      ws.onerror = null;
    },
  };
  ws.onopen = () => {
    ws.send(hello);
    early.sent = true;
  };
  ws.onmessage = (/** @type {any} */ event) => early.messages.push(event.data);
  ws.onclose = () => {
    early.ended = true;
  };
  ws.onerror = () => {
    early.ended = true;
  };
  return early;
}
